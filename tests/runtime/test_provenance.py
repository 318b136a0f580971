"""summary.json's environment block: versions, device, command, git state."""

import json
import shutil
import subprocess

import jax
import numpy as np
import pytest

import cbo_jax
from cbo_jax import provenance
from cbo_jax.report import render


def test_environment_names_versions_device_and_command():
    env = provenance.environment(["/usr/bin/prog", "a b", "--x=1"])
    assert env["cbo_jax"] == cbo_jax.__version__ and env["jax"] == jax.__version__ and env["numpy"] == np.__version__
    assert env["backend"] == jax.default_backend() and env["device_kind"] == jax.devices()[0].device_kind
    assert env["device_count"] == jax.device_count() and env["process_count"] == 1
    assert env["command"] == "prog 'a b' --x=1"  # shell-quoted, program by its base name
    assert env["date_utc"].endswith("+00:00") and env["cpu_model"]
    json.dumps(env)  # plain JSON
    with provenance.command(["cbo-jax", "demo"]):
        assert provenance.environment()["command"] == "cbo-jax demo"
    assert provenance.environment()["command"] != "cbo-jax demo"  # reset after the block


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_checkout(tmp_path):
    assert provenance.git_state(tmp_path) == {}  # not a work tree
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / "f.txt").write_text("1")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance.git_state(tmp_path) == {"git_commit": sha, "git_dirty": False}
    (tmp_path / "venv" / "site-packages").mkdir(parents=True)  # an install inside someone else's repository
    assert provenance.git_state(tmp_path / "venv" / "site-packages") == {}
    (tmp_path / "new.txt").write_text("untracked files do not count")
    assert provenance.git_state(tmp_path)["git_dirty"] is False
    (tmp_path / "f.txt").write_text("2")
    assert provenance.git_state(tmp_path) == {"git_commit": sha, "git_dirty": True}


def test_report_compares_results_not_environments(tmp_path):
    for name, acc, devices in (("a", 90.0, 1), ("b", 80.0, 8)):
        d = tmp_path / name
        d.mkdir()
        env = {**provenance.environment(), "device_count": devices}
        (d / "summary.json").write_text(json.dumps({"final_test_acc": acc, "environment": env}))
    page = render(tmp_path, fmt="md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| run")]
    assert table and "final_test_acc" in table[0] and "environment" not in table[0]
    assert "environment." not in page  # each run's block is one line above its table
    env = provenance.environment()
    assert page.count(f"Produced by `{env['command']}`; cbo_jax {env['cbo_jax']}, JAX {env['jax']}") == 2
    assert "x 8 (host: " in page and env["date_utc"][:10] in page


def test_describe_is_one_line_naming_the_device():
    env = provenance.environment()
    line = provenance.describe(env)
    assert line.startswith(env["backend"].upper() + " (") and line.endswith(f"jax device {env['device_kind']}")
    assert f"{env['cpu_count']} cores" in line and env["cpu_model"] in line


def test_write_summary_adds_the_environment_and_leaves_the_summary(tmp_path):
    from cbo_jax.writer import write_summary

    summary = {"best_energy": np.float32(0.5), "per_run": np.array([1.0, np.inf]), "nan": float("nan")}
    write_summary(tmp_path / "summary.json", summary)
    got = json.loads((tmp_path / "summary.json").read_text())
    assert got["best_energy"] == 0.5 and got["per_run"] == [1.0, None] and got["nan"] is None  # valid JSON
    assert got["environment"]["cbo_jax"] == cbo_jax.__version__
    assert "environment" not in summary  # what a command prints stays the result alone


def test_the_git_state_is_read_when_a_run_starts_not_when_its_summary_is_written(tmp_path, monkeypatch):
    """A commit made while a long run went on was recorded as the run's code (the FedSGLD
    reproduction of 2026-11-28 named a commit made after it started). The state is read at
    the start of a command, of ``fl.run`` and of ``simulate`` with ``out``; an enclosing
    block's state stands."""
    calls = iter(range(1, 100))
    monkeypatch.setattr(provenance, "git_state", lambda path=None: {"git_commit": f"c{next(calls)}", "git_dirty": False})
    assert provenance.environment()["git_commit"] == "c1"  # no run: read when asked
    with provenance.started():  # reads c2
        assert provenance.environment()["git_commit"] == "c2"
        with provenance.started():
            assert provenance.environment()["git_commit"] == "c2"
    with provenance.command(["cbo-jax", "demo"]):  # reads c3
        provenance.git_state()  # a commit made meanwhile: c4
        assert provenance.environment()["git_commit"] == "c3"
    x0 = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)
    meanwhile = lambda state: (provenance.git_state(), {})[1]  # noqa: E731 - a commit during the run (traced): c6
    cbo_jax.simulate(cbo_jax.cbo(cbo_jax.objectives.Sphere()), x0, 0, 3, out=tmp_path / "s", observe=meanwhile)
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["environment"]["git_commit"] == "c5"
