"""``cbo-jax sweep ALGORITHM``: comma lists of the algorithm's numbers become one grid, one program,
one results directory; axes of the data or the run, int fields, and no axis are refused."""

import json

import numpy as np
import pytest

from cbo_jax.cli import main

TINY = ["--agents", "8", "--clusters", "2", "--samples-per-agent", "16", "--epochs", "1", "--batch-size", "8",
        "--rounds", "2", "--eval-every", "2", "--test-size", "40", "--no-progress"]


def test_sweep_writes_one_results_directory_and_names_the_best_point(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "fedcbo", "--alpha", "1,30", "--lr", "0.02,0.1", "--output", str(out), "--M", "2", *TINY]) == 0
    text = capsys.readouterr().out
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["sweep"] == {"names": ["alpha", "local.lr"], "values": [[1.0, 30.0], [0.02, 0.1]], "shape": [2, 2]}
    acc = np.asarray(summary["final_test_acc"])
    assert acc.shape == (2, 2) and np.isfinite(acc).all()
    best = np.unravel_index(np.argmax(acc), acc.shape)
    assert summary["best"]["index"] == list(best) and "best: alpha=" in text
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["config"]["alpha"] == 1.0 and recorded["sweep"]["shape"] == [2, 2]
    assert (out / "sweep.png").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("extra, match", [
    (["--agents", "6,8"], "numbers of fedcbo's config"),
    (["--M", "2,3"], "no float field 'M'"),
    (["--alpha", "1,x"], "'x' is not one"),
    ([], "no axis given"),
])
def test_sweep_refuses_what_it_cannot_sweep(extra, match, tmp_path, capsys):
    argv = ["sweep", "fedcbo", "--output", str(tmp_path / "s"), "--M", "2", *TINY]
    for flag, value in zip(extra[::2], extra[1::2]):  # the TINY value of the same flag is replaced
        i = argv.index(flag) if flag in argv else None
        if i is None:
            argv += [flag, value]
        else:
            argv[i + 1] = value
    assert main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, extra", [("fedprox", ["--mu", "0.1"]), ("fedopt", ["--server", "yogi"]),
                                              ("ditto", []), ("scaffold", []), ("cfl", ["--warmup", "1"])])
def test_the_baselines_run_from_the_command_line(algorithm, extra, tmp_path, capsys):
    out = tmp_path / algorithm
    assert main(["run", algorithm, "--output", str(out), *TINY, *extra]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["algorithm"] == {"fedopt": "fedyogi"}.get(algorithm, algorithm)
    assert 0 <= summary["final_test_acc"] <= 100
    assert json.loads((out / "config.json").read_text())["algorithm"] == algorithm


def test_a_sweep_of_a_baseline_from_the_command_line_is_refused_for_an_int(capsys, tmp_path):
    assert main(["sweep", "scaffold", "--output", str(tmp_path / "s"), *TINY, "--epochs", "1,2"]) == 2
    assert "no float field 'local.epochs'" in capsys.readouterr().err
