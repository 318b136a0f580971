"""cbo-jax run / demo / federated reproductions: results directories, generated flags, bad input."""

import json
import struct

import pytest

from cbo_jax.cli import main

DATA = {"source": "bundled", "agents": 8, "clusters": 4, "samples_per_agent": 20}
TINY = {**DATA, "epochs": 1, "batch_size": 10, "M": 3, "rounds": 2, "eval_every": 1, "test_size": 100, "eval_chunk": 4}
TINY_BASELINE = {k: v for k, v in TINY.items() if k not in ("M", "eval_chunk")}


def _last_json(out):
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_run_fedcbo_writes_results_directory(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "res"
    assert main(["run", "fedcbo", "--config", str(cfg), "--alpha", "5", "--output", str(out), "--no-progress"]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["algorithm"] == "fedcbo" and summary["rounds"] == 2 and summary["num_clusters"] == 4
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all("sr" in r and "test_acc" in r for r in rows)
    assert summary["final_test_acc"] == rows[-1]["test_acc"] and summary["final_sr"] == rows[-1]["sr"]
    # the mean over agents of the per-cluster accuracies (equal cluster sizes) is the overall accuracy
    per = rows[-1]["test_acc_per_cluster"]
    assert sum(per) / len(per) == pytest.approx(rows[-1]["test_acc"], rel=1e-5)
    assert (out / "metrics.png").stat().st_size > 0
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["config"]["alpha"] == 5.0 and recorded["config"]["M"] == 3 and recorded["data"]["agents"] == 8
    # config.json is a valid --config file: the same run again (one round) from it
    again = tmp_path / "again"
    assert main(["run", "fedcbo", "--config", str(out / "config.json"), "--rounds", "1", "--output", str(again),
                 "--no-progress"]) == 0
    assert json.loads((again / "config.json").read_text())["config"] == recorded["config"]
    assert rows[0]["test_acc"] == json.loads((again / "metrics.jsonl").read_text())["test_acc"]


@pytest.mark.slow  # one tiny run; CI runs it in the slow step
def test_run_with_a_label_skew_partition(tmp_path, capsys):
    """``--data.partition dirichlet:0.5``: the agents hold unequal, label-skewed shares of their
    rotation's images; the run records the spec in config.json."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY_BASELINE))
    out = tmp_path / "res"
    assert main(["run", "fedavg", "--config", str(cfg), "--data.partition", "dirichlet:0.5", "--output", str(out),
                 "--no-progress"]) == 0
    assert _last_json(capsys.readouterr().out)["rounds"] == 2
    assert json.loads((out / "config.json").read_text())["data"]["partition"] == "dirichlet:0.5"
    assert main(["run", "fedavg", "--config", str(cfg), "--partition", "zipf:1", "--no-progress"]) != 0
    assert "unknown partition" in capsys.readouterr().err


def _idx_dir(path):
    from federated.test_mnist import _fake_dir  # tiny random IDX files (60 training, 20 test images)

    path.mkdir()
    return _fake_dir(path, n_train=60, n_test=20)


def test_run_records_the_mnist_it_resolved(tmp_path, monkeypatch, capsys):
    """config.json records source "auto" as what it read: idx with the absolute IDX directory, or
    bundled; a rerun from it reads the same data whatever CBO_JAX_DATA_DIR and the working directory,
    and fails naming the files when they are gone rather than falling back to the bundled subset.
    (The rounds are stubbed out.)"""
    import hashlib

    from cbo_jax.experiments import federated
    from cbo_jax.federated.runner import RunResult

    read = {}

    def fake_run(algorithm, data, rounds, key, *, out, config, **kw):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(config))
        read[out.name] = hashlib.sha256(data.x.tobytes()).hexdigest()
        return RunResult(None, [], {"algorithm": algorithm.name, "rounds": rounds, "num_agents": data.num_agents,
                                    "num_clusters": 4, "seconds": 0.0, "final_test_acc": 0.0})

    monkeypatch.setattr(federated, "run", fake_run)
    mnist_dir = _idx_dir(tmp_path / "mnist")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({**TINY_BASELINE, "source": "auto"}))
    monkeypatch.chdir(tmp_path)

    def run(config, out):
        return main(["run", "local", "--config", str(config), "--no-progress", "--output", str(tmp_path / out)])

    def recorded(out):
        return json.loads((tmp_path / out / "config.json").read_text())["data"]

    monkeypatch.setenv("CBO_JAX_DATA_DIR", "mnist")  # relative: recorded absolute
    assert run(cfg, "idx") == 0
    assert recorded("idx") == {**recorded("idx"), "source": "idx", "data_dir": str(mnist_dir)}
    monkeypatch.delenv("CBO_JAX_DATA_DIR")
    assert run(cfg, "bundled") == 0
    assert recorded("bundled") == {**recorded("bundled"), "source": "bundled", "data_dir": None}
    assert read["idx"] != read["bundled"]
    # reruns from config.json: elsewhere, without the variable (idx) or with it set (bundled): the same data
    monkeypatch.chdir(tmp_path / "idx")
    assert run(tmp_path / "idx" / "config.json", "idx_again") == 0
    monkeypatch.setenv("CBO_JAX_DATA_DIR", str(mnist_dir))
    assert run(tmp_path / "bundled" / "config.json", "bundled_again") == 0
    monkeypatch.delenv("CBO_JAX_DATA_DIR")
    for name in ("idx", "bundled"):
        assert recorded(f"{name}_again") == recorded(name) and read[f"{name}_again"] == read[name]
    # the files gone: the idx source's error naming them
    (mnist_dir / "train-images-idx3-ubyte.gz").unlink()
    capsys.readouterr()
    assert run(tmp_path / "idx" / "config.json", "gone") == 2
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte" in err and "gone" not in read
    assert "CBO_JAX_DATA_DIR" not in err  # the directory came from the config file
    # a directory that came from CBO_JAX_DATA_DIR: the error names the variable and the way out
    monkeypatch.setenv("CBO_JAX_DATA_DIR", str(mnist_dir))
    assert run(cfg, "from_env") == 2
    err = capsys.readouterr().err
    assert f"CBO_JAX_DATA_DIR={str(mnist_dir)!r} names this directory" in err and "--source bundled" in err
    monkeypatch.delenv("CBO_JAX_DATA_DIR")


def _read_events(path):
    """The scalars of a TensorBoard event file, parsed with tensorboardX's own protobuf."""
    from tensorboardX.proto import event_pb2

    raw, scalars, pos = path.read_bytes(), {}, 0
    while pos < len(raw):
        (length,) = struct.unpack("<Q", raw[pos:pos + 8])
        event = event_pb2.Event.FromString(raw[pos + 12:pos + 12 + length])
        pos += 12 + length + 4  # length, its crc, the record, its crc
        for v in event.summary.value:
            scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_tensorboard_event_files_read_back(tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    out = tmp_path / "tb"
    argv = ["run", "fedcbo", "--tensorboard", "--agents", "8", "--clusters", "2", "--M", "3", "--epochs", "1",
            "--samples-per-agent", "20", "--batch-size", "10", "--test-size", "50", "--eval-every", "1", "--source",
            "bundled", "--no-progress", "--rounds", "2", "--output", str(out)]
    assert main(argv) == 0
    files = sorted(out.glob("events.out.tfevents*"))
    assert files
    scalars = _read_events(files[0])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("test_acc", "sr", "train_loss", "selection_frequency/1/0", "test_acc_per_cluster/0"):
        assert [s for s, _ in scalars[key]] == [1, 2], key
    assert [v for _, v in scalars["test_acc"]] == pytest.approx([r["test_acc"] for r in rows], rel=1e-6)


def test_generated_flags_help_and_strict_parsing(capsys):
    with pytest.raises(SystemExit):
        main(["run", "fedcbo", "--help"])
    text = capsys.readouterr().out
    for flag in ("--local.lr", "--local.batch-size", "--data.agents", "--agents", "--epochs", "--M", "--eval-every",
                 "--tensorboard"):
        assert flag in text
    with pytest.raises(SystemExit):  # IFCA's k follows --clusters on the command line, and its help says so
        main(["run", "ifca", "--help"])
    k_help = " ".join(capsys.readouterr().out.split("\n  --k INT", 1)[1].split("\n\n", 1)[0].split())
    assert "(default: --clusters)" in k_help and "(default: 4)" not in k_help
    with pytest.raises(SystemExit):
        main(["reproduce", "fedcb2o-attack", "--help"])
    text = capsys.readouterr().out
    assert "--T-G" in text and "--include-self" in text and "--scale" in text
    # an option of another algorithm is not accepted
    with pytest.raises(SystemExit):
        main(["run", "fedavg", "--M", "5", "--no-progress"])
    assert "--M" in capsys.readouterr().err
    # booleans: true/false/yes/no/1/0, nothing else
    assert main(["run", "fedcbo", "--local.reset-optimizer", "nope", "--no-progress"]) == 2
    assert "--local.reset-optimizer: expected bool" in capsys.readouterr().err


@pytest.mark.parametrize(
    "algorithm,extra,match",
    [
        ("fedcbo", ["--M", "8"], "M="),
        ("fedcbo", ["--agents", "10"], "divisible"),
        ("ifca", ["--clusters", "3", "--agents", "9"], "rotation count"),
        ("fedcbo", ["--source", "idx", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir: not a directory"),
        ("fedcbo", ["--lr", "-1"], "lr must be > 0"),
        ("fedcbo", ["--rounds", "two"], "--rounds: expected int"),
        ("fedcbo", ["--rounds", "1_0"], "--rounds: expected int"),  # Python's int("1_0") is 10
        ("fedcbo", ["--eval-by", "download"], "eval_by must be one of"),
        ("fedcbo", ["--eval-by", "model", "--shard"], "a sharded run (--shard / mesh) needs eval_by='agent'"),
    ],
)
def test_run_bad_input_is_a_clear_error(tmp_path, capsys, algorithm, extra, match):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY if algorithm == "fedcbo" else TINY_BASELINE))
    rc = main(["run", algorithm, "--config", str(cfg), "--output", str(tmp_path / "r"), "--no-progress", *extra])
    assert rc == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize(
    "content,match",
    [
        ({**TINY_BASELINE, "learning_rate": 0.1}, "unknown option 'learning_rate'"),
        ({**TINY_BASELINE, "M": 3}, "unknown option 'M'"),  # a FedCBO option in a Local config
        ({**TINY_BASELINE, "lr": "0.1"}, "lr: expected float"),
        ({**TINY_BASELINE, "reset_optimizer": "no"}, "reset_optimizer: expected bool"),
        ([1, 2], "expected a JSON object"),
        ({**TINY_BASELINE, "data": 5}, "data is a section of options: it needs a JSON object"),
        ("{not json", "not valid JSON"),
        (b'{"lr": 0.1}\xff\xfe', "not a UTF-8 text file"),  # named no file ('utf-8' codec can't decode ...)
        # a short name and its section's name for one option: resolved by key order, without a word
        ({**TINY_BASELINE, "lr": 0.2, "config": {"local": {"lr": 0.3}}}, "config.local.lr is given twice"),
    ],
)
def test_config_file_errors_name_the_option(tmp_path, capsys, content, match):
    cfg = tmp_path / "cfg.json"
    if isinstance(content, bytes):
        cfg.write_bytes(content)
    else:
        cfg.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["run", "local", "--config", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert match in err and str(cfg) in err
    assert main(["run", "local", "--config", str(tmp_path / "missing.json"), "--no-progress"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_reproduce_list_has_fedcbo_entries(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fedcbo-table1" in out and "96.51" in out and "fedcbo-noise" in out


@pytest.mark.parametrize("name, flags, match", [
    ("fedcb2o-tg", ["--T-G", "5"], "--T-G"),
    ("fedcb2o-tg", ["--alpha-fedcbo", "5"], "--alpha-fedcbo"),
    ("fedcb2o-tg", ["--no-sensitivity"], "--no-sensitivity"),
    ("fedcb2o-attack", ["--dataset", "emnist", "--source", "idx"], "--source"),
    ("fedcb2o-tg", ["--dataset", "emnist", "--source", "bundled"], "--source"),
])
def test_fedcb2o_reproductions_refuse_flags_they_ignore(name, flags, match, tmp_path, monkeypatch, capsys):
    """``fedcb2o-tg`` accepted ``--T-G`` (it sweeps T_G), ``--alpha-fedcbo`` (it runs no FedCBO)
    and ``--no-sensitivity`` (it has no sensitivity rows) and ignored them; ``--dataset emnist``
    ignored ``--source`` (EMNIST is read with tensorflow-datasets). Each is now refused before
    any data is loaded."""
    from cbo_jax.experiments import fedcb2o_attack

    def loaded(args):
        raise AssertionError("data were loaded")

    monkeypatch.setattr(fedcb2o_attack, "_images", loaded)
    assert main(["reproduce", name, *flags, "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_config_that_is_a_directory_is_named_so(tmp_path, capsys):
    # was "--config DIR: no such file"
    assert main(["run", "local", "--config", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--config {tmp_path} is a directory, not a file" in err and "no such file" not in err


def test_elapsed_time_leaves_out_the_time_the_process_was_stopped(tmp_path, monkeypatch, capsys):
    """A run stopped (Ctrl-Z, SIGSTOP, a batch scheduler's suspend) and continued counted the stop
    in its ``elapsed_s`` and ``seconds`` (154 s against 87 s of work). Here the clock jumps
    1000 s before each scan of rounds, as over a stop that no heartbeat saw."""
    import time

    from cbo_jax.federated import runner

    real_clock, real_scan, jump = time.perf_counter, runner._scan_rounds, [0.0]

    def scan(*args, **kwargs):
        jump[0] += 1000.0
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + jump[0])
    monkeypatch.setattr(runner, "_scan_rounds", scan)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY_BASELINE))
    out = tmp_path / "r"
    assert main(["run", "local", "--config", str(cfg), "--output", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert jump[0] == 2000.0 and 0 < rows[0]["elapsed_s"] <= rows[1]["elapsed_s"] < 500
    assert rows[1]["elapsed_s"] - 0.01 <= json.loads((out / "summary.json").read_text())["seconds"] < 500


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGSTOP"), reason="POSIX signals")
def test_stopwatch_leaves_out_a_real_stop():
    """The clock of elapsed_s in a process stopped with SIGSTOP for 2.5 s and continued."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import cbo_jax

    path = Path(cbo_jax.__file__).parent / "runtime" / "progress.py"  # loaded alone: no JAX import in the child
    code = (f"import importlib.util, sys\nspec = importlib.util.spec_from_file_location('p', {str(path)!r})\n"
            "p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)\n"
            "clock = p.Stopwatch(offset=10.0)\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "print(clock(), flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        t0 = time.perf_counter()
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2.5)
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate("\n", timeout=60)
    finally:
        child.kill()
    assert time.perf_counter() - t0 >= 2.5 and 10.0 < float(out) < 11.0


def test_on_diverged_stop_ends_the_run_in_one_line(tmp_path, capsys):
    """``--on-diverged stop``: the first diverged agent ends the run with one line naming the
    round and the agents (exit status 1), its rows so far written; without it the run goes on and
    counts them (``diverged_agents``)."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({**TINY_BASELINE, "rounds": 3}))
    out = tmp_path / "stopped"
    assert main(["run", "local", "--config", str(cfg), "--local.lr", "1e30", "--on-diverged", "stop",
                 "--output", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cbo-jax: error: local, round 1: agents 0, 1,") and "on_diverged='stop'" in err, err
    assert len(err.splitlines()) == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1] and rows[0]["diverged_agents"] == 8
    assert not (out / "summary.json").exists()
    assert main(["run", "local", "--config", str(cfg), "--local.lr", "1e30", "--output", str(tmp_path / "went_on"),
                 "--no-progress"]) == 0
    assert _last_json(capsys.readouterr().out)["final_diverged_agents"] == 8
    assert main(["run", "local", "--config", str(cfg), "--on-diverged", "never", "--output", str(tmp_path / "no"),
                 "--no-progress"]) == 2
    assert "on_diverged must be one of ['stop', 'warn']" in capsys.readouterr().err
