"""Fault tolerance of long runs and of the command line: interrupted, resumed and damaged results.

A user's long job is stopped (Ctrl-C, a kill, a full disk) and resumed, or its results
directory is damaged; what comes back is either the run it was or an error naming what
differs. The kill-and-resume equality of the rows is tests/federated/test_runner.py's.
"""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from cbo_jax import checkpoint, writer
from cbo_jax.cli import main

TINY = ["--source", "bundled", "--agents", "8", "--clusters", "2", "--samples-per-agent", "20", "--M", "3",
        "--epochs", "1", "--batch-size", "10", "--eval-every", "1", "--eval-chunk", "4", "--no-progress"]


def _run(out, *flags):
    return main(["run", "fedcbo", *TINY, "--output", str(out), *flags])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-round run, checkpointed every round, with test_size 50."""
    out = tmp_path_factory.mktemp("faults") / "run"
    assert _run(out, "--rounds", "2", "--checkpoint-every", "1", "--test-size", "50") == 0
    return out


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.parametrize("flags,named", [
    # measured on another test set than the rows already written: went on silently
    (["--rounds", "2", "--test-size", "100"], "--test-size: 50 in .*config.json, 100 now"),
    # were named by the fingerprint's fields "key" and "data_sha256" (a hash), not by the flag
    (["--rounds", "2", "--test-size", "50", "--seed", "1"], "--seed: 0 in .*config.json, 1 now"),
    (["--rounds", "2", "--test-size", "50", "--data.seed", "3"], "--data.seed: 0 in .*config.json, 3 now"),
    (["--rounds", "3", "--test-size", "50"], r"\(--extend allows more rounds\):\n  --rounds: 2 in"),
])
def test_a_resume_with_other_options_is_refused_naming_the_flag(finished, tmp_path, capsys, flags, named):
    out = _copy(finished, tmp_path / "run")
    rows = (out / "metrics.jsonl").read_text()
    assert _run(out, "--resume", *flags) == 2
    err = capsys.readouterr().err
    assert f"cannot resume {out}: it holds another run" in err
    assert re.search(named, err), err
    assert (out / "metrics.jsonl").read_text() == rows  # nothing rewritten


def test_a_resume_may_change_how_it_checkpoints_and_extend_its_rounds(finished, tmp_path, capsys):
    out = _copy(finished, tmp_path / "run")
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert _run(out, "--resume", "--rounds", "2", "--test-size", "50", "--checkpoint-every", "2") == 0
    assert [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()] == rows
    assert _run(out, "--resume", "--extend", "--rounds", "3", "--test-size", "50", "--checkpoint-every", "1") == 0
    again = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in again] == [1, 2, 3] and again[:2] == rows
    capsys.readouterr()


def test_extend_without_resume_is_an_error_not_a_new_run(tmp_path, capsys):
    """--extend alone was ignored: a fresh run of the new length (over an empty directory, or refused later)."""
    out = tmp_path / "new"
    assert _run(out, "--extend", "--rounds", "3") == 2
    assert "--extend continues a run: it needs --resume" in capsys.readouterr().err
    assert not out.exists()


def test_resume_and_overwrite_together_is_an_error(finished, tmp_path, capsys):
    """--overwrite was ignored under --resume: the user asked to replace the results and they were continued."""
    out = _copy(finished, tmp_path / "run")
    assert _run(out, "--resume", "--overwrite", "--rounds", "2", "--test-size", "50") == 2
    assert "give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("name,flags,named", [
    ("meanfield-scaling", ["--sizes", "10,inf"], "--sizes takes whole numbers such as 1000 or 1e3, got 'inf'"),
    ("meanfield-coupling", ["--sizes", "10,20.5"], "--sizes takes whole numbers such as 1000 or 1e3, got '20.5'"),
    ("meanfield-coupling", ["--sizes", "10,20", "--reference", "nan"], "--reference takes whole numbers"),
    ("meanfield-scaling", ["--sizes", "10,abc"], "--sizes takes whole numbers such as 1000 or 1e3, got 'abc'"),
])
def test_particle_counts_are_whole_numbers_named_by_flag(tmp_path, capsys, name, flags, named):
    """inf was an OverflowError traceback; 20.5 ran as 20; abc and nan were errors naming no option."""
    assert main(["reproduce", name, *flags, "--steps", "2", "--output", str(tmp_path / "r"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(f"cbo-jax: error: {named}")


def test_a_corrupt_latest_checkpoint_names_the_step_to_fall_back_to(finished, tmp_path, capsys):
    """The resume reads the checkpoint's metadata first; its error named no earlier step and no way back."""
    out = _copy(finished, tmp_path / "run")
    meta = out / "checkpoint" / "2" / "meta" / "metadata"
    meta.write_bytes(meta.read_bytes()[:-3])
    # a resume that needs the checkpoint (a finished run is read back without one): one round more
    more = ("--resume", "--extend", "--rounds", "3", "--test-size", "50")
    assert _run(out, *more) == 2
    err = capsys.readouterr().err
    step = out.absolute() / "checkpoint" / "2"
    assert "step 2 is corrupt" in err and f"earlier steps: [1] (delete {step} to use step 1)" in err
    shutil.rmtree(step)  # what the message says: the run resumes from step 1 and redoes round 2 as it was
    rows = (finished / "metrics.jsonl").read_text().splitlines()
    assert _run(out, *more) == 0
    strip = [{k: v for k, v in json.loads(r).items() if k != "elapsed_s"} for r in rows]
    assert [{k: v for k, v in json.loads(r).items() if k != "elapsed_s"}
            for r in (out / "metrics.jsonl").read_text().splitlines()][:2] == strip
    capsys.readouterr()


