"""Results directories that others can write to, and full disks (issue 57, items 3-5 and 8).

A results directory may be shared with colleagues: a symbolic link planted in place of a
file cbo_jax writes (``.lock``, ``metrics.png``, ``summary.json``, ...) made a run write,
truncate or delete the link's target, outside the directory. Nothing cbo_jax writes,
renames or deletes follows such a link: it is refused, naming it. A ``checkpoint/`` linked
to a directory (a scratch disk) stays supported, and ``--overwrite`` removes only the
checkpoints there. A full disk is one line naming the path and the space, exit status 2,
and the run resumes to the numbers of an uninterrupted one.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cbo_jax import checkpoint, writer
from cbo_jax._results import ResultsDir
from cbo_jax.cli import main

TINY = ["--source", "bundled", "--agents", "8", "--clusters", "2", "--samples-per-agent", "20", "--M", "3",
        "--epochs", "1", "--batch-size", "10", "--eval-every", "1", "--eval-chunk", "4", "--test-size", "50",
        "--no-progress"]
OPTIMIZE = ["optimize", "--dim", "2", "--particles", "5", "--steps", "1", "--no-progress"]
LINK = "is a symbolic link; cbo_jax does not write through links in a results directory; remove it"


def _run(out, *flags):
    return main(["run", "fedcbo", *TINY, "--output", str(out), *flags])


def _rows(out):
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-round run, checkpointed every round."""
    out = tmp_path_factory.mktemp("safety") / "run"
    assert _run(out, "--rounds", "2", "--checkpoint-every", "1") == 0
    return out


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"), symlinks=True)
    return dst


def _victim(tmp_path, name="precious.txt"):
    victim = tmp_path / name
    victim.write_text("a colleague's file\n")
    return victim


def _one_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- 3. the lock -----------------------------------------------------------------------------------------------

def test_a_lock_file_link_is_refused_and_its_target_kept(tmp_path, capsys):
    """``ln -s ~/f out/.lock``, then any run into out: ~/f was truncated and overwritten with a pid."""
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    assert main([*OPTIMIZE, "--output", str(out)]) == 2
    assert _one_line(capsys) == f"cbo-jax: error: {out / '.lock'} {LINK}"
    assert victim.read_text() == "a colleague's file\n"
    # a link to nothing yet: the run created its target (outside the directory)
    other = tmp_path / "other"
    other.mkdir()
    (other / ".lock").symlink_to(tmp_path / "created")
    with pytest.raises(ValueError, match=LINK):
        ResultsDir(other).__enter__()
    assert not (tmp_path / "created").exists() and (other / ".lock").is_symlink()


# --- 4. a plot, and every other file a run writes ----------------------------------------------------------------

def test_a_plot_link_is_refused_on_resume(finished, tmp_path, capsys):
    """A metrics.png link: a resumed run wrote the PNG through it, overwriting the target."""
    victim, out = _victim(tmp_path), _copy(finished, tmp_path / "run")
    (out / "metrics.png").unlink()
    (out / "metrics.png").symlink_to(victim)
    assert _run(out, "--resume", "--extend", "--rounds", "3", "--checkpoint-every", "1") == 2
    assert _one_line(capsys) == f"cbo-jax: error: {out / 'metrics.png'} {LINK}"
    assert victim.read_text() == "a colleague's file\n"


def test_a_link_planted_while_a_run_writes_is_not_written_through(tmp_path):
    """The writers themselves refuse a link (one planted after the run started), the atomic
    writes' temporary files included."""
    from cbo_jax import _plotting
    from cbo_jax.federated.runner import plot_history

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.png").symlink_to(victim)
    with pytest.raises(ValueError, match=LINK):
        plot_history([{"round": 1, "loss": 1.0}, {"round": 2, "loss": 0.5}], out / "metrics.png")
    fig, ax = _plotting.subplots()
    ax.plot([0, 1])
    with pytest.raises(ValueError, match=LINK):
        fig.savefig(out / "metrics.png")
    (out / "summary.json").symlink_to(victim)
    with pytest.raises(ValueError, match=LINK):
        writer.write_summary(out / "summary.json", {"x": 1})
    # the temporary file an atomic write goes through: written through, then renamed over summary.json
    (out / f".config.json.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(ValueError, match=LINK):
        writer.replace_text(out / "config.json", "{}\n")
    w = writer.MetricsWriter(out)
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(ValueError, match=LINK):
        w.write({"round": 1})
    assert victim.read_text() == "a colleague's file\n"
    assert not (out / "config.json").exists()


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "config.json", "fingerprint.json", "metrics.png",
                                  "history.npz", "options.json", "events.out.tfevents.1.host"])
