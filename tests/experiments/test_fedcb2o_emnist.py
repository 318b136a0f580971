"""``cbo-jax reproduce fedcb2o-attack --dataset emnist`` end to end, on tensorflow-datasets' mock
data (EMNIST cannot be downloaded here), and the error that says how to prepare the data."""

import dataclasses
import functools
import json

import numpy as np
import pytest

from cbo_jax.cli import main


def _last_json(out):
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # four runs' compilations; CI runs it in the slow step
def test_emnist_attack_command_runs_on_mock_data(tfds, tmp_path, monkeypatch, capsys):
    """The command's whole path: the flags, the tfds loader (``data_source``), the 47-class
    label flip 'O' -> '0', the four runs and the JSON; the agents and images shrunk to fit the
    mock data (the paper's sizes need 35,500 images per cluster)."""
    from cbo_jax.experiments import fedcb2o_attack
    from cbo_jax.federated import attacks, emnist

    small = functools.partial(attacks.LabelFlipConfig, benign_per_cluster=3, malicious_per_cluster=1,
                              benign_samples=40, val_samples=10, malicious_samples=50)
    monkeypatch.setattr(fedcb2o_attack.attacks, "LabelFlipConfig", small)
    monkeypatch.setitem(fedcb2o_attack.SCALES, "small",
                        dataclasses.replace(fedcb2o_attack.SCALES["small"], M=2, T_G=1, eval_chunk=2))
    with tfds.testing.mock_data(num_examples=400):
        code = main(["reproduce", "fedcb2o-attack", "--dataset", "emnist", "--scale", "small", "--seeds", "1",
                     "--rounds", "2", "--no-sensitivity", "--robust", "median", "--no-progress",
                     "--output", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = _last_json(out)
    assert r["dataset"] == "emnist" and r["setting"] == "paper"
    assert (r["source_class"], r["target_class"]) == (emnist.EMNIST_SOURCE_O, emnist.EMNIST_TARGET_ZERO)
    for name in ("fedcb2o", "fedcbo", "oracle_min", "oracle_max"):
        assert all(np.isfinite(r[name][k]) for k in ("overall_acc", "source_acc", "asr")), r[name]
    assert all(np.isfinite(r["robust"]["median"][k]) for k in ("overall_acc", "source_acc", "asr"))
    assert r["attackers_loss_gap"] is None  # 2 rounds: fewer than the gap's 5
    cfg = json.loads((tmp_path / "out" / "fedcb2o" / "seed0" / "config.json").read_text())
    assert cfg["model"]["num_classes"] == emnist.EMNIST_BALANCED_CLASSES


def test_emnist_not_prepared_says_how(tfds, tmp_path, capsys):
    """No EMNIST in the data directory: the error names the directory and the commands that
    prepare it as array_record files (what ``tfds.data_source`` reads)."""
    empty = tmp_path / "tfds"
    empty.mkdir()
    code = main(["reproduce", "fedcb2o-attack", "--dataset", "emnist", "--data-dir", str(empty), "--seeds", "1",
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0
    assert f"there is no {empty / 'emnist' / 'balanced'}" in err
    assert f"tfds build emnist/balanced --file_format=array_record --data_dir={empty}" in err
    assert "tfds convert_format" in err


@pytest.mark.parametrize("flags, match", [(["--robust", "mode"], "--robust takes"), (["--robust", ","], "--robust takes")])
def test_bad_robust_list_is_refused_before_data_is_read(flags, match, monkeypatch, capsys):
    from cbo_jax.experiments import fedcb2o_attack

    def loaded(args):
        raise AssertionError("data were loaded")

    monkeypatch.setattr(fedcb2o_attack, "_images", loaded)
    assert main(["reproduce", "fedcb2o-attack", "--seeds", "1", "--no-progress", *flags]) != 0
    assert match in capsys.readouterr().err
