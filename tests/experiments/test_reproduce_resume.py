"""A long reproduction stopped part-way continues (``cbo-jax reproduce NAME --resume``), and
a finished run is read back, not run again (:func:`cbo_jax.federated.runner.finished`).

Before, ``reproduce`` refused any directory holding results (only ``--overwrite``: all
runs again), and ``cbo-jax run --resume`` of a finished run that saved no checkpoint ran
it again from round 0. SIGTERM (a scheduler's stop) killed the command with no message.
"""

import argparse
import dataclasses
import json
import os
import signal
import time

import jax
import numpy as np
import pytest

from cbo_jax import cli
from cbo_jax.cli.flags import config_from_args
from cbo_jax.experiments import fedcbo_table1
from cbo_jax.experiments import federated as fx
from cbo_jax.federated import runner
from cbo_jax.federated.local import LocalSGDConfig

DATA = fx.RotatedMNISTConfig(source="bundled", agents=8, clusters=2, samples_per_agent=20)
RUN = fx.RunOptions(rounds=2, eval_every=1, test_size=50)
LOCAL = LocalSGDConfig(epochs=1, batch_size=10)


def _cfg(name="fedavg"):
    return fx.comparison(DATA, LOCAL, RUN, fx.FedCBOConfig(M=3, eval_chunk=4), algorithms=(name,))[name]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A finished two-round FedAvg run without a checkpoint, its algorithm, data and config."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cfg = dataclasses.replace(_cfg(), data=fx.resolve_data(_cfg().data))
    res = fx.run_experiment(cfg, out, progress=False)
    data = fx.load_data(cfg.data)
    _, algorithm = fx.build(cfg, data.num_agents)
    return out, res, algorithm, data, cfg


def test_finished_reads_back_exactly_this_run(done, tmp_path):
    out, res, algorithm, data, cfg = done
    key, record = jax.random.key(0), {**fx.cfgs.to_dict(cfg), "model": runner.model_record(algorithm.model)}
    back = runner.finished(out, algorithm, data, 2, key, every=1, config=record)
    assert back is not None and back.state is None
    assert back.history == json.loads(json.dumps(res.history)) and back.summary["final_test_acc"] == res.summary[
        "final_test_acc"]
    # any other run: None (another key, rounds, every, config record, data)
    assert runner.finished(out, algorithm, data, 2, jax.random.key(1), every=1, config=record) is None
    assert runner.finished(out, algorithm, data, 3, key, every=1, config=record) is None
    assert runner.finished(out, algorithm, data, 2, key, every=2, config=record) is None
    other = json.loads(json.dumps(record))
    other["run"]["test_size"] = 100
    assert runner.finished(out, algorithm, data, 2, key, every=1, config=other) is None
    x = np.array(data.x)
    x[0, 0] = 255 - x[0, 0]
    changed = data._replace(x=x)
    assert runner.finished(out, algorithm, changed, 2, key, every=1, config=record) is None


@pytest.mark.parametrize("damage", ["no summary", "one row", "rows out of order", "summary of fewer rounds"])
def test_an_unfinished_or_damaged_run_is_not_read_back(done, tmp_path, damage):
    out, _, algorithm, data, cfg = done
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    rows = (copy / "metrics.jsonl").read_text().splitlines()
    if damage == "no summary":  # killed after its last row, before the summary (written last)
        (copy / "summary.json").unlink()
    elif damage == "one row":
        (copy / "metrics.jsonl").write_text(rows[0] + "\n")
    elif damage == "rows out of order":
        (copy / "metrics.jsonl").write_text("\n".join(rows[::-1]) + "\n")
    else:
        s = json.loads((copy / "summary.json").read_text())
        s["rounds"] = 1
        (copy / "summary.json").write_text(json.dumps(s))
    assert runner.finished(copy, algorithm, data, 2, jax.random.key(0), every=1,
                           config=fx.cfgs.to_dict(cfg)) is None


def test_run_resume_of_a_finished_run_without_checkpoint_reads_it_back(done, tmp_path, monkeypatch, capsys):
    """``cbo-jax run --resume`` of a finished run that saved no checkpoint ran it again from round 0."""
    import shutil

    out, res, *_ = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    monkeypatch.setattr(fx, "run", lambda *a, **k: pytest.fail("a finished run ran again"))
    back = fx.run_experiment(_cfg(), copy, progress=False, resume=True)
    assert back.history == json.loads(json.dumps(res.history))
    assert "finished earlier, its results read back" in capsys.readouterr().out