def test_a_checkpoint_path_that_is_a_file_is_not_an_absent_checkpoint(finished, tmp_path, capsys):
    """A file in the checkpoint directory's place counted as no checkpoint: the resume started again from
    round 0, rewrote metrics.jsonl without the finished rows, and failed at its first checkpoint."""
    out = _copy(finished, tmp_path / "run")
    shutil.rmtree(out / "checkpoint")
    (out / "checkpoint").write_text("not a checkpoint")
    rows = (out / "metrics.jsonl").read_text()
    assert _run(out, "--resume", "--extend", "--rounds", "3", "--test-size", "50", "--checkpoint-every", "1") == 2
    assert f"{(out / 'checkpoint').absolute()} is a file, not a checkpoint directory" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == rows


def test_read_meta_and_restore_give_the_same_fallback(tmp_path):
    path = tmp_path / "ck"
    for step in (1, 2):
        checkpoint.save(path, {"x": np.arange(3.0) + step}, step=step)
    target = next(p for p in (path / "2" / "state").rglob("*") if p.is_file() and p.stat().st_size > 8)
    target.write_bytes(b"\0" + target.read_bytes()[1:])
    for call in (lambda: checkpoint.read_meta(path), lambda: checkpoint.restore(path, {"x": np.zeros(3)})):
        with pytest.raises(checkpoint.CheckpointError, match=r"earlier steps: \[1\] \(delete .*2 to use step 1\)"):
            call()
    # an explicitly requested first step has no earlier one to name
    state, _ = checkpoint.restore(path, {"x": np.zeros(3)}, step=1)
    np.testing.assert_array_equal(state["x"], np.arange(3.0) + 1)


def _disk_full_after(monkeypatch, nbytes):
    """The atomic writes' new file gets ``nbytes`` bytes, then the write fails as a full disk does."""
    real = writer._write_new

    def write_new(path, data):
        real(path, data[:nbytes])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_write_new", write_new)


def test_a_resume_that_fails_rewriting_the_rows_keeps_them(tmp_path, monkeypatch):
    """A resumed run rewrites metrics.jsonl with the rows up to its checkpoint; cut short in place
    (a kill, a full disk), the file lost the rows and the run could not be resumed again."""
    rows = [{"round": r, "loss": 1.0 / r} for r in range(1, 6)]
    with writer.MetricsWriter(tmp_path, keep=rows):
        pass
    before = (tmp_path / "metrics.jsonl").read_text()
    _disk_full_after(monkeypatch, 10)
    with pytest.raises(OSError, match="No space"):
        writer.MetricsWriter(tmp_path, keep=rows[:3])
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary file left


