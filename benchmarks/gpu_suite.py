"""One command for the accelerator benchmarks; writes a Markdown table.  Issues 7 and 18.

Runs, each in its own subprocess (so one failure or out-of-memory does not stop the
rest), and collects the JSON each prints as its last line:

0. ``step``, ``memory``, ``large_n`` (issue 59): ``step_speed.py``, the library's CBO step beside a
   plain scan of the same step and the same-run ``a·x+b`` bandwidth bound, N = 1e6..1e8;
   ``step_memory.py``, the compiled step's memory for every dynamic at N = 1e6;
   ``large_n.py --accelerator``, N = 1e9 in d = 10 with its peak device memory.
1. ``cbo``: ``cbo_throughput.py``, standard CBO, Rastrigin d=20, N = 1e4..1e7 (CBXpy, the
   NumPy peer, only at N <= 1e5, where it finishes in seconds).
2. ``fedcbo``: ``fedcbo_round.py``, one FedCBO round at the paper's scale (N=1200, M=200,
   tau=10), every phase against the same-run matmul ceiling.
3. ``clustered``: ``clustered_scaling.py``, the clustered system K=4, d=10, N = 1e5..1e7
   (NumPy peer up to 1e6).
4. ``consensus``: ``consensus_sum.py``, the consensus point's sum over N = 1e6..1e7 agents
   summed in blocks against one dot: float32 error and time, and a CBO step at N = 1e7 both
   ways.
5. ``meanfield``: ``cbo-jax reproduce meanfield-scaling``, N up to 1e6 against an N=1e7
   reference.
6. ``table1``: ``cbo-jax reproduce fedcbo-table1 --scale paper`` for ``--table1-rounds``
   rounds (default 10 of the paper's 100): the wall time of each method at the paper's scale.
   It needs the real MNIST files (``CBO_JAX_DATA_DIR``) and is skipped, with the reason,
   without them.

    python benchmarks/gpu_suite.py                      # GPU sizes, writes benchmarks/RESULTS_gpu.md
    python benchmarks/gpu_suite.py --budget 330         # all parts within 330 s (a lent machine)
    python benchmarks/gpu_suite.py --smoke              # tiny sizes: checks the plumbing on a CPU
    python benchmarks/gpu_suite.py --only cbo,clustered --out /tmp/gpu.md
    python benchmarks/gpu_suite.py --only fedcbo --merge    # add to the results already written

``--budget SECONDS`` shares one wall-clock budget among the parts in the order above: each
part may use its share of what is left (``share`` in ``SUITES``), and time a part does not use passes to
the parts after it (a part left less than ``MIN_PART_SECONDS`` is not started: its row says
so). The table and its JSON are rewritten after every part, so a run stopped
between parts keeps the parts it finished, and the throughput parts write each finished
size at once (``--progress``): a part that runs out of time reports the sizes it finished.
``benchmarks/gpu_lease.sh`` wraps all of this for a machine lent for a few minutes.

The table names the device (``jax.devices()[0].device_kind``) and the date. Every
number is a ratio or a rate measured in the same run as its peer; on a shared
machine compare ratios, not bare times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _progress  # noqa: E402


class Part(NamedTuple):
    gpu: list[str]  # argv at accelerator sizes ({DIR}: the part's own output directory)
    smoke: list[str]  # argv at tiny sizes (a CPU check of the plumbing)
    share: float  # weight of the part in a --budget
    progress: bool = False  # the script takes --progress PATH (rows written as they finish)
    needs_data: bool = False  # reads the real MNIST files from CBO_JAX_DATA_DIR
    files: str = ""  # the name of its own directory of files ({DIR}), when it writes one


# The shares follow what each part took on an H200 (2026-12-04; benchmarks/RESULTS_gpu.md): cbo 82 s,
# fedcbo 42 s, clustered 38 s, consensus 58 s, meanfield 27 s, table1 42 s (10 rounds), so that
# `--budget 330` lets every part finish (with the earlier shares cbo and consensus were cut at 60 and 42 s).
SUITES = {
    # Issue 59's parts first: the bandwidth bound beside the library's step and a plain scan, the
    # compiled step's memory for every dynamic, and N = 1e9 (d = 10) with its peak device memory.
    "step": Part(["benchmarks/step_speed.py", "--sizes", "1e6,1e7,1e8", "--steps", "50", "--bw-mb", "2048"],
                 ["benchmarks/step_speed.py", "--sizes", "1000", "--steps", "5", "--repeats", "1", "--bw-mb", "8"],
                 share=2.0),
    "memory": Part(["benchmarks/step_memory.py", "--n", "1e6"], ["benchmarks/step_memory.py", "--n", "2000"],
                   share=1.5),
    "large_n": Part(["benchmarks/large_n.py", "--sizes", "1e7,1e9", "--steps", "20", "--accelerator"],
                    ["benchmarks/large_n.py", "--sizes", "1e4", "--steps", "10", "--accelerator"],
                    share=2.0),
    "cbo": Part(["benchmarks/cbo_throughput.py", "--sizes", "1e4,1e5,1e6,1e7", "--no-partitionable", "--steps", "200",
                 "--cbxpy-max-n", "1e5"],
                ["benchmarks/cbo_throughput.py", "--quick", "--no-partitionable", "--sizes", "1000"],
                share=3.0, progress=True),
    "fedcbo": Part(["benchmarks/fedcbo_round.py", "--agents", "1200", "--downloads", "200", "--epochs", "10",
                    "--no-compare", "--repeats", "2", "--sweep-chunks", "4,64", "--groups", "4", "--agent-chunks", ""],
                   ["benchmarks/fedcbo_round.py", "--quick", "--no-compare"],
                   share=1.6),
    "clustered": Part(["benchmarks/clustered_scaling.py", "--sizes", "1e5,1e6,1e7", "--numpy-max-n", "1e6"],
                      ["benchmarks/clustered_scaling.py", "--sizes", "1e3", "--repeats", "1"],
                      share=1.4, progress=True),
    "consensus": Part(["benchmarks/consensus_sum.py", "--sizes", "1e6,1e7,10000003", "--dims", "20",
                       "--step-sizes", "1e7", "--pairs", "2"],
                      ["benchmarks/consensus_sum.py", "--quick"],
                      share=2.0),
    "meanfield": Part(["-m", "cbo_jax.cli", "reproduce", "meanfield-scaling", "--sizes", "1e2,1e3,1e4,1e5,1e6",
                       "--reference", "1e7", "--no-progress", "--output", "{DIR}", "--overwrite"],
                      ["-m", "cbo_jax.cli", "reproduce", "meanfield-scaling", "--sizes", "64,256", "--reference", "4096",
                       "--steps", "10", "--seeds", "2", "--no-progress", "--output", "{DIR}", "--overwrite"],
                      share=1.0, files="meanfield-scaling"),
    "table1": Part(["-m", "cbo_jax.cli", "reproduce", "fedcbo-table1", "--scale", "paper", "--seeds", "1",
                    "--rounds", "{TABLE1_ROUNDS}", "--source", "idx", "--no-progress", "--output", "{DIR}",
                    "--overwrite"],
                   ["-m", "cbo_jax.cli", "reproduce", "fedcbo-table1", "--scale", "small", "--seeds", "1",
                    "--rounds", "1", "--source", "bundled", "--no-progress", "--output", "{DIR}", "--overwrite"],
                   share=1.6, needs_data=True, files="fedcbo-table1"),
}
TABLE1_METHODS = ("fedcbo", "ifca", "fedavg", "local")
# A part given less is not started (its time goes to the next): starting JAX on a GPU and compiling
# take longer than that, so it could only time out.
MIN_PART_SECONDS = 15.0
TABLE1_SCALES = {"paper": (1200, 200, 10), "small": (120, 20, 5)}  # agents, M, tau (cbo_jax.experiments.fedcbo_table1)


def _device() -> str:
    out = subprocess.run([sys.executable, "-c", "import jax; d = jax.devices()[0]; print(d.platform, '|', d.device_kind)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def part_timeout(remaining: float, names: list[str], cap: float) -> float:
    """Seconds the first of ``names`` may run: its share of ``remaining`` among ``names`` (at most ``cap``)."""
    total = sum(SUITES[n].share for n in names)
    return max(0.0, min(cap, remaining * SUITES[names[0]].share / total))


def _partial(name: str, rows: list[dict]) -> dict | None:
    """The result of a part stopped part-way, from the rows it wrote as they finished (None: no rows)."""
    if not rows:
        return None
    if name == "cbo":
        return {"results": rows}
    if name == "clustered":
        return {"rows": rows}
    return None


def _run(name: str, argv: list[str], timeout: float, progress: str | None = None) -> dict:
    """Run ``python argv`` with a timeout; its last JSON line is the result (or, stopped, its progress rows)."""
    if progress:
        Path(progress).unlink(missing_ok=True)
        argv = [*argv, "--progress", progress]
    t0 = time.perf_counter()
    # A session of its own, so that a timeout stops the part's own subprocesses too (the float64
    # worker of cbo_throughput.py): one left running would hold the accelerator under the next part.
    proc = subprocess.Popen([sys.executable, *argv], cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = proc.communicate()
        res = {"ok": False, "error": f"timeout after {timeout:.0f} s", "seconds": timeout, "log_tail": stderr[-800:]}
        partial = _partial(name, _progress.read(progress)) if progress else None
        if partial is not None:
            res.update(partial=True, result=partial)
        return res
    seconds = time.perf_counter() - t0
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": (stderr or stdout)[-800:], "seconds": seconds}
    return {"ok": True, "result": json.loads(lines[-1]), "seconds": seconds}


def _table1_runs(out_dir: Path) -> dict:
    """Seconds, rounds and final accuracy of each method's run in a fedcbo-table1 output directory."""
    runs = {}
    for method in TABLE1_METHODS:
        path = out_dir / method / "seed0" / "summary.json"
        if path.exists():
            s = json.loads(path.read_text())
            runs[method] = {k: s.get(k) for k in ("seconds", "rounds", "final_test_acc")}
    return runs