@pytest.mark.parametrize("how", ["overwrite", "resume"])
def test_a_link_in_place_of_a_result_is_refused_before_the_run(tmp_path, name, how):
    """Refused when the run starts (not after hours of it): an overwrite removed the link and a
    resume wrote through it."""
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n') if name != "metrics.jsonl" else None
    (out / name).symlink_to(victim)
    with pytest.raises(ValueError, match=f"{out / name} {LINK}"):
        ResultsDir(out, **{how: True}).__enter__()
    assert (out / name).is_symlink() and victim.read_text() == "a colleague's file\n"
    # a dangling link: the first write creates its target
    (out / name).unlink()
    (out / name).symlink_to(tmp_path / "nothing-yet")
    with pytest.raises(ValueError, match=LINK):
        ResultsDir(out, **{how: True}).__enter__()


# --- 5. overwrite and a checkpoint/ linked to a scratch disk ------------------------------------------------------

def _scratch_with_others(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "other-project").mkdir(parents=True)
    (scratch / "notes.txt").write_text("keep me")
    (scratch / "other-project" / "data.bin").write_bytes(b"\0" * 10)
    (scratch / "42-results.csv").write_text("keep me too")
    return scratch


def test_overwrite_removes_only_the_checkpoints_of_a_linked_checkpoint_directory(tmp_path):
    """A checkpoint/ symlink plus --overwrite emptied the link's target completely, unrelated files included."""
    scratch, out = _scratch_with_others(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "checkpoint").symlink_to(scratch, target_is_directory=True)
    # unrelated files on the scratch disk are no results of this directory's
    with ResultsDir(out):
        for step in (1, 2):
            checkpoint.save(out / "checkpoint", {"x": np.zeros(2)}, step=step)
        (out / "metrics.jsonl").write_text('{"round": 1}\n')
    (scratch / "3.orbax-checkpoint-tmp").mkdir()  # a step a kill (or a full disk) left unfinished
    with pytest.raises(ValueError, match=r"already holds results \(checkpoint/, metrics.jsonl\)"):
        ResultsDir(out).__enter__()
    with ResultsDir(out, overwrite=True):
        pass
    assert (out / "checkpoint").is_symlink() and sorted(p.name for p in out.iterdir()) == [".lock", "checkpoint"]
    assert sorted(p.name for p in scratch.iterdir()) == ["42-results.csv", "notes.txt", "other-project"]
    assert (scratch / "notes.txt").read_text() == "keep me" and (scratch / "other-project" / "data.bin").is_file()


def test_overwrite_removes_only_the_checkpoints_of_a_checkpoint_directory(tmp_path):
    out = tmp_path / "out"
    with ResultsDir(out):
        checkpoint.save(out / "checkpoint", {"x": np.zeros(2)}, step=1)
    (out / "checkpoint" / "README").write_text("the user's own note")
    with ResultsDir(out, overwrite=True):
        pass
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["README"]
    shutil.rmtree(out / "checkpoint")  # nothing else in it: the directory goes too
    with ResultsDir(out):
        checkpoint.save(out / "checkpoint", {"x": np.zeros(2)}, step=1)
    with ResultsDir(out, overwrite=True):
        pass
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_directory_link_in_a_reproduction_directory_is_refused(tmp_path):
    """A reproduction owns its whole directory: an overwrite emptied a linked subdirectory's target."""
    scratch, out = _scratch_with_others(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "fedcbo").symlink_to(scratch, target_is_directory=True)
    with pytest.raises(ValueError, match=f"{out / 'fedcbo'} {LINK}"):
        ResultsDir(out, overwrite=True, owned=None).__enter__()
    assert sorted(p.name for p in scratch.iterdir()) == ["42-results.csv", "notes.txt", "other-project"]


# --- 8. a full disk --------------------------------------------------------------------------------------------

