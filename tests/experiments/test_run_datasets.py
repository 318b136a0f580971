"""``cbo-jax run ALGORITHM --dataset NAME`` end to end on tensorflow-datasets' mock data (the image
sets cannot be downloaded here), and the runs of earlier versions, whose config.json has no
``data.dataset``, still read back."""

import json
import shutil

import numpy as np
import pytest

from cbo_jax.cli import main
from cbo_jax.experiments import federated as fx

TINY = ["--data.agents", "4", "--data.clusters", "2", "--data.samples-per-agent", "10", "--rounds", "1",
        "--eval-every", "1", "--epochs", "1", "--batch-size", "5", "--test-size", "20", "--no-progress"]


def _last_json(out):
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # one CNN compilation (about 20 s on 2 cores); CI runs it in the slow step
def test_run_fedavg_on_mock_cifar10_with_the_cnn(tfds, tmp_path, capsys):
    """Rotated CIFAR-10 (2 clusters, 0° and 180°) with the CNN: one FedAvg round; config.json records
    the data set and the model; a resume with another data set is refused by flag, the same one
    reads the finished run back."""
    out = tmp_path / "out"
    with tfds.testing.mock_data(num_examples=40):
        code = main(["run", "fedavg", "--dataset", "cifar10", *TINY, "--output", str(out)])
        summary = _last_json(capsys.readouterr().out)
        assert code == 0
        assert summary["rounds"] == 1 and summary["num_agents"] == 4 and summary["num_clusters"] == 2
        assert np.isfinite(summary["final_test_acc"]) and np.isfinite(summary["final_train_loss"])
        recorded = json.loads((out / "config.json").read_text())
        assert recorded["data"] | {"dataset": "cifar10", "model": "cnn", "source": "tfds"} == recorded["data"]
        assert recorded["model"] == {"name": "cnn-32x32x3-32-64-512-10", "num_classes": 10, "loss": "cross_entropy",
                                     "parameters": 2_156_490}
        code = main(["run", "fedavg", "--dataset", "fashion_mnist", *TINY, "--output", str(out), "--resume"])
        err = capsys.readouterr().err
        assert code == 2 and "--data.dataset: 'cifar10' in" in err and "'fashion_mnist' now" in err
        code = main(["run", "fedavg", "--config", str(out / "config.json"), "--no-progress", "--output", str(out),
                     "--resume"])
        assert code == 0 and "finished earlier, its results read back" in capsys.readouterr().out


@pytest.mark.slow  # one MLP run; CI runs it in the slow step
def test_a_run_recorded_before_the_dataset_option_reads_back(tmp_path, monkeypatch, capsys):
    """A finished MNIST run whose config.json, written by an earlier version, has no data.dataset and
    data.model (nor the model's record) is still this run: --resume reads it back."""
    cfg = fx.default_config("fedavg", data=fx.RotatedMNISTConfig(source="bundled", agents=4, clusters=2,
                                                                  samples_per_agent=10))
    cfg = fx.replace(cfg, **{"run.rounds": 1, "run.eval_every": 1, "run.test_size": 20, "config.local.epochs": 1,
                             "config.local.batch_size": 5})
    out = tmp_path / "run"
    res = fx.run_experiment(cfg, out, progress=False)
    recorded = json.loads((out / "config.json").read_text())
    assert (recorded["data"]["dataset"], recorded["data"]["model"]) == ("mnist", "mlp")
    old = {**recorded, "data": {k: v for k, v in recorded["data"].items() if k not in ("dataset", "model")}}
    monkeypatch.setattr(fx, "run", lambda *a, **k: pytest.fail("a finished run ran again"))
    for record in (old, {k: v for k, v in old.items() if k != "model"}):
        copy = tmp_path / f"copy{len(record)}"
        shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
        (copy / "config.json").write_text(json.dumps(record))
        back = fx.run_experiment(cfg, copy, progress=False, resume=True)
        assert back.history == json.loads(json.dumps(res.history))
    assert capsys.readouterr().out.count("finished earlier, its results read back") == 2
