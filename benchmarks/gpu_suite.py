"""One command for the accelerator benchmarks; writes a Markdown table.  Issue 7.

Runs, each in its own subprocess (so one failure or out-of-memory does not stop the
rest), and collects the JSON each prints as its last line:

1. ``cbo_throughput.py``: standard CBO, Rastrigin d=20, N up to 1e7 (CBXpy only at
   N <= 1e5, where it finishes in reasonable time).
2. ``clustered_scaling.py``: the clustered system K=4, d=10, N up to 1e7 (NumPy peer
   up to 1e6).
3. ``fedcbo_round.py``: one FedCBO round at the paper's scale (N=1200, M=200, tau=10).
4. ``cbo-jax reproduce meanfield-scaling``: N up to 1e6 against an N=1e7 reference (its
   plot and arrays in ``OUT_meanfield-scaling/`` beside the table).

    python benchmarks/gpu_suite.py                      # GPU sizes, writes benchmarks/RESULTS_gpu.md
    python benchmarks/gpu_suite.py --smoke              # tiny sizes: checks the plumbing on a CPU
    python benchmarks/gpu_suite.py --only cbo,clustered --out /tmp/gpu.md
    python benchmarks/gpu_suite.py --only fedcbo --merge    # add to the results already written

Where one command may run only a few minutes (a lent machine), run it in parts, one
``--only`` per command with ``--merge``; docs/development.md ("Running the GPU suite")
has the steps.

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
                   "--reference", "1e7", "--no-progress", "--output", "{MEANFIELD_DIR}", "--overwrite"],
                  ["-m", "cbo_jax.cli", "reproduce", "meanfield-scaling", "--sizes", "64,256", "--reference", "4096",
                   "--steps", "10", "--seeds", "2", "--no-progress", "--output", "{MEANFIELD_DIR}",
                   "--overwrite"]),
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
                f"particle-steps/s | "
                + (f"{row['speedup_vs_numpy']:.1f}x NumPy (same run)" if "speedup_vs_numpy" in row else "-")
                + " | |" for row in r["rows"]]
    if name == "fedcbo":
        st = r.get("settings", {})
        phases = f"local {r['seconds_local']:.3g} s, aggregation {r['seconds_aggregation']:.3g} s"
        if "test_eval_seconds" in r:
            phases += f", test evaluation {r['test_eval_seconds']:.3g} s, other {r.get('other_seconds', 0.0):.3g} s"
        fractions = f"aggregation at {r['fraction_of_matmul_peak']:.2f}"
        if "round_fraction_of_matmul_peak" in r:
            fractions += (f", local training at {r['local_fraction_of_matmul_peak']:.2f}, the whole round at "
                          f"{r['round_fraction_of_matmul_peak']:.2f}")
        return [f"| FedCBO round (N={st.get('N', '?')}, M={st.get('M', '?')}, tau={st.get('tau', '?')}) | {phases} | "
                f"{fractions} of the same-run matmul ceiling | "
                f"ceiling {r['matmul_peak_gflops']:.0f} GFLOP/s |"]
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
    ap.add_argument("--merge", action="store_true",
                    help="keep the results of other benchmarks already in OUT's .json (a suite run in parts, e.g. "
                         "one --only per call where a machine limits a command's time); each keeps its device")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    device = _device()
    today = datetime.date.today().isoformat()
    command = "python benchmarks/gpu_suite.py" + (" --smoke" if args.smoke else "")
    results = {}
    json_path = args.out.with_suffix(".json")
    if args.merge and json_path.exists():
        previous = json.loads(json_path.read_text())
        for name, res in previous.get("results", {}).items():
            res.setdefault("device", previous.get("device", "unknown"))
            res.setdefault("date", previous.get("date", "unknown"))
            results[name] = res
    for name in names:
        # the meanfield reproduction's own files (plot, arrays) go beside OUT, never over a results/ directory
        meanfield_dir = str(args.out.resolve().with_name(args.out.stem + "_meanfield-scaling"))
        argv_ = [a.replace("{MEANFIELD_DIR}", meanfield_dir) for a in SUITES[name][1 if args.smoke else 0]]
        print(f"[{name}] python {' '.join(argv_)}", file=sys.stderr, flush=True)
        results[name] = {**_run(name, argv_, args.timeout), "device": device, "date": today,
                         "command": f"{command} --only {name}"}
        print(f"[{name}] {'ok' if results[name]['ok'] else 'FAILED'} in {results[name]['seconds']:.0f} s",
              file=sys.stderr, flush=True)
    order = [n for n in SUITES if n in results]
    devices = sorted({results[n]["device"] for n in order})
    dates = sorted({results[n]["date"] for n in order})
    if len(devices) == 1:
        device_line = f"- device: {devices[0]}"
    else:
        device_line = "- devices: " + "; ".join(
            f"{d} ({', '.join(n for n in order if results[n]['device'] == d)})" for d in devices)
    lines = [f"# Accelerator benchmark suite{' (smoke sizes)' if args.smoke else ''}", "",
             device_line, f"- date: {', '.join(dates)}",
             f"- command: `{command}`" + (" (run in parts with --only and --merge)" if len(order) > len(names) else ""),
             "", "| benchmark | rate | ratio | note |", "|---|---:|---:|---|"]
    for name in order:
        lines += _rows(name, results[name])
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    json_path.write_text(json.dumps({"device": device, "date": today, "results": results}, indent=1))
    print(text)
    print(json.dumps({"device": device, "ok": {n: r["ok"] for n, r in results.items()}}))
    return 0 if all(results[n]["ok"] for n in names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
