"""benchmarks/gpu_suite.py at its smoke sizes: the plumbing a GPU session depends on.

A lent GPU machine gives a session few device minutes and caps each command, so the suite
runs within one budget (``--budget``: each part its share, parts stopped part-way keep the
sizes they finished) or in parts (``--only`` per command, ``--merge`` to add to the results
written before). These checks run on the CPU: a failure here would otherwise cost device time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"

pytestmark = pytest.mark.skipif(not SUITE.exists(), reason="benchmarks/ is not beside the tests (installed wheel)")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(SUITE), "--smoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # about 20 s; CI runs it in the slow step
def test_suite_in_parts_merges_and_keeps_each_device(tmp_path):
    out = tmp_path / "RESULTS_gpu.md"
    first = _suite("--only", "meanfield", "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]
    # A second part, as on a later call (perhaps another machine): the first result stays.
    data = json.loads(out.with_suffix(".json").read_text())
    data["results"]["meanfield"]["device"] = "gpu | NVIDIA H100 80GB HBM3"
    out.with_suffix(".json").write_text(json.dumps(data))
    second = _suite("--only", "clustered", "--merge", "--out", str(out))
    assert second.returncode == 0, second.stderr[-2000:]
    text = out.read_text()
    assert "meanfield-scaling" in text and "clustered K=4" in text
    assert "NVIDIA H100 80GB HBM3 (meanfield)" in text and "(clustered)" in text
    assert "run in parts" in text
    merged = json.loads(out.with_suffix(".json").read_text())["results"]
    assert set(merged) == {"meanfield", "clustered"} and all(r["ok"] for r in merged.values())
    # Without --merge a run starts a fresh table; the same call checks that the meanfield part
    # re-runs into an output directory that already holds results (from the first part).
    again = _suite("--only", "meanfield", "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert set(json.loads(out.with_suffix(".json").read_text())["results"]) == {"meanfield"}
    # the table's command reruns what ran (it said `gpu_suite.py --smoke`, all five parts)
    assert "- command: `python benchmarks/gpu_suite.py --smoke --only meanfield`" in out.read_text()


@pytest.mark.slow  # about 20 s
def test_consensus_part_reports_the_error_and_time_of_both_sums(tmp_path):
    out = tmp_path / "RESULTS_gpu.md"
    proc = _suite("--only", "consensus", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| consensus sum, N=100,000, d=10 | relative error" in text and "blocks of 1250" in text
    assert "| consensus sum, N=100,003, d=10 |" in text and "| a loop over blocks |" in text  # a prime
    assert "| CBO step d=10, N=1e+05, the consensus summed in blocks |" in text
    result = json.loads(out.with_suffix(".json").read_text())["results"]["consensus"]["result"]
    big = next(r for r in result["contraction"] if r["N"] == 100000)
    assert big["package_relative_error"] < big["dot_relative_error"]


@pytest.mark.slow  # about 40 s
def test_issue_59_parts_report_the_bound_the_memory_and_large_n(tmp_path):
    """The parts a GPU session runs first: the step beside a plain scan and the bandwidth bound,
    the compiled step's memory for every dynamic, and large N with its device memory."""
    out = tmp_path / "RESULTS_gpu.md"
    proc = _suite("--only", "step,memory,large_n", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| CBO step d=20, N=1e+03 |" in text and "x a plain scan" in text and "of the bandwidth bound" in text
    assert "| compiled step memory, N=2e+03, d=20, every dynamic | peak / state" in text
    assert "| large N, CBO d=10, N=1e+04 |" in text
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert all(results[k]["ok"] for k in ("step", "memory", "large_n"))
    assert len(results["memory"]["result"]["dynamics"]) == 12


@pytest.mark.slow
def test_cbo_throughput_runs_without_cbxpy():
    """The GPU image has no CBXpy: the benchmark must fall back to its own column, not fail."""
    code = (  # hide the installed CBXpy from the benchmark's check
        "import importlib.util, sys, runpy\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'cbx' else real(name, *a)\n"
        "sys.argv = ['cbo_throughput.py', '--quick', '--sizes', '500', '--steps', '20', '--no-partitionable']\n"
        f"runpy.run_path({str(ROOT / 'benchmarks' / 'cbo_throughput.py')!r}, run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CBXpy (PyPI 'cbx') is not installed" in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cbx_version"] is None and result["particle_steps_per_s"] > 0


def test_budget_shares_pass_unused_time_to_later_parts():
    suite = _module("gpu_suite")
    names = list(suite.SUITES)
    total = sum(p.share for p in suite.SUITES.values())
    first = suite.part_timeout(1000.0, names, cap=1e9)
    assert first == pytest.approx(1000.0 * suite.SUITES[names[0]].share / total)
    # the last part gets all that is left; the cap bounds every part
    assert suite.part_timeout(123.0, names[-1:], cap=1e9) == pytest.approx(123.0)
    assert suite.part_timeout(1000.0, names, cap=7.0) == 7.0
    # a part that finished early leaves its time to the rest: the shares of what is left
    assert suite.part_timeout(900.0, names[1:], cap=1e9) > 1000.0 * suite.SUITES[names[1]].share / total
    assert suite.part_timeout(-5.0, names, cap=1e9) == 0.0


def test_a_part_out_of_time_keeps_its_finished_rows_and_stops_its_subprocesses(tmp_path):
    """The cbo part writes each N as it finishes; a timeout keeps them and kills the worker it started."""
    suite = _module("gpu_suite")
    progress = tmp_path / "cbo.jsonl"
    pid_file = tmp_path / "worker.pid"
    row = {"N": 10_000, "cbo_jax_float32": {"particle_steps_per_s": 5e6}, "cbxpy_float64": {"particle_steps_per_s": 1e6}}
    script = tmp_path / "slow_bench.py"
    script.write_text(textwrap.dedent(f"""
        import json, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(worker.pid))
        path = sys.argv[sys.argv.index("--progress") + 1]
        with open(path, "a") as fh:
            fh.write(json.dumps({row!r}) + "\\n")
        time.sleep(60)
    """))
    t0 = time.perf_counter()
    res = suite._run("cbo", [str(script)], timeout=4.0, progress=str(progress))
    assert time.perf_counter() - t0 < 30
    assert not res["ok"] and res["partial"] and "timeout after 4 s" in res["error"]
    assert res["result"] == {"results": [row]}
    line = suite._rows("cbo", {**res, "device": "d", "date": "x"})[0]
    assert "5.00 M particle-steps/s" in line and "5.0x CBXpy" in line and "stopped: timeout" in line
    worker = int(pid_file.read_text())
    for _ in range(50):  # the worker, a grandchild, was killed with its process group
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init, or a zombie: either way no longer running
            if open(f"/proc/{worker}/stat").read().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the part's own subprocess outlived its timeout")


def test_a_part_out_of_time_without_rows_is_a_failure(tmp_path):
    suite = _module("gpu_suite")
    script = tmp_path / "hang.py"
    script.write_text("import time; time.sleep(60)\n")
    res = suite._run("fedcbo", [str(script)], timeout=2.0, progress=None)
    assert not res["ok"] and not res.get("partial")
    assert suite._rows("fedcbo", res) == ["| fedcbo | failed: timeout after 2 s | | |"]


def test_progress_rows_survive_a_line_cut_short(tmp_path):
    progress = _module("_progress")
    path = tmp_path / "rows.jsonl"
    progress.append(path, {"N": 1})
    progress.append(None, {"N": 2})  # no path: nothing written
    with open(path, "a") as fh:
        fh.write('{"N": 3, "cbo_')  # a kill mid-write
    assert progress.read(path) == [{"N": 1}]
    assert progress.read(tmp_path / "missing.jsonl") == []


@pytest.mark.slow
def test_budget_spent_and_missing_data_are_reported_not_run(tmp_path):
    out = tmp_path / "RESULTS_gpu.md"
    env = {k: v for k, v in os.environ.items() if k != "CBO_JAX_DATA_DIR"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(SUITE), "--only", "table1,meanfield", "--budget", "0.001", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| meanfield | not run: the budget was spent" in text
    assert "| table1 | not run: CBO_JAX_DATA_DIR is not set" in text
    assert "--budget 0.001" in text


def test_table1_stopped_part_way_reports_the_methods_that_finished(tmp_path):
    suite = _module("gpu_suite")
    from cbo_jax.experiments.fedcbo_table1 import SCALES

    for name, (agents, m, tau) in suite.TABLE1_SCALES.items():  # the suite's copy of the scales
        assert (SCALES[name].agents, SCALES[name].M, SCALES[name].epochs) == (agents, m, tau)
    for method, seconds, acc in (("fedcbo", 40.0, 71.5), ("ifca", 30.0, 70.25)):
        run = tmp_path / method / "seed0"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"seconds": seconds, "rounds": 10, "final_test_acc": acc}))
    argv = ["-m", "cbo_jax.cli", "reproduce", "fedcbo-table1", "--scale", "paper", "--seeds", "1", "--rounds", "10"]
    res = {"ok": False, "error": "timeout after 90 s", "seconds": 90.0}
    suite._table1_result(res, argv, tmp_path)
    assert res["partial"] and set(res["runs"]) == {"fedcbo", "ifca"}
    assert res["result"]["wall_seconds"] == 70.0 and res["result"]["agents"] == 1200
    line = suite._rows("table1", res)[0]
    assert "70 s in all (fedcbo 40 s, ifca 30 s" in line and "fedcbo 71.50, ifca 70.25" in line
    assert "stopped: timeout after 90 s; the methods finished before it" in line
    empty = {"ok": False, "error": "timeout after 90 s", "seconds": 90.0}
    suite._table1_result(empty, argv, tmp_path / "none")
    assert not empty.get("partial") and suite._rows("table1", empty)[0].startswith("| table1 | failed: timeout")


