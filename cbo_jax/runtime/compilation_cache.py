"""JAX's persistent compilation cache, on by default for the ``cbo-jax`` command.

A short run spends much of its time compiling, and compiles the same programs as the run
before it. With the persistent cache, XLA's compiled programs are written to disk and
read back by the next process that compiles the same program (same shapes, same
configuration, same JAX and jaxlib): on a 2-core CPU the demo's two-round run took 23 s
with the cache warm against 53 s without it (``benchmarks/RESULTS.md``, "Start-up: the
persistent compilation cache"). The results are the same: the cache stores compiled
programs, not results.

The ``cbo-jax`` command turns it on (:func:`enable`) before any work:

* where JAX already has a cache directory (the user set ``JAX_COMPILATION_CACHE_DIR`` or
  ``jax_compilation_cache_dir``), that setting is left as it is;
* else at ``$CBO_JAX_COMPILATION_CACHE`` if that names a directory; the values ``0``,
  ``off``, ``false`` and ``no`` leave the cache off;
* else at ``$XDG_CACHE_HOME/cbo_jax/xla`` (``~/.cache/cbo_jax/xla``).

Its size is capped (``max_size``, 2 GiB by default; JAX evicts the least recently used
programs beyond it) where the ``filelock`` package is installed, which JAX's eviction
needs; without it the cache grows without a cap (a compiled program takes 2–250 kB in the demo;
delete the directory to empty it). Only compilations that took at least JAX's
``jax_persistent_cache_min_compile_time_secs`` (1 s by default) are stored. Scripts and
notebooks call :func:`enable` themselves; importing :mod:`cbo_jax` changes no JAX
setting. The test suite turns the cache off (``tests/conftest.py``), so that tests which
count compilations see every one.
"""

from __future__ import annotations

import importlib.util
import numbers
import os
import warnings
from pathlib import Path

__all__ = ["ENV", "current_dir", "default_dir", "enable"]

ENV = "CBO_JAX_COMPILATION_CACHE"
_OFF = ("0", "off", "false", "no")


def default_dir() -> Path | None:
    """Where :func:`enable` puts the cache when not told: ``None`` when ``$CBO_JAX_COMPILATION_CACHE`` is off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cbo_jax" / "xla"


def current_dir() -> str | None:
    """The directory of JAX's persistent compilation cache in this process, or ``None`` when it is off."""
    import jax

    return getattr(jax.config, "jax_compilation_cache_dir", None) or None


def enable(path: str | Path | None = None, *, max_size: int = 2 << 30) -> Path | None:
    """Turn on JAX's persistent compilation cache; returns its directory, or ``None`` if it stays off.

    Call it before the first compilation of the process (JAX reads the setting once).

    Args:
      path: the cache directory. Default: a directory JAX already uses (its own
        ``jax_compilation_cache_dir`` setting wins), else :func:`default_dir`.
      max_size: the cache's size limit in bytes (least recently used programs are
        evicted beyond it; needs the ``filelock`` package, else there is no limit);
        ``-1``: no limit.

    A directory that cannot be created or written leaves the cache off, with a warning;
    the run goes on as without it.
    """
    import jax

    if isinstance(max_size, bool) or not isinstance(max_size, numbers.Integral) or max_size < -1:
        raise ValueError(f"max_size must be a size in bytes (an integer >= 0) or -1 for no limit, got {max_size!r}")
    current = current_dir()
    if path is None and current:
        return Path(current)
    target = Path(path).expanduser() if path is not None else default_dir()
    if target is None:
        return None
    try:
        target.mkdir(parents=True, exist_ok=True)
        if not os.access(target, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as err:
        warnings.warn(f"compilation cache off: cannot use {target} ({err.strerror or err}); set {ENV} to a "
                      f"writable directory, or to 0 to silence this", stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", str(target))
    if max_size >= 0 and importlib.util.find_spec("filelock") is not None:  # JAX needs filelock to evict
        jax.config.update("jax_compilation_cache_max_size", int(max_size))
    return target