def test_damaged_rows_are_named_on_resume(tmp_path):
    """A metrics.jsonl with bytes that are not text failed the resume with "'utf-8' codec can't decode byte 0xff
    in position 20", naming no file."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"round": 1}\n{"round"\xff: 2}\n{"round": 3}\n')
    with pytest.raises(ValueError, match=f"{re.escape(str(path))} is damaged"):
        writer.read_jsonl(path)


def test_a_summary_rewrite_that_fails_keeps_the_old_summary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    writer.write_summary(path, {"final_test_acc": 91.5})
    before = path.read_text()
    _disk_full_after(monkeypatch, 5)
    with pytest.raises(OSError, match="No space"):
        writer.write_summary(path, {"final_test_acc": 92.0})
    monkeypatch.undo()
    assert path.read_text() == before and json.loads(before)["final_test_acc"] == 91.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_report_survives_damaged_files(tmp_path, capsys):
    """A metrics.jsonl with undecodable bytes stopped the whole report ('utf-8' codec can't decode, no file
    named); an environment block with a number where text was expected was an AttributeError traceback."""
    good, bad = tmp_path / "a", tmp_path / "b"
    good.mkdir(), bad.mkdir()
    (good / "metrics.jsonl").write_text('{"round": 1, "acc": 1.0}\n{"round": 2, "acc": 2.0}\n')
    (good / "summary.json").write_text(json.dumps({"final_acc": 2.0, "environment": {"backend": 5, "jax": "0.7"}}))
    (bad / "metrics.jsonl").write_bytes(b'{"round": 1, "acc": 0.5}\n\xff\xfe\x00garbage\n{"round": 2, "acc": 0.7}\n')
    (bad / "summary.json").write_text(json.dumps({"final_acc": 0.7}))
    (bad / "plots.png").mkdir()  # a directory with an image's name: was an IsADirectoryError traceback
    (bad / "gone.png").symlink_to(tmp_path / "deleted.png")
    assert main(["report", str(tmp_path), "--format", "md", "-o", str(tmp_path / "r.md")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "Produced by JAX 0.7; 5." in text and "| run | final_acc |" in text
    assert "curves from metrics.jsonl" in text


@pytest.mark.parametrize("command", [
    ["optimize", "--dim", "2", "--particles", "5", "--steps", "1", "--no-progress"],
    ["report"],
])
def test_an_output_that_is_a_file_is_named(tmp_path, capsys, command):
    """The error was the OS's bare "File exists" for a directory that is a file."""
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory")
    flag = ["--output", str(blocker)] if command[0] == "optimize" else [str(tmp_path), "-o", str(blocker / "r.html")]
    assert main([*command, *flag]) == 2
    assert f"{blocker} is a file, not a directory" in capsys.readouterr().err