def test_gpu_sizes_time_the_numpy_peers_only_where_they_finish_in_seconds():
    """At N = 1e7 CBXpy would take tens of minutes of a lease; the parts cap the peers' sizes."""
    suite = _module("gpu_suite")

    def opt(argv, flag):
        return argv[argv.index(flag) + 1]

    cbo, clustered, fed = suite.SUITES["cbo"].gpu, suite.SUITES["clustered"].gpu, suite.SUITES["fedcbo"].gpu
    assert float(opt(cbo, "--cbxpy-max-n")) <= 1e5 < max(float(v) for v in opt(cbo, "--sizes").split(","))
    assert float(opt(clustered, "--numpy-max-n")) <= 1e6 < max(float(v) for v in opt(clustered, "--sizes").split(","))
    # the FedCBO part times the round's own variants, not the CPU sweep (chunks, groups, one agent at a time)
    assert opt(fed, "--sweep-chunks") == "4,64" and opt(fed, "--groups") == "4" and opt(fed, "--agent-chunks") == ""
    assert "--no-compare" in fed


@pytest.mark.slow
def test_cbxpy_column_only_up_to_its_size_cap(tmp_path):
    pytest.importorskip("cbx")
    progress = tmp_path / "rows.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cbo_throughput.py"), "--sizes", "300,600",
                           "--steps", "20", "--repeats", "1", "--no-partitionable", "--cbxpy-max-n", "300",
                           "--progress", str(progress)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert [r["N"] for r in rows] == [300, 600]
    assert "cbxpy_float64" in rows[0] and "cbxpy_float64" not in rows[1]
    written = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [r["N"] for r in written] == [300, 600] and written[0]["steps"] == 20


