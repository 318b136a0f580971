"""Results directories that one run at a time owns.

:class:`ResultsDir` is entered before any work: it creates the directory (an unusable
path, such as one under a regular file or in /proc, is an error at once, not after the
simulation), takes an exclusive lock (a second run into the same directory fails at once
with the holder's pid; the lock is the kernel's, so a killed run never leaves a stale
one), and refuses a directory that already holds results unless the run resumes from
them or was asked to overwrite them (then exactly the files a run writes are removed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["ResultsDir", "RUN_FILES"]

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


def _remove(path: Path) -> None:
    """Remove a result; a directory that is a link (checkpoints on a scratch disk) is emptied and stays linked.

    ``shutil.rmtree`` refused the link with an ``OSError`` traceback.
    """
    if path.is_symlink() and path.is_dir():
        for p in path.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
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
        # an empty directory holds no result (a checkpoint/ linked to a scratch disk before the first run)
        return sorted(p for p in found if not (p.is_dir() and next(p.iterdir(), None) is None))

    def __enter__(self) -> "ResultsDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path / _LOCK, "a+")
        except FileExistsError:  # was "File exists": a file (or one above it) is in the directory's place
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
