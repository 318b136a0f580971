"""Where and with what a result was computed: the ``environment`` block of ``summary.json``.

Every results directory the command line and :func:`cbo_jax.federated.run` write holds a
``summary.json``; :func:`environment` is recorded in it under ``"environment"`` so that a
number read months later (or on another machine, or from a GPU) says which code, which
JAX, which device and which command produced it:

* ``cbo_jax``, ``jax``, ``jaxlib``, ``numpy``, ``python``: versions;
* ``backend``, ``device_kind``, ``device_count``, ``process_count``, ``x64``: the JAX
  runtime the numbers come from (``device_kind`` is the first device's, as
  ``benchmarks/gpu_suite.py`` names it); ``compilation_cache``: the persistent
  compilation cache's directory, or ``None`` (:mod:`cbo_jax.runtime.compilation_cache`);
* ``cpu_model``, ``cpu_count``, ``platform``: the host;
* ``command``: the command line, as a shell would take it back (``cbo-jax ...`` for the
  command line, also when :func:`cbo_jax.cli.main` is called from Python; else ``sys.argv``);
* ``date_utc``: when the summary was written;
* ``git_commit`` and ``git_dirty``: only when the package is imported from the root of
  a git checkout (an editable install of a clone); ``git_dirty`` says tracked files
  differ from that commit, so the commit alone does not reproduce the run. They are read
  when the command, :func:`cbo_jax.federated.run` or :func:`cbo_jax.simulate` started
  (:func:`started`), not when the summary is written: a commit made while a long run
  went on is not the code it ran.

Nothing here enters a run's fingerprint: a run resumes on another machine or JAX version.
Scripts of one's own record the same block with
:func:`cbo_jax.runtime.writer.write_summary` (``write_summary(path, summary)``), which is how the
command line and the federated runner write theirs; :func:`describe` is its one-line form
for tables, as the benchmarks print it.

>>> from cbo_jax.runtime.provenance import environment, describe
>>> env = environment()
>>> env["backend"] in ("cpu", "gpu", "tpu")
True
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

__all__ = ["command", "cpu_model", "describe", "environment", "git_state", "installed_version", "started"]

_COMMAND: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("cbo_jax_command", default=None)


_GIT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("cbo_jax_git", default=None)


@contextlib.contextmanager
def command(argv: list[str]) -> Iterator[None]:
    """Within the block, :func:`environment` records ``argv`` as the command (the CLI sets it),
    and the git state of the block's start (:func:`started`)."""
    token = _COMMAND.set(list(argv))
    try:
        with started():
            yield
    finally:
        _COMMAND.reset(token)


@contextlib.contextmanager
def started() -> Iterator[None]:
    """Within the block, :func:`environment` records the git state (:func:`git_state`) read
    at the block's start: the code a run ran, not the checkout when its summary is
    written. An enclosing block's state stands (a command's runs record the command's start)."""
    if _GIT.get() is not None:
        yield
        return
    token = _GIT.set(git_state())
    try:
        yield
    finally:
        _GIT.reset(token)


def git_state(path: str | Path | None = None) -> dict[str, Any]:
    """``{"git_commit": sha, "git_dirty": bool}`` of the git work tree whose top level is ``path``, or ``{}``.

    ``path`` defaults to the directory above this package, which is the clone's root for
    an editable install of a clone. ``{}`` when ``path`` is not the top of a work tree
    (an installed wheel, even in a virtual environment that sits inside some other
    repository), git is missing, or git does not answer within 5 s. ``git_dirty``: a
    tracked file differs from the commit (untracked files do not count).
    """
    where = Path(path) if path is not None else Path(__file__).resolve().parents[1]
    if not (where / ".git").exists():
        return {}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": dirty}


def cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe(env: dict[str, Any] | None = None) -> str:
    """One line for a results table: ``"CPU (<model>, 2 cores), jax device cpu"``."""
    env = environment() if env is None else env
    return (f"{env['backend'].upper()} ({env['cpu_model']}, {env['cpu_count']} cores), "
            f"jax device {env['device_kind']}")


@functools.cache
def installed_version() -> str:
    """The installed distribution's version, ``cbo_jax.__version__`` (pyproject.toml is the one place it is
    written); ``0+unknown`` for a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cbo-jax")
    except PackageNotFoundError:  # imported from a source tree that was never installed: no metadata to read
        return "0+unknown"


def environment(argv: list[str] | None = None) -> dict[str, Any]:
    """The environment block recorded in ``summary.json`` (see the module docstring).

    Args:
      argv: the command line to record (default: the one :func:`command` set, else
        ``sys.argv`` with the program's base name).
    """
    import jax
    import jaxlib
    import numpy as np

    from cbo_jax.runtime import compilation_cache

    if argv is None:
        argv = _COMMAND.get() or sys.argv
    argv = list(argv)
    if argv:
        argv[0] = os.path.basename(argv[0])
    devices = jax.devices()
    env: dict[str, Any] = {
        "cbo_jax": installed_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "x64": jax.dtypes.canonicalize_dtype(np.float64) == np.float64,
        "compilation_cache": compilation_cache.current_dir(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "command": shlex.join(argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    at_start = _GIT.get()
    env.update(git_state() if at_start is None else at_start)
    return env
