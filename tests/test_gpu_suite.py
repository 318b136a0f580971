"""benchmarks/gpu_suite.py at its smoke sizes: the plumbing a GPU session depends on.

A lent GPU machine gives a session few device minutes and caps each command, so the suite
runs in parts (``--only`` per command, ``--merge`` to add to the results written before).
These checks run the parts on the CPU: a failure here would otherwise cost device time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"

pytestmark = [
    pytest.mark.slow,  # about 20 s; CI runs it in the slow step
    pytest.mark.skipif(not SUITE.exists(), reason="benchmarks/ is not beside the tests (installed wheel)"),
]


def _suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(SUITE), "--smoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


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
