"""The scripts in examples/ run as a user runs them, and print what their docstrings claim.

Each runs as its own process from an empty working directory (what it writes lands there),
at its own sizes: together about a minute on 2 CPU cores, so they run in CI's slow step. The
particle examples run long simulations: they compile with XLA's backend optimisation, which
the test run otherwise turns off (tests/conftest.py, ``optimized_xla``).
``examples/federated_custom_model.py`` has a CI step of its own (.ci/run).
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.slow


def _run(name: str, cwd: Path) -> list[str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_quickstart_solves_rastrigin_in_nearly_every_run(tmp_path, optimized_xla):
    (line,) = [ln for ln in _run("quickstart.py", tmp_path) if ln.startswith("successes:")]
    successes, runs = map(int, re.fullmatch(r"successes: (\d+) of (\d+)", line).groups())
    assert runs == 100 and successes >= 90, line  # 100 of 100 when written


def test_cb2o_keeps_the_benign_minimiser_and_cbo_is_dragged_away(tmp_path, optimized_xla):
    out = dict(ln.split(":", 1) for ln in _run("cb2o_malicious.py", tmp_path))
    assert float(out["CB²O consensus distance to a"]) < 1e-2
    assert float(out["CBO  consensus distance to a"]) > 1.0  # |a - b| = 2 sqrt(5): pulled to b


def test_clustered_particles_find_every_class_minimiser(tmp_path, optimized_xla):
    errors = [float(ln.rsplit("=", 1)[1]) for ln in _run("clustered_particles.py", tmp_path) if ln.startswith("class ")]
    assert len(errors) == 4 and max(errors) < 1e-3, errors


def test_fedcbo_rotated_mnist_learns_and_writes_its_results(tmp_path):
    summary = ast.literal_eval(_run("fedcbo_rotated_mnist.py", tmp_path)[-1])
    assert summary["algorithm"] == "fedcbo" and summary["rounds"] == 15
    assert summary["final_test_acc"] > 70, summary  # 83.2 on the bundled subset when written
    out = tmp_path / "results" / "example-fedcbo"
    assert {"summary.json", "metrics.jsonl", "config.json"} <= {p.name for p in out.iterdir()}


def test_an_algorithm_of_ones_own_runs_through_fl_run(tmp_path):
    """FedAvg with server momentum, written against fl's public pieces: with beta = 0 it is FedAvg
    (up to float rounding), with beta = 0.9 it learns at least as well (97.6 against 95.0 % when
    written)."""
    import json

    r = json.loads(_run("federated_custom_algorithm.py", tmp_path)[-1])
    assert r["rounds"] == 30 and r["beta0_max_abs_diff_to_fedavg"] < 1e-5, r
    assert r["fedavgm_final"] >= r["fedavg_final"] > 80, r


def test_black_box_objectives_and_ask_tell_match_the_jax_runs(tmp_path):
    """examples/black_box.py: a NumPy objective and an ask/tell loop give simulate's numbers in
    float64 (issue 60's bars: 1e-10 and 1e-12), for every dynamics of the CBX family, and a
    program run in a subprocess is minimised."""
    import json

    out = json.loads(_run("black_box.py", tmp_path)[-1])
    assert out["float64"] and out["host_calls"] == 101
    assert out["numpy_vs_jax_max_abs_diff"] <= 1e-10
    assert out["ask_tell_vs_simulate_max_abs_diff"] <= 1e-12
    assert np.isfinite(out["subprocess_best_energy"]) and out["subprocess_best_energy"] < 1.0
    assert out["dynamics_covered"] >= 8, out["dynamics"]
