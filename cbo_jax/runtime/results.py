"""Results directories that one run at a time owns.

:class:`ResultsDir` is entered before any work: it creates the directory (an unusable
path, such as one under a regular file or in /proc, is an error at once, not after the
simulation), takes an exclusive lock (a second run into the same directory fails at once
with the holder's pid; the lock is the kernel's, so a killed run never leaves a stale
one), and refuses a directory that already holds results unless the run resumes from
them or was asked to overwrite them (then exactly the files a run writes are removed).

A results directory may be one that others can write to (shared with colleagues). Nothing
cbo_jax writes, renames or deletes there follows a symbolic link out of it: a link in place
of a file a run writes (``.lock``, ``metrics.png``, ``summary.json``, ...) is refused when
the run starts, naming it, and the writers refuse one planted later (:func:`refuse_link`,
:func:`open_nofollow`). The one link kept is a ``checkpoint/`` linked to a directory
(checkpoints on a scratch disk); an overwrite removes only the checkpointer's step
directories there. A write that finds the disk or the quota full raises
:class:`DiskFullError` (an ``OSError``) naming the file and the space.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
from pathlib import Path

__all__ = ["ResultsDir", "RUN_FILES", "DiskFullError", "refuse_link", "open_nofollow", "full_disk"]

# What a federated run writes (and what overwrite removes).
RUN_FILES = ("metrics.jsonl", "summary.json", "config.json", "fingerprint.json", "metrics.png", "checkpoint",
             "events.out.tfevents.*")
_LOCK = ".lock"
# Files only a run of this package writes, by any command (a federated run, `cbo-jax optimize`):
# an overwrite that leaves another command's kind of them behind is refused (the directory would
# mix two runs, and a report would show both).
_ANY_RUN = ("fingerprint.json", "metrics.png", "history.npz", "checkpoint", "metrics.jsonl", "summary.json")


def _not_a_directory(path: Path) -> Path:
    """The first of ``path`` and its parents that exists but is not a directory (else ``path``)."""
    for p in (*reversed(path.parents), path):
        if p.exists() and not p.is_dir():
            return p
    return path


# Every other file a run of this package writes into a results directory: a link in place of one is refused too.
_WRITTEN = ("config.json", "options.json", "demo.json")
_CHECKPOINT = "checkpoint"
# What the checkpointer (orbax, cbo_jax.runtime.checkpoint) writes in a checkpoint directory: the step directories and
# the temporary ones of a step being written (``7.orbax-checkpoint-tmp``, ``7.orbax-checkpoint-tmp-1712345678``).
_STEP = re.compile(r"\d+(\.orbax-checkpoint-tmp(-\d+)?)?")
_LINK_REFUSED = "is a symbolic link; cbo_jax does not write through links in a results directory; remove it"


def refuse_link(path: str | Path) -> None:
    """Raise ``ValueError`` naming ``path`` when it is a symbolic link (to anything, or to nothing yet).

    A link planted in place of a file a run writes would make the run write, truncate or delete
    the link's target, outside the results directory."""
    if os.path.islink(path):
        raise ValueError(f"{path} {_LINK_REFUSED}")