def test_config_json_names_the_model_and_an_earlier_record_without_it_is_read_back(done, tmp_path, monkeypatch,
                                                                                 capsys):
    """``cbo-jax run``'s config.json named every option but not the model it trained (MLP
    784-200-10); it now does, a rerun from it accepts the record, and a results directory
    written before (no "model") is still this finished run."""
    import shutil

    out, res, algorithm, *_ = done
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["model"] == {"name": "mlp-784-200-10", "num_classes": 10, "loss": "cross_entropy",
                                 "parameters": 784 * 200 + 200 + 200 * 10 + 10}
    copy = tmp_path / "earlier"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    (copy / "config.json").write_text(json.dumps({k: v for k, v in recorded.items() if k != "model"}))
    monkeypatch.setattr(fx, "run", lambda *a, **k: pytest.fail("a finished run ran again"))
    back = fx.run_experiment(_cfg(), copy, progress=False, resume=True)
    assert back.history == json.loads(json.dumps(res.history))
    # config.json is a --config file: its model record is checked, not an unknown option
    parser = cli.build_parser()
    args = parser.parse_args(["run", "fedavg", "--config", str(out / "config.json")])
    assert fx.cfgs.to_dict(config_from_args("fedavg", args, args.run_flags)) == {
        k: v for k, v in recorded.items() if k != "model"}
    other = dict(recorded, model=dict(recorded["model"], name="cnn-emnist-47", num_classes=47))
    (tmp_path / "other.json").write_text(json.dumps(other))
    args = parser.parse_args(["run", "fedavg", "--config", str(tmp_path / "other.json")])
    with pytest.raises(ValueError, match=r"records the model 'cnn-emnist-47' \(name='cnn-emnist-47', num_classes=47\); "
                                         r"`cbo-jax run` trains 'mlp-784-200-10' \(name='mlp-784-200-10', "
                                         r"num_classes=10\): remove \"model\""):
        config_from_args("fedavg", args, args.run_flags)
    (tmp_path / "bad.json").write_text(json.dumps(dict(recorded, model="mlp")))
    args = parser.parse_args(["run", "fedavg", "--config", str(tmp_path / "bad.json")])
    with pytest.raises(ValueError, match="model is the record of the model trained, an object with its \"name\""):
        config_from_args("fedavg", args, args.run_flags)


def _args(out, resume=False):
    return argparse.Namespace(output=out, no_progress=True, resume=resume, checkpoint_every=None)


@pytest.mark.slow
def test_a_sweep_stopped_part_way_resumes_reading_back_the_finished_runs(tmp_path, monkeypatch):
    """The reproductions' sweep over methods and seeds: a Ctrl-C in the second run, then
    --resume: the first run is read back, the second runs, the results are the uninterrupted ones."""
    variants = fx.comparison(DATA, LOCAL, RUN, fx.FedCBOConfig(M=3, eval_chunk=4), algorithms=("fedavg", "local"))
    whole = fedcbo_table1._sweep(variants, 1, _args(tmp_path / "whole"))

    real, calls = fx.run, []

    def stop_in_local(algorithm, *a, **k):
        calls.append(algorithm.name)
        if algorithm.name == "local" and len(calls) == 2:
            raise KeyboardInterrupt
        return real(algorithm, *a, **k)

    monkeypatch.setattr(fx, "run", stop_in_local)
    with pytest.raises(KeyboardInterrupt):
        fedcbo_table1._sweep(variants, 1, _args(tmp_path / "part"))
    resumed = fedcbo_table1._sweep(variants, 1, _args(tmp_path / "part", resume=True))
    assert calls == ["fedavg", "local", "local"]  # fedavg was read back
    for name in ("fedavg", "local"):
        for key in ("final_test_acc", "final_train_loss", "fingerprint"):
            assert resumed[name][0][key] == whole[name][0][key], (name, key)