def _table1_result(res: dict, argv: list[str], out_dir: Path) -> None:
    """Add each method's run to ``res``; a run stopped part-way reports the methods that finished."""
    runs = res["runs"] = _table1_runs(out_dir)
    if res["ok"] or not runs:
        return
    scale = argv[argv.index("--scale") + 1]
    res.update(partial=True, result={
        "scale": scale, "rounds": int(argv[argv.index("--rounds") + 1]),
        **dict(zip(("agents", "M", "epochs"), TABLE1_SCALES[scale])),
        "wall_seconds": sum(v["seconds"] or 0.0 for v in runs.values()),
        **{m: v["final_test_acc"] for m, v in runs.items() if v.get("final_test_acc") is not None}})


def _rows(name: str, res: dict) -> list[str]:
    if res.get("skipped"):
        return [f"| {name} | not run: {res['skipped']} | | |"]
    if not res["ok"] and not res.get("partial"):
        return [f"| {name} | failed: {res['error'].splitlines()[-1] if res['error'] else '?'} | | |"]
    r = res["result"]
    finished = "methods" if name == "table1" else "sizes"
    note = f"stopped: {res['error']}; the {finished} finished before it" if res.get("partial") else ""
    if name == "cbo":
        out = []
        for row in r["results"]:
            f32 = row["cbo_jax_float32"]["particle_steps_per_s"]
            f64 = row.get("cbo_jax_float64", {}).get("particle_steps_per_s")
            peer = row.get("cbxpy_float64", {}).get("particle_steps_per_s")
            ratio = f"{f32 / peer:.1f}x CBXpy (same run)" if peer else "-"
            extra = f"float64 {f64 / 1e6:.2f} M/s" if f64 else ""
            out.append(f"| CBO Rastrigin d=20, N={row['N']:.0e} | {f32 / 1e6:.2f} M particle-steps/s | {ratio} | "
                       f"{'; '.join(x for x in (extra, note) if x)} |")
        return out
    if name == "clustered":
        return [f"| clustered K=4 d=10, N={row['N']:.0e} | {row['cbo_jax']['particle_steps_per_s'] / 1e6:.2f} M "
                f"particle-steps/s | "
                + (f"{row['speedup_vs_numpy']:.1f}x NumPy (same run)" if "speedup_vs_numpy" in row else "-")
                + f" | {note} |" for row in r["rows"]]
    if name == "fedcbo":
        st = r.get("settings", {})
        phases = f"local {r['seconds_local']:.3g} s, aggregation {r['seconds_aggregation']:.3g} s"
        if "test_eval_seconds" in r:
            phases += f", test evaluation {r['test_eval_seconds']:.3g} s, other {r.get('other_seconds', 0.0):.3g} s"
        fractions = f"aggregation at {r['fraction_of_matmul_peak']:.2f}"
        if "round_fraction_of_matmul_peak" in r:
            fractions += (f", local training at {r['local_fraction_of_matmul_peak']:.2f}, the whole round at "
                          f"{r['round_fraction_of_matmul_peak']:.2f}")
        best, head = r.get("best_aggregation") or {}, r.get("head_aggregation") or {}
        by_model = head.get("variant") == "by_model"
        other = ""
        if best and (best.get("variant"), best.get("eval_chunk")) != (head.get("variant"), head.get("eval_chunk")):
            other = (f"; fastest aggregation {best['variant']}@{best['eval_chunk']}: {best['seconds']:.3g} s, "
                     f"{best['fraction_of_matmul_peak']:.2f}")
        return [f"| FedCBO round (N={st.get('N', '?')}, M={st.get('M', '?')}, tau={st.get('tau', '?')}) | {phases} | "
                f"{fractions} of the same-run matmul ceiling | "
                f"ceiling {r['matmul_peak_gflops']:.0f} GFLOP/s (eval_by {st.get('eval_by')}, "
                f"{'group' if by_model else 'chunk'} {head.get('eval_chunk')}){other} |"]
    if name == "consensus":
        out = [f"| consensus sum, N={row['N']:,}, d={row['d']} | relative error {row['package_relative_error']:.1e} "
               f"summed in blocks, {row['dot_relative_error']:.1e} as one dot | blocks {row['package_over_dot_time']:.2f}x "
               f"the dot's time (same run) | {row['package_form']} |"
               for row in r["contraction"]]
        out += [f"| CBO step d={row['d']}, N={row['N']:.0e}, the consensus summed in blocks | "
                f"{row['package_particle_steps_per_s'] / 1e6:.2f} M particle-steps/s | {row['package_over_dot']:.2f}x "
                f"one dot (same run, median of {row['pairs']} pairs) | |" for row in r["cbo_step"]]
        return out
    if name == "step":
        return [f"| CBO step d={r['dim']}, N={row['n']:.0e} | {row['library'] / 1e9:.2f} G particle-steps/s "
                f"(`simulate`, defaults) | {row['library_over_plain']:.2f}x a plain scan, {row['library_over_bound']:.2f}"
                f" of the bandwidth bound (same run) | a·x+b {r['bandwidth_gbs']:.0f} GB/s: bound "
                f"{row['bound'] / 1e9:.2f} G/s {note} |" for row in r["rows"]]
    if name == "memory":
        worst = max(r["dynamics"].items(), key=lambda kv: kv[1]["peak_over_state"])
        return [f"| compiled step memory, N={r['n']:.0e}, d={r['dim']}, every dynamic | peak / state "
                f"{min(v['peak_over_state'] for v in r['dynamics'].values()):.2f}..{worst[1]['peak_over_state']:.2f} "
                f"(largest: {worst[0]}) | bar 1.5 | {note} |"]
    if name == "large_n":
        return [f"| large N, CBO d=10, N={r['largest_n']:.0e} | {r['particle_steps_per_s'] / 1e9:.2f} G "
                f"particle-steps/s | peak device memory {r.get('peak_device_gb')} GB (particles alone "
                f"{r['largest_n'] * 40 / 1e9:.0f} GB) | {note} |"]
    if name == "meanfield":
        return [f"| meanfield-scaling, N={r['sizes'][0]}..{r['sizes'][-1]}, ref {r['reference_N']:.0e} | "
                f"slope {r['slope']:.3f} | expected -0.5 | {r['seconds']:.0f} s |"]
    if name == "table1":
        runs = res.get("runs", {})
        per = ", ".join(f"{m} {v['seconds']:.0f} s" for m, v in runs.items() if v.get("seconds") is not None)
        acc = ", ".join(f"{m} {r[m]:.2f}" for m in TABLE1_METHODS if isinstance(r.get(m), (int, float)))
        done = f"{note}; " if note else ""
        return [f"| fedcbo-table1 --scale {r.get('scale')} (N={r.get('agents')}, M={r.get('M')}, "
                f"tau={r.get('epochs')}), {r.get('rounds')} rounds | {r.get('wall_seconds', float('nan')):.0f} s in all"
                f" ({per}; compilation included) | accuracy after {r.get('rounds')} rounds: {acc} | "
                f"{done}the paper's run has 100 rounds |"]
    return [f"| {name} | {json.dumps(r)[:120]} | | |"]