def test_ctrl_c_while_starting_is_one_line(monkeypatch, capsys):
    """Ctrl-C while the command imports JAX and builds its parser was a traceback through the imports."""
    from cbo_jax import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        status = cli.main(["run", "fedcbo"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while starting escaped cli.main as a traceback")
    assert status == 130
    assert capsys.readouterr().err.strip().splitlines() == ["cbo-jax: interrupted"]


def test_ctrl_c_during_a_run_names_resume(monkeypatch, capsys):
    from cbo_jax import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_run", interrupted)
    assert cli.main(["run", "fedcbo", "--no-progress"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "cbo-jax: interrupted (a run with --checkpoint-every resumes with --resume)"]


def test_a_checkpoint_directory_linked_to_a_scratch_disk(tmp_path):
    """A checkpoint/ linked elsewhere before the first run was refused as results; --overwrite then failed with
    shutil.rmtree's "Cannot call rmtree on a symbolic link" traceback."""
    from cbo_jax._results import ResultsDir

    scratch, out = tmp_path / "scratch", tmp_path / "out"
    scratch.mkdir(), out.mkdir()
    (out / "checkpoint").symlink_to(scratch, target_is_directory=True)
    with ResultsDir(out):  # empty: no results yet
        checkpoint.save(out / "checkpoint", {"x": np.zeros(2)}, step=1)
        (out / "metrics.jsonl").write_text('{"round": 1}\n')
    with pytest.raises(ValueError, match=r"already holds results \(checkpoint/, metrics.jsonl\)"):
        ResultsDir(out).__enter__()
    with ResultsDir(out, overwrite=True):
        pass
    assert (out / "checkpoint").is_symlink() and scratch.is_dir() and not any(scratch.iterdir())
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoint"]


def test_the_demo_replaces_only_an_earlier_demo(finished, tmp_path, capsys):
    """`cbo-jax demo --output results` deleted the results of a `cbo-jax run fedcbo --output results/fedcbo`."""
    from cbo_jax.config import to_dict
    from cbo_jax.experiments import demo
    from cbo_jax.experiments.federated import comparison, replace, resolve_data

    out = tmp_path / "results"
    other = _copy(finished, out / "fedcbo")
    before = sorted(p.name for p in other.rglob("*"))
    assert main(["demo", "--rounds", "1", "--output", str(out), "--no-progress"]) == 2
    assert f"{other} holds the results of a run that is not a demo's" in capsys.readouterr().err
    assert sorted(p.name for p in other.rglob("*")) == before
    # an earlier demo's run (any seed, any rounds) is replaced as before, and so is a run killed at its start
    configs = comparison(demo.DATA, demo.LOCAL, demo.RUN, demo.FEDCBO)
    earlier = tmp_path / "demo"
    for algo, cfg in configs.items():
        (earlier / algo).mkdir(parents=True)
        cfg = dataclasses.replace(replace(cfg, **{"run.seed": 3, "run.rounds": 2}), data=resolve_data(cfg.data))
        (earlier / algo / "config.json").write_text(json.dumps(to_dict(cfg)))
    (earlier / "ifca" / "config.json").unlink()
    demo._check_replaceable(earlier, configs)
    # a demo recorded before data.dataset and data.model existed (MNIST and its MLP) is a demo's
    old = json.loads((earlier / "fedcbo" / "config.json").read_text())
    old["data"] = {k: v for k, v in old["data"].items() if k not in ("dataset", "model")}
    (earlier / "fedcbo" / "config.json").write_text(json.dumps(old))
    demo._check_replaceable(earlier, configs)
    old["data"]["agents"] += 1  # another data set is not
    (earlier / "fedcbo" / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="not a demo's"):
        demo._check_replaceable(earlier, configs)


def test_rows_without_rounds_are_refused_on_resume(finished, tmp_path, capsys):
    """A particle run's rows (``optimize --overwrite`` into a run's directory) were a KeyError traceback."""
    out = _copy(finished, tmp_path / "run")
    (out / "metrics.jsonl").write_text('{"step": 1, "best_energy": 0.5}\n')
    assert _run(out, "--resume", "--rounds", "2", "--test-size", "50") == 2
    assert "holds rows without a round (not a federated run's)" in capsys.readouterr().err


def test_a_resume_without_checkpoints_says_it_starts_again(finished, tmp_path, capsys):
    """A run that saved no checkpoint starts again from round 0 on --resume, replacing its rows: it said nothing."""
    out = _copy(finished, tmp_path / "run")
    shutil.rmtree(out / "checkpoint")
    rows = (out / "metrics.jsonl").read_text().splitlines()
    with pytest.warns(UserWarning, match=r"holds 2 rows but no checkpoint .* starts again from round 0"):
        assert _run(out, "--resume", "--extend", "--rounds", "3", "--test-size", "50") == 0
    strip = lambda lines: [{k: v for k, v in json.loads(r).items() if k != "elapsed_s"} for r in lines]  # noqa: E731
    again = strip((out / "metrics.jsonl").read_text().splitlines())
    assert [r["round"] for r in again] == [1, 2, 3]
    # rounds 1-2 of the 3-round run: the same training; the 2-round run also evaluated at round 2 (its last)
    assert [{k: v for k, v in r.items() if not k.startswith("test_")} for r in again[:2]] == [
        {k: v for k, v in r.items() if not k.startswith("test_")} for r in strip(rows)]
    capsys.readouterr()


def test_a_dangling_checkpoint_link_is_not_an_absent_checkpoint(finished, tmp_path, capsys):
    """A checkpoint/ linked to a scratch disk that is not mounted counted as no checkpoint: the resume
    started again from round 0 over the finished rows."""
    out = _copy(finished, tmp_path / "run")
    shutil.rmtree(out / "checkpoint")
    (out / "checkpoint").symlink_to(tmp_path / "unmounted" / "ckpt", target_is_directory=True)
    rows = (out / "metrics.jsonl").read_text()
    assert _run(out, "--resume", "--extend", "--rounds", "3", "--test-size", "50") == 2
    assert "which does not exist (a disk not mounted?)" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == rows


def test_elapsed_time_goes_on_across_a_resume(finished, tmp_path, capsys):
    """``elapsed_s`` (and the summary's ``seconds``) restarted from 0 in a resumed process, so
    the time curve of a resumed run went backwards; it goes on from the kept rounds' time."""
    out = _copy(finished, tmp_path / "run")
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["elapsed_s"] = 1000.0  # as if the first two rounds had taken 1000 s
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _run(out, "--resume", "--extend", "--rounds", "3", "--test-size", "50", "--checkpoint-every", "1") == 0
    again = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert again[1]["elapsed_s"] == 1000.0 and 1000.0 < again[2]["elapsed_s"] < 1000.0 + 600
    assert json.loads((out / "summary.json").read_text())["seconds"] >= again[2]["elapsed_s"]
    capsys.readouterr()


def test_an_overwrite_into_another_kind_of_run_is_refused(finished, tmp_path, capsys):
    """`cbo-jax optimize --overwrite` into a federated run's directory removed only its own kind of
    files: fingerprint.json and metrics.png stayed beside the new run, and a report showed both."""
    out = _copy(finished, tmp_path / "mixed")
    assert main(["optimize", "--dim", "2", "--steps", "2", "--particles", "10", "--no-progress", "--output", str(out),
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds the results of another kind of run as well (checkpoint/, fingerprint.json, metrics.png" in err
    assert (out / "summary.json").read_text() == (finished / "summary.json").read_text()  # nothing removed
    # the same kind of run is overwritten as before
    again = _copy(finished, tmp_path / "again")
    assert _run(again, "--rounds", "1", "--test-size", "50", "--overwrite") == 0
    assert not (again / "checkpoint").exists() and json.loads((again / "summary.json").read_text())["rounds"] == 1