def test_reproduce_resume_and_checkpoint_every_reach_the_reproduction(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake(args):
        seen.update(resume=args.resume, checkpoint_every=args.checkpoint_every)
        (args.output / "fedcbo").mkdir(exist_ok=True)
        return {"experiment": "fedcbo-table1"}

    monkeypatch.setattr(fedcbo_table1, "TABLE1", dataclasses.replace(fedcbo_table1.TABLE1, run=fake))
    out = tmp_path / "t1"
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out), "--checkpoint-every", "5"]) == 0
    assert seen == {"resume": False, "checkpoint_every": 5}
    # a second reproduction into it: refused, suggesting --resume; with --resume it goes on
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out)]) == 2
    assert "resume them (--resume; resume=True)" in capsys.readouterr().err
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out), "--resume"]) == 0
    assert seen["resume"] is True
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out), "--resume", "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_reproduce_resume_refuses_other_options_by_the_reproductions_flags(tmp_path, monkeypatch, capsys):
    """The runs' own refusal named ``cbo-jax run``'s flags and derived fields (--eval-every)
    and suggested --extend, which reproduce does not have; options.json names its own."""
    monkeypatch.setattr(fedcbo_table1, "TABLE1", dataclasses.replace(
        fedcbo_table1.TABLE1, run=lambda args: {"experiment": "fedcbo-table1"}))
    out = tmp_path / "t1"
    base = ["reproduce", "fedcbo-table1", "--output", str(out), "--rounds", "2"]
    assert cli.main(base) == 0
    assert json.loads((out / "options.json").read_text())["rounds"] == 2
    capsys.readouterr()
    assert cli.main([*base, "--resume", "--preset", "reference-script", "--scale", "paper"]) == 2
    err = capsys.readouterr().err
    assert "it was started with other options" in err
    assert f"--preset: 'paper' in {out / 'options.json'}, 'reference-script' now" in err
    assert "--scale: 'small'" in err and "--rounds" not in err
    # how it runs may change, --seeds (each seed's runs are read back or run) and where the data is read
    assert cli.main([*base, "--resume", "--seeds", "5", "--checkpoint-every", "1", "--no-progress",
                     "--data-dir", str(tmp_path)]) == 0
    # fedcbo-noise takes the same options: its resume in table 1's directory is refused
    assert cli.main(["reproduce", "fedcbo-noise", "--output", str(out), "--rounds", "2", "--resume"]) == 2
    assert "it holds the reproduction 'fedcbo-table1'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["fedcbo-noise", "fedcb2o-attack", "fedcb2o-tg"])
def test_the_federated_reproductions_take_resume(name):
    ns = cli.build_parser().parse_args(["reproduce", name, "--resume", "--checkpoint-every", "3"])
    assert ns.resume is True and ns.checkpoint_every == 3


@pytest.mark.parametrize("name", ["meanfield-decay", "rastrigin-success", "fedsgld-synthetic"])
def test_reproductions_that_cannot_resume_have_no_resume_flag(name, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["reproduce", name, "--resume"])
    assert "unrecognized arguments: --resume" in capsys.readouterr().err


def test_sigterm_stops_the_command_like_ctrl_c(monkeypatch, capsys):
    """SIGTERM (a scheduler's stop, a notebook host's shutdown) killed the process with no
    message and no ``finally``: now one line, exit status 143, the run's files closed."""
    closed = []

    def terminated(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        finally:
            closed.append(True)
        return 0

    import threading

    if threading.current_thread() is not threading.main_thread():  # no handler there: the signal would kill us
        pytest.skip("signal handlers are set on the main thread only")
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "_cmd_run", terminated)
    assert cli.main(["run", "fedcbo", "--no-progress"]) == 143
    assert closed == [True]
    assert capsys.readouterr().err.strip().splitlines() == [
        "cbo-jax: terminated (SIGTERM) (a run with --checkpoint-every resumes with --resume)"]
    assert signal.getsignal(signal.SIGTERM) is before  # restored after the command


def test_a_finished_run_with_checkpoints_is_read_back_whatever_its_checkpointing(tmp_path, monkeypatch):
    """It was restored from its last checkpoint and its summary rewritten with the seconds of
    the resume; and a resume that adds or changes --checkpoint-every ran a finished run again."""
    out = tmp_path / "run"
    first = fx.run_experiment(fx.replace(_cfg(), **{"run.checkpoint_every": 1}), out, progress=False)
    summary = (out / "summary.json").read_text()
    monkeypatch.setattr(fx, "run", lambda *a, **k: pytest.fail("a finished run ran again"))
    for every in (1, 2, None):
        back = fx.run_experiment(fx.replace(_cfg(), **{"run.checkpoint_every": every}), out, progress=False,
                                 resume=True)
        assert back.history == json.loads(json.dumps(first.history))
    assert (out / "summary.json").read_text() == summary


def test_a_reproduction_that_fails_before_any_run_leaves_no_record(tmp_path, monkeypatch, capsys):
    """Its options.json alone made the corrected command a refused "resume" of nothing."""
    def bad_data(args):
        raise ValueError("no MNIST in --data-dir")

    monkeypatch.setattr(fedcbo_table1, "TABLE1", dataclasses.replace(fedcbo_table1.TABLE1, run=bad_data))
    out = tmp_path / "t1"
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out), "--data-dir", "/nowhere"]) == 2
    assert "no MNIST" in capsys.readouterr().err and not (out / "options.json").exists()
    monkeypatch.setattr(fedcbo_table1, "TABLE1", dataclasses.replace(
        fedcbo_table1.TABLE1, run=lambda args: {"experiment": "fedcbo-table1"}))
    assert cli.main(["reproduce", "fedcbo-table1", "--output", str(out)]) == 0