def _write(out: Path, results: dict, names: list[str], device: str, today: str, command: str, smoke: bool) -> str:
    order = [n for n in SUITES if n in results]
    devices = sorted({results[n]["device"] for n in order})
    dates = sorted({results[n]["date"] for n in order})
    if len(devices) == 1:
        device_line = f"- device: {devices[0]}"
    else:
        device_line = "- devices: " + "; ".join(
            f"{d} ({', '.join(n for n in order if results[n]['device'] == d)})" for d in devices)
    lines = [f"# Accelerator benchmark suite{' (smoke sizes)' if smoke else ''}", "",
             device_line, f"- date: {', '.join(dates)}",
             f"- command: `{command}`" + (" (run in parts with --only and --merge)" if len(order) > len(names) else ""),
             "", "| benchmark | rate | ratio | note |", "|---|---:|---:|---|"]
    for name in order:
        lines += _rows(name, results[name])
    text = "\n".join(lines) + "\n"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    json_path = out.with_suffix(".json")
    tmp = json_path.with_name(json_path.name + ".tmp")
    tmp.write_text(json.dumps({"device": device, "date": today, "results": results}, indent=1))
    os.replace(tmp, json_path)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (checks the suite itself, e.g. on a CPU)")
    ap.add_argument("--only", default=",".join(SUITES), help=f"comma-separated subset of {','.join(SUITES)}")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS_gpu.md", help="Markdown file to write")
    ap.add_argument("--work", type=Path, default=None,
                    help="directory for the parts' own files (the reproductions' plots, arrays and runs, in "
                         "WORK/meanfield-scaling/ and WORK/fedcbo-table1/; default: beside --out, in "
                         "OUT_meanfield-scaling/ and OUT_fedcbo-table1/)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per part at most")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for all the parts together: each part gets its share of what is left (its share in "
                         "SUITES), time a part leaves unused goes to the parts after it")
    ap.add_argument("--table1-rounds", type=int, default=10, help="rounds of the table1 part (default 10; the paper's 100)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the results of other benchmarks already in OUT's .json (a suite run in parts, e.g. "
                         "one --only per call where a machine limits a command's time); each keeps its device")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    names = [n for n in SUITES if n in names]  # the suite's order: the budget's shares follow it
    if not names:
        raise SystemExit(f"--only names no part; choose from {','.join(SUITES)}")
    if args.budget is not None and args.budget <= 0:
        raise SystemExit("--budget must be positive")
    if args.table1_rounds < 1:
        raise SystemExit("--table1-rounds must be >= 1")
    t_start = time.perf_counter()
    device = _device()
    today = datetime.date.today().isoformat()
    # the command that reruns what was run: the parts and the flags off their defaults
    prefix = "python benchmarks/gpu_suite.py" + (" --smoke" if args.smoke else "") + (
        f" --budget {args.budget:g}" if args.budget is not None else "")
    extra = (f" --table1-rounds {args.table1_rounds}" if args.table1_rounds != 10 and "table1" in names else "") + (
        f" --timeout {args.timeout:g}" if args.timeout != 1800 else "")
    command = prefix + (f" --only {','.join(names)}" if names != list(SUITES) else "") + extra
    results = {}
    json_path = args.out.with_suffix(".json")
    if args.merge and json_path.exists():
        previous = json.loads(json_path.read_text())
        for name, res in previous.get("results", {}).items():
            res.setdefault("device", previous.get("device", "unknown"))
            res.setdefault("date", previous.get("date", "unknown"))
            results[name] = res
    work = (args.work or args.out.resolve().parent).resolve()
    work.mkdir(parents=True, exist_ok=True)
    progress_dir = tempfile.TemporaryDirectory(prefix="gpu_suite_")  # the parts' rows as they finish
    for i, name in enumerate(names):
        part = SUITES[name]
        # each part's own files (plots, arrays, runs) go beside OUT or under --work, never over a results/ directory
        part_dir = work / (args.out.stem + "_" + part.files if args.work is None else part.files)
        stamp = {"device": device, "date": today, "command": f"{prefix} --only {name}{extra}"}
        timeout = args.timeout
        if args.budget is not None:
            timeout = part_timeout(args.budget - (time.perf_counter() - t_start), names[i:], args.timeout)
        if part.needs_data and not args.smoke and not os.environ.get("CBO_JAX_DATA_DIR"):
            results[name] = {"ok": False, "skipped": "CBO_JAX_DATA_DIR is not set (the real MNIST files)",
                             "seconds": 0.0, **stamp}
        elif timeout < MIN_PART_SECONDS:
            results[name] = {"ok": False, "skipped": f"the budget was spent ({timeout:.0f} s left for it)",
                             "seconds": 0.0, **stamp}
        else:
            argv_ = [a.replace("{DIR}", str(part_dir)).replace("{TABLE1_ROUNDS}", str(args.table1_rounds))
                     for a in (part.smoke if args.smoke else part.gpu)]
            progress = str(Path(progress_dir.name) / f"{name}.jsonl") if part.progress else None
            print(f"[{name}] python {' '.join(argv_)}  (at most {timeout:.0f} s)", file=sys.stderr, flush=True)
            results[name] = {**_run(name, argv_, timeout, progress), **stamp}
            if name == "table1":
                _table1_result(results[name], argv_, part_dir)
        status = ("ok" if results[name]["ok"] else "partial" if results[name].get("partial")
                  else "not run" if results[name].get("skipped") else "FAILED")
        print(f"[{name}] {status} in {results[name]['seconds']:.0f} s", file=sys.stderr, flush=True)
        text = _write(args.out, results, names, device, today, command, args.smoke)  # after every part
    progress_dir.cleanup()
    print(text)
    print(json.dumps({"device": device, "ok": {n: r["ok"] for n, r in results.items()},
                      "seconds": round(time.perf_counter() - t_start, 1)}))
    return 0 if all(results[n]["ok"] or results[n].get("skipped") for n in names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