def test_fedcbo_row_names_the_headline_aggregation_and_a_faster_chunk(tmp_path):
    """On a GPU the default chunk (4) may leave the card idle: the row says which one was faster."""
    suite = _module("gpu_suite")
    result = {"settings": {"N": 1200, "M": 200, "tau": 10, "eval_by": "agent", "eval_chunk": 4, "groups": [4]},
              "seconds_local": 0.5, "seconds_aggregation": 1.2, "test_eval_seconds": 0.3, "other_seconds": 0.01,
              "fraction_of_matmul_peak": 0.3, "round_fraction_of_matmul_peak": 0.35,
              "local_fraction_of_matmul_peak": 0.4, "matmul_peak_gflops": 4.0e5,
              "head_aggregation": {"variant": "aggregate", "eval_chunk": 4},
              "best_aggregation": {"variant": "aggregate", "eval_chunk": 64, "seconds": 0.4,
                                   "fraction_of_matmul_peak": 0.9}}
    row = suite._rows("fedcbo", {"ok": True, "result": result})[0]
    assert "(eval_by agent, chunk 4); fastest aggregation aggregate@64: 0.4 s, 0.90" in row
    result["best_aggregation"]["eval_chunk"] = 4  # the headline is the fastest: nothing more said
    assert "fastest" not in suite._rows("fedcbo", {"ok": True, "result": result})[0]


@pytest.mark.slow
def test_lease_wrapper_writes_its_files_to_out(tmp_path):
    """benchmarks/gpu_lease.sh run: what a lent machine sends back, checked here at a budget too small
    for any part (each is then reported as not run), so it costs seconds, not device minutes."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "TMPDIR": str(tmp)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "run", "10"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    names = {p.name for p in out.iterdir()}
    assert {"RESULTS_gpu.md", "RESULTS_gpu.json", "suite.log", "device.txt"} <= names and len(names) <= 8
    assert all(p.is_file() for p in out.iterdir())  # nothing in folders: a lent machine returns files at $OUT
    text = (out / "RESULTS_gpu.md").read_text()
    assert "| cbo | not run: the budget was spent" in text and "--budget 10" in text
    device = (out / "device.txt").read_text()
    assert "| jax " in device and "budget=10s" in device and "Error" not in device
    assert "gpu_lease: suite exit status 0" in proc.stdout
    assert not any(tmp.iterdir())  # its working folder (mktemp) is removed: the next run on the machine starts clean