def test_a_full_disk_is_one_line_and_the_run_resumes(finished, tmp_path, monkeypatch, capsys):
    """A full disk was an ``OSError [Errno 28]`` traceback; the data is safe: the resume equals the
    uninterrupted run."""
    out = tmp_path / "run"
    real = writer.MetricsWriter.write

    def full_at_round_2(self, row):
        if row["round"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what write(2) gives: no file named
        real(self, row)

    monkeypatch.setattr(writer.MetricsWriter, "write", full_at_round_2)
    assert _run(out, "--rounds", "2", "--checkpoint-every", "1") == 2
    line = _one_line(capsys)
    assert line.startswith(f"cbo-jax: error: cannot write to {out}: No space left on device (")
    assert "free" in line and "--resume" in line
    monkeypatch.undo()
    assert _run(out, "--resume", "--rounds", "2", "--checkpoint-every", "1") == 0
    assert _rows(out) == _rows(finished)


def test_a_full_disk_in_a_write_names_the_file_and_the_space(tmp_path, monkeypatch, capsys):
    """The wrapped writes name the file and how much they were writing."""
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    path = tmp_path / "summary.json"
    monkeypatch.setattr(writer, "_write_new", lambda p, data: full(None), raising=False)
    with pytest.raises(OSError, match=rf"cannot write {path}: No space left on device \(it needs .*B, .*B free\)") \
            as err:
        writer.replace_text(path, "x" * 3000)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_full_disk_inside_orbax_is_one_error_naming_the_checkpoint(tmp_path, monkeypatch):
    """orbax's error for a full disk is tensorstore's RESOURCE_EXHAUSTED ValueError, after about
    100 lines of its threads' tracebacks."""
    real = checkpoint._manager

    class Full:
        def __init__(self, mgr):
            self.mgr = mgr

        def __enter__(self):
            self.mgr.__enter__()
            return self

        def __exit__(self, *exc):
            return self.mgr.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.mgr, name)

        def save(self, *args, **kwargs):
            raise ValueError('RESOURCE_EXHAUSTED: Error writing "x/0" in OCDBT database at local file "...": Failed '
                             'to write 2103031 bytes to file 15: No space left on device [os_error_code=\'28\']')

    path = tmp_path / "ck"
    checkpoint.save(path, {"x": np.arange(3.0)}, step=1)
    monkeypatch.setattr(checkpoint, "_manager", lambda *a, **k: Full(real(*a, **k)))
    with pytest.raises(OSError, match=rf"cannot write {path / '2'}: No space left on device") as err:
        checkpoint.save(path, {"x": np.arange(3.0)}, step=2)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert checkpoint.steps(path) == [1]


def _unshare_tmpfs():
    """A command prefix that runs in a mount namespace with a tiny tmpfs (no root needed), or None."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"], capture_output=True)
    return ["unshare", "--user", "--map-root-user", "--mount"] if probe.returncode == 0 else None


def test_a_real_full_disk_under_orbax_is_quiet(tmp_path):
    """A real full disk (a 600 kB tmpfs): orbax's threads printed ~100 lines of tracebacks (ending in
    "RuntimeError: Event loop is closed" or "cannot schedule new futures after interpreter
    shutdown"); now one error naming the step, nothing on standard error, and the steps before it
    intact."""
    prefix = _unshare_tmpfs()
    if prefix is None:
        pytest.skip("no unprivileged mount namespace here (unshare --user --mount) for a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = textwrap.dedent(f"""
        import errno, time
        import numpy as np
        from cbo_jax import checkpoint
        path = {str(disk / "ck")!r}
        state = lambda n: {{f"x{{i}}": np.arange(n, dtype=np.float32) + i for i in range(20)}}  # 20 writes at once
        for step in range(1, 20):  # 80 kB more each step, the last 2 kept: the 600 kB fill up soon
            try:
                checkpoint.save(path, state(1000 * step), step=step)
            except Exception as err:
                print("FULL", type(err).__name__, err)
                assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == f"{{path}}/{{step}}"
                break
        else:
            raise SystemExit("the disk never filled")
        assert checkpoint.steps(path) == [step - 2, step - 1], checkpoint.steps(path)
        got, _ = checkpoint.restore(path, state(1000 * (step - 1)))
        assert all((np.asarray(got[k]) == v).all() for k, v in state(1000 * (step - 1)).items())
        print("RESTORED", step - 1)
        time.sleep(1)  # the writes still under way when the save failed end now: their callbacks printed tracebacks
    """)
    cmd = [*prefix, "sh", "-c", f'mount -t tmpfs -o size=600k tmpfs "$1" && exec "$2" -c "$3"', "sh", str(disk),
           sys.executable, script]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FULL DiskFullError cannot write" in done.stdout and "No space left on device (it needs" in done.stdout
    assert "RESTORED" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "ERROR:absl" not in done.stderr, done.stderr[-3000:]
