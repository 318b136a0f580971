"""cbo-jax run / demo / federated reproductions: results directories and bad input."""

import json

import pytest

from cbo_jax.cli import main

TINY = {"source": "bundled", "agents": 8, "clusters": 4, "samples_per_agent": 20, "epochs": 1, "batch_size": 10,
        "M": 3, "rounds": 2, "eval_every": 1, "test_size": 100, "eval_chunk": 4}


def _last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def test_run_fedcbo_writes_results_directory(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "res"
    assert main(["run", "fedcbo", "--config", str(cfg), "--alpha", "5", "--output", str(out), "--no-progress"]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["algorithm"] == "fedcbo" and summary["rounds"] == 2 and 0 <= summary["final_test_acc"] <= 100
    assert json.loads((out / "config.json").read_text())["alpha"] == 5.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all("sr" in r and "test_acc" in r for r in rows)
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "selection_rate.png").exists()


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--M", "8"], "M="),
        (["--agents", "10"], "divisible"),
        (["--clusters", "3", "--agents", "9"], "rotation count"),
        (["--source", "idx", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir: not a directory"),
        (["--lr", "-1"], "lr must be > 0"),
    ],
)
def test_run_bad_input_is_a_clear_error(tmp_path, capsys, extra, match):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY))
    rc = main(["run", "ifca" if "--clusters" in extra else "fedcbo", "--config", str(cfg), "--output", str(tmp_path / "r"),
               "--no-progress", *extra])
    assert rc == 2
    assert match in capsys.readouterr().err


def test_config_file_unknown_key(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({**TINY, "learning_rate": 0.1}))
    assert main(["run", "local", "--config", str(cfg), "--no-progress"]) == 2
    assert "learning_rate" in capsys.readouterr().err


def test_reproduce_list_has_fedcbo_entries(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fedcbo-table1" in out and "96.51" in out and "fedcbo-noise" in out
