"""One command for the accelerator benchmarks; writes a Markdown table.  Issue 7.

Runs, each in its own subprocess (so one failure or out-of-memory does not stop the
rest), and collects the JSON each prints as its last line:

1. ``cbo_throughput.py``: standard CBO, Rastrigin d=20, N up to 1e7 (CBXpy only at
   N <= 1e5, where it finishes in reasonable time).
2. ``clustered_scaling.py``: the clustered system K=4, d=10, N up to 1e7 (NumPy peer
   up to 1e6).
3. ``fedcbo_round.py``: one FedCBO round at the paper's scale (N=1200, M=200, tau=10).
4. ``cbo-jax reproduce meanfield-scaling``: N up to 1e6 against an N=1e7 reference.

    python benchmarks/gpu_suite.py                      # GPU sizes, writes benchmarks/RESULTS_gpu.md
    python benchmarks/gpu_suite.py --smoke              # tiny sizes: checks the plumbing on a CPU
    python benchmarks/gpu_suite.py --only cbo,clustered --out /tmp/gpu.md

The table names the device (``jax.devices()[0].device_kind``) and the date. Every
number is a ratio or a rate measured in the same run as its peer; on a shared
machine compare ratios, not bare times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUITES = {
    "cbo": (["benchmarks/cbo_throughput.py", "--sizes", "1e4,1e5,1e6,1e7", "--no-partitionable", "--steps", "200"],
            ["benchmarks/cbo_throughput.py", "--quick", "--no-partitionable", "--sizes", "1000"]),
    "clustered": (["benchmarks/clustered_scaling.py", "--sizes", "1e5,1e6,1e7"],
                  ["benchmarks/clustered_scaling.py", "--sizes", "1e3", "--repeats", "1"]),
    "fedcbo": (["benchmarks/fedcbo_round.py", "--agents", "1200", "--downloads", "200", "--epochs", "10",
                "--no-compare", "--repeats", "2"],
               ["benchmarks/fedcbo_round.py", "--quick", "--no-compare"]),
    "meanfield": (["-m", "cbo_jax.cli", "reproduce", "meanfield-scaling", "--sizes", "1e2,1e3,1e4,1e5,1e6",
                   "--reference", "1e7", "--no-progress", "--output", "results/gpu-meanfield-scaling"],
                  ["-m", "cbo_jax.cli", "reproduce", "meanfield-scaling", "--sizes", "64,256", "--reference", "4096",
                   "--steps", "10", "--seeds", "2", "--no-progress", "--output", "results/gpu-meanfield-scaling"]),
}


def _device() -> str:
    out = subprocess.run([sys.executable, "-c", "import jax; d = jax.devices()[0]; print(d.platform, '|', d.device_kind)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _run(name: str, argv: list[str], timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=HERE.parent, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout:.0f} s", "seconds": timeout}
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-800:], "seconds": seconds}
    return {"ok": True, "result": json.loads(lines[-1]), "seconds": seconds}


def _rows(name: str, res: dict) -> list[str]:
    if not res["ok"]:
        return [f"| {name} | failed: {res['error'].splitlines()[-1] if res['error'] else '?'} | | |"]
    r = res["result"]
    if name == "cbo":
        out = []
        for row in r["results"]:
            f32 = row["cbo_jax_float32"]["particle_steps_per_s"]
            peer = row.get("cbxpy_float64", {}).get("particle_steps_per_s")
            ratio = f"{f32 / peer:.1f}x CBXpy (same run)" if peer else "-"
            out.append(f"| CBO Rastrigin d=20, N={row['N']:.0e} | {f32 / 1e6:.2f} M particle-steps/s | {ratio} | |")
        return out
    if name == "clustered":
        return [f"| clustered K=4 d=10, N={row['N']:.0e} | {row['cbo_jax']['particle_steps_per_s'] / 1e6:.2f} M "
                f"particle-steps/s | {row['speedup_vs_numpy']:.1f}x NumPy (same run) |" if "speedup_vs_numpy" in row
                else f"| clustered K=4 d=10, N={row['N']:.0e} | {row['cbo_jax']['particle_steps_per_s'] / 1e6:.2f} M "
                f"particle-steps/s | - |" for row in r["rows"]]
    if name == "fedcbo":
        st = r.get("settings", {})
        return [f"| FedCBO round (N={st.get('N', '?')}, M={st.get('M', '?')}, tau={st.get('tau', '?')}) | "
                f"local {r['seconds_local']:.3g} s, aggregation {r['seconds_aggregation']:.3g} s | "
                f"aggregation at {r['fraction_of_matmul_peak']:.2f} of the same-run matmul ceiling | "
                f"{r['aggregation_gflops']:.0f} of {r['matmul_peak_gflops']:.0f} GFLOP/s |"]
    if name == "meanfield":
        return [f"| meanfield-scaling, N={r['sizes'][0]}..{r['sizes'][-1]}, ref {r['reference_N']:.0e} | "
                f"slope {r['slope']:.3f} | expected -0.5 | {r['seconds']:.0f} s |"]
    return [f"| {name} | {json.dumps(r)[:120]} | | |"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (checks the suite itself, e.g. on a CPU)")
    ap.add_argument("--only", default=",".join(SUITES), help=f"comma-separated subset of {','.join(SUITES)}")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS_gpu.md", help="Markdown file to write")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    device = _device()
    results = {}
    for name in names:
        argv_ = SUITES[name][1 if args.smoke else 0]
        print(f"[{name}] python {' '.join(argv_)}", file=sys.stderr, flush=True)
        results[name] = _run(name, argv_, args.timeout)
        print(f"[{name}] {'ok' if results[name]['ok'] else 'FAILED'} in {results[name]['seconds']:.0f} s",
              file=sys.stderr, flush=True)
    lines = [f"# Accelerator benchmark suite{' (smoke sizes)' if args.smoke else ''}", "",
             f"- device: {device}", f"- date: {datetime.date.today().isoformat()}",
             f"- command: `python benchmarks/gpu_suite.py{' --smoke' if args.smoke else ''}`", "",
             "| benchmark | rate | ratio | note |", "|---|---:|---:|---|"]
    for name in names:
        lines += _rows(name, results[name])
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps({"device": device, "results": results}, indent=1))
    print(text)
    print(json.dumps({"device": device, "ok": {n: r["ok"] for n, r in results.items()}}))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