def open_nofollow(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``: a file descriptor, never one of a link's target
    (a link, dangling or not, is refused with :func:`refuse_link`'s ``ValueError``)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if not nofollow:  # pragma: no cover - not POSIX: checked, then opened
        refuse_link(path)
    try:
        return os.open(path, flags | nofollow | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError:
        refuse_link(path)  # ELOOP (Linux), EMLINK (FreeBSD): a link; anything else re-raised unchanged
        raise


# A full disk (ENOSPC) or a full quota (EDQUOT)
FULL = frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def free_space(path: str | Path) -> int | None:
    """Bytes free (to this user) on the filesystem of ``path`` or of its nearest existing parent."""
    p = Path(path).absolute()
    for q in (p, *p.parents):
        try:
            return shutil.disk_usage(q).free
        except OSError:
            continue
    return None


def full_message(err: OSError, path: str | Path | None = None) -> str:
    """One line for a write that found the disk or the quota full: the path, what it needed, what is free."""
    where = err.filename if err.filename is not None else path
    needed = getattr(err, "needed", None)
    space = []
    if needed:
        space.append(f"it needs {_size(needed)}")
    free = free_space(where) if where is not None else None
    if free is not None:
        space.append(f"{_size(free)} free")
    detail = f" ({', '.join(space)})" if space else ""
    target = f"write {where}" if err.filename is not None else f"write to {where}" if where is not None else "write"
    return f"cannot {target}: {os.strerror(err.errno)}{detail}"


class DiskFullError(OSError):
    """A write that found the disk (``ENOSPC``) or the user's quota (``EDQUOT``) full.

    ``errno`` and ``filename`` are those of the write; ``needed`` the bytes it was writing
    (``None``: not known); the message is one line naming both and the space left."""

    def __init__(self, code: int, filename: str | Path, needed: int | None = None):
        super().__init__(code, os.strerror(code), str(filename))
        self.needed = needed

    def __str__(self) -> str:
        return full_message(self)


def full_errno(err: BaseException) -> int | None:
    """``ENOSPC`` or ``EDQUOT`` when ``err`` (or an exception it was raised from or during) is a full
    disk or quota: an ``OSError`` with that errno, or tensorstore's and orbax's ``ValueError`` saying
    so ("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']"); else ``None``."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in FULL:
            return err.errno
        for code in FULL:
            if os.strerror(code) in str(err) or f"os_error_code='{code}'" in str(err):
                return code
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def full_disk(path: str | Path, needed: int | None = None):
    """A full disk or quota inside becomes :class:`DiskFullError` naming ``path`` and ``needed`` bytes."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno in FULL:
            raise DiskFullError(err.errno, path, needed) from err
        raise


def checkpoint_entries(path: Path) -> list[Path]:
    """What the checkpointer wrote in the checkpoint directory ``path``: its step directories."""
    return sorted(p for p in path.iterdir() if _STEP.fullmatch(p.name))


def _remove(path: Path) -> None:
    """Remove a result. Of a checkpoint directory, only the checkpointer's step directories are
    removed, and the directory itself when nothing else is left in it; a checkpoint directory
    that is a link (checkpoints on a scratch disk) stays linked, and what else the scratch
    directory holds stays. Nothing follows a link: a step directory that is one is unlinked.
    (``shutil.rmtree`` refuses a linked checkpoint/ with an ``OSError`` traceback; a
    replacement that follows links would empty the link's target, unrelated files included.)"""
    if path.name == _CHECKPOINT and path.is_dir():
        for p in checkpoint_entries(path):
            p.unlink() if p.is_symlink() or not p.is_dir() else shutil.rmtree(p)
        if not path.is_symlink() and next(path.iterdir(), None) is None:
            path.rmdir()
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class ResultsDir:
    """An output directory held by one run (a context manager).

    Args:
      path: the directory.
      resume: the run continues from what is there.
      overwrite: remove earlier results first.
      owned: glob patterns of the files a run writes (default :data:`RUN_FILES`); ``None``:
        the whole directory belongs to the run (any entry counts as a result).
      resumable: whether the run can resume (the refusal then suggests ``--resume``).
    """

    def __init__(self, path: str | Path, *, resume: bool = False, overwrite: bool = False,
                 owned: tuple[str, ...] | None = RUN_FILES, resumable: bool = True):
        self.path = Path(path)
        self.resume, self.overwrite, self.owned, self.resumable = resume, overwrite, owned, resumable
        self._fh = None

    def _results(self) -> list[Path]:
        if self.owned is None:
            found = {p for p in self.path.iterdir() if p.name != _LOCK}
        else:
            found = {p for pattern in self.owned for p in self.path.glob(pattern)}
        # an empty directory holds no result (a checkpoint/ linked to a scratch disk before the first run), nor does
        # a checkpoint directory without checkpoints (what else a scratch directory holds is not this run's)
        return sorted(p for p in found if not (p.is_dir() and next(p.iterdir(), None) is None)
                      and not (p.name == _CHECKPOINT and p.is_dir() and not checkpoint_entries(p)))

    def _refuse_links(self) -> None:
        """A link in place of a file a run writes is refused (it would be written, or removed, through);
        a ``checkpoint/`` may link to a directory (a scratch disk), or to one not mounted (the
        checkpoint module names it). With ``owned=None`` the whole directory is the run's."""
        patterns = None if self.owned is None else (*(self.owned or ()), *RUN_FILES, *_ANY_RUN, *_WRITTEN)
        for p in sorted(self.path.iterdir()):
            if not p.is_symlink() or p.name == _LOCK:
                continue
            if patterns is not None and not any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns):
                continue
            if p.name == _CHECKPOINT and (p.is_dir() or not p.exists()):
                continue
            refuse_link(p)

    def __enter__(self) -> "ResultsDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # never through a link: `ln -s ~/f out/.lock` would have ~/f truncated and overwritten with a pid
            self._fh = os.fdopen(open_nofollow(self.path / _LOCK, os.O_RDWR | os.O_CREAT), "r+")
        except FileExistsError:  # "File exists" names no path: a file (or one above it) is in the directory's place
            raise ValueError(f"cannot write results to {self.path}: {_not_a_directory(self.path)} is a file, not a "
                             f"directory") from None
        except OSError as err:
            raise ValueError(f"cannot write results to {self.path}: {err.strerror or err}") from None
        try:
            import fcntl

            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not POSIX: no lock
            pass
        except OSError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "?"
            self._fh.close()
            self._fh = None
            raise ValueError(f"another run (pid {holder}) is writing to {self.path}; wait for it or choose another "
                             f"output directory") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()
        try:
            self._refuse_links()
        except ValueError:
            self.__exit__()
            raise
        found = self._results()
        if found and not self.resume:
            if not self.overwrite:
                self.__exit__()
                names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found[:6])
                # both spellings: the command line's flags and the Python functions' arguments
                resume = "resume them (--resume; resume=True), " if self.resumable else ""
                raise ValueError(f"{self.path} already holds results ({names}); {resume}choose another output "
                                 f"directory, or overwrite them (--overwrite; overwrite=True)")
            foreign = [] if self.owned is None else sorted(
                {p for pattern in _ANY_RUN if pattern not in self.owned for p in self.path.glob(pattern)})
            if foreign:
                self.__exit__()
                names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in foreign)
                raise ValueError(f"{self.path} holds the results of another kind of run as well ({names}, which this "
                                 f"run does not write, so overwriting would leave them beside its own); remove them or "
                                 f"choose another output directory")
            for p in found:
                _remove(p)
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()  # releases the lock
            self._fh = None
