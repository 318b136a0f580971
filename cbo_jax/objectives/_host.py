"""Objectives evaluated on the host: NumPy code, simulators, programs (issue 60).

:func:`from_numpy` turns a function of NumPy arrays into an objective that every dynamics
accepts. Inside a compiled step it is a ``jax.pure_callback``: the step hands the whole
population to the host once (every run of ``num_runs`` and every sweep point in the same
call), the function computes the energies there, and the step goes on with them. Its costs
are a host round-trip per step and a function XLA cannot fuse, differentiate or run on an
accelerator; an objective written with ``jax.numpy`` has none of them.

An exception raised by the function reaches the caller of :func:`cbo_jax.simulate` (and
:func:`cbo_jax.minimize`) as that exception, with a note naming the call and the batch,
instead of the runtime error XLA wraps it in.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["HostObjective", "from_numpy", "user_errors"]

class _Pending:
    """The exception a host objective raised, until the caller re-raises it (process-wide: XLA runs
    the callbacks on threads of its own, not the caller's)."""

    lock = threading.Lock()
    error: BaseException | None = None


_pending = _Pending()


def _store(err: BaseException) -> None:
    with _pending.lock:
        if _pending.error is None:  # the first one: later calls may fail because of it
            _pending.error = err


@contextlib.contextmanager
def user_errors():
    """Re-raise, as itself, an exception that a :class:`HostObjective` raised inside the block's
    computations (XLA reports it as a ``JaxRuntimeError``)."""
    _pending.error = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised as is unless a host objective failed
        with _pending.lock:
            raised, _pending.error = _pending.error, None
        if raised is None or raised is err:
            raise
        raise raised.with_traceback(raised.__traceback__) from None
    finally:
        _pending.error = None


class HostObjective:
    """An objective computed by a NumPy function on the host (see :func:`from_numpy`).

    Calling it on a population ``(..., d)`` (a JAX array or a tracer) returns the energies
    ``(...)``. Attributes ``calls`` and ``evaluations`` count the host calls and the particles
    evaluated in them (every run and sweep point included) since it was made or
    :meth:`reset`.
    """

    host = True  # read by the engine: one block per step (one host call per step)

    def __init__(self, f: Callable[[np.ndarray], Any], *, vectorized: bool = True, dtype: Any = None,
                 name: str | None = None, workers: int | None = None, pool: str = "thread",
                 progress: bool = False):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer (or None: no pool), got {workers!r}")
        if pool not in ("thread", "process"):
            raise ValueError(f"pool must be 'thread' or 'process', got {pool!r}")
        self.workers, self.pool, self.progress = workers, pool, bool(progress)
        self._executor: Any = None
        self._bar: Any = None
        if not callable(f):
            raise TypeError(f"from_numpy needs a function of a NumPy array, got {type(f).__name__}")
        if isinstance(f, HostObjective):
            raise TypeError("this objective is already a host objective: use it as it is")
        self.f, self.vectorized = f, bool(vectorized)
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        if self.dtype is not None and not jnp.issubdtype(self.dtype, jnp.floating):
            raise ValueError(f"dtype must be a float dtype (the energies'), got {self.dtype}")
        self.name: str = str(name or getattr(f, "__name__", type(f).__name__))
        self.calls = 0
        self.evaluations = 0

    def reset(self) -> None:
        """Set ``calls`` and ``evaluations`` back to 0."""
        self.calls = self.evaluations = 0

    def close(self) -> None:
        """Shut the worker pool down and close the progress bar (both are made again when needed)."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __getstate__(self):  # a pool and a bar do not travel
        return {**self.__dict__, "_executor": None, "_bar": None}

    def _evaluate(self, rows: np.ndarray) -> np.ndarray:
        """``f`` on every row: one call, or with ``workers`` the rows split into that many chunks
        evaluated in a pool of threads or processes, in order."""
        one = self.f if self.vectorized else _PerParticle(self.f, self.name)
        if self.workers is None or self.workers == 1 or rows.shape[0] < 2:
            return np.asarray(one(rows))
        if self._executor is None:
            import concurrent.futures as cf
            import multiprocessing

            # processes are spawned, not forked: a fork of the multithreaded JAX process may deadlock
            self._executor = (cf.ThreadPoolExecutor(self.workers) if self.pool == "thread" else
                              cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn")))
        chunks = np.array_split(rows, min(self.workers, rows.shape[0]))
        parts = [np.asarray(p) for p in self._executor.map(one, chunks)]
        for part, chunk in zip(parts, chunks):
            if part.shape != (chunk.shape[0],):
                raise ValueError(f"{self.name} returned shape {part.shape} for {chunk.shape[0]} particles; a "
                                 "vectorized objective maps (n, d) -> (n,)")
        return np.concatenate(parts)

    def _advance(self, rows: int) -> None:
        if not self.progress:
            return
        if self._bar is None:
            from cbo_jax.runtime.progress import progress_bar

            self._bar = progress_bar(None, desc=self.name, unit="eval")  # type: ignore[arg-type]
        self._bar.update(rows)

    def __repr__(self) -> str:
        return (f"HostObjective({self.name}, vectorized={self.vectorized}"
                + (f", dtype={self.dtype}" if self.dtype is not None else "") + ")")

    def _out_dtype(self, x_dtype) -> np.dtype:
        if self.dtype is not None:
            return np.dtype(jax.dtypes.canonicalize_dtype(self.dtype))
        if jnp.issubdtype(x_dtype, jnp.floating):
            return np.dtype(x_dtype)
        return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))

    def __call__(self, x):
        if not hasattr(x, "shape"):
            x = jnp.asarray(x)
        if isinstance(x, (dict, list, tuple)) or jnp.ndim(x) < 1:
            raise ValueError(f"{self!r} takes an array of particles (..., d), got {type(x).__name__}"
                             + (f" of shape {jnp.shape(x)}" if hasattr(x, "shape") else "")
                             + "; flatten a pytree population with cbo_jax.population.ravel")
        out_dtype = self._out_dtype(x.dtype)  # here: the x64 setting of the caller's thread, not the callback's
        spec = jax.ShapeDtypeStruct(tuple(x.shape[:-1]), out_dtype)
        # "broadcast_all": under vmap (num_runs, sweeps) the callback gets every run's particles in one call
        return jax.pure_callback(functools.partial(self._host, out_dtype=out_dtype), spec, x,
                                 vmap_method="broadcast_all")

    def _host(self, x, *, out_dtype) -> np.ndarray:
        x = np.asarray(x)
        lead, d = x.shape[:-1], x.shape[-1]
        rows = x.reshape(-1, d)
        call = self.calls + 1
        try:
            if out_dtype.itemsize == 8 and jax.dtypes.canonicalize_dtype(out_dtype) != out_dtype:
                raise RuntimeError(
                    f"{self.name}: float64 energies from a host objective need float64 enabled for the whole "
                    "process, jax.config.update('jax_enable_x64', True): XLA calls the objective on a thread of "
                    "its own, which the `with jax.enable_x64(True):` context does not reach")
            e = self._evaluate(rows)
            if e.shape != (rows.shape[0],):
                raise ValueError(f"{self.name} returned shape {e.shape} for {rows.shape[0]} particles; a vectorized "
                                 "objective maps (n, d) -> (n,)"
                                 + (" (for a function of one particle pass vectorized=False)"
                                    if e.shape in ((), (1,)) else ""))
            if not (np.issubdtype(e.dtype, np.floating) or np.issubdtype(e.dtype, np.integer)
                    or e.dtype == np.bool_):
                raise ValueError(f"{self.name} returned energies of dtype {e.dtype}; return real numbers")
            self._advance(rows.shape[0])
        except Exception as err:  # noqa: BLE001 - kept for the caller, with where it happened
            if hasattr(err, "add_note"):
                err.add_note(f"raised by the host objective {self.name!r} in its call {call}, on particles of "
                             f"shape {rows.shape} (in a run: the initial evaluation is call 1, then one call per "
                             f"step, so step {call - 1})")
            _store(err)
            raise
        self.calls = call
        self.evaluations += rows.shape[0]
        return e.astype(out_dtype).reshape(lead)


class _PerParticle:
    """``f`` of one particle applied to every row (picklable when ``f`` is, for a process pool)."""

    def __init__(self, f, name: str):
        self.f, self.name = f, name

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        out = []
        for r in rows:
            v = np.asarray(self.f(r))
            if v.size != 1:
                raise ValueError(f"{self.name} returned shape {v.shape} for one particle of shape {r.shape}; with "
                                 "vectorized=False it maps one particle (d,) to a scalar (or pass vectorized=True "
                                 "for a function of all particles (n, d) -> (n,))")
            out.append(v.reshape(()))
        return np.asarray(out)


def from_numpy(f: Callable[[np.ndarray], Any], *, vectorized: bool = True, dtype: Any = None,
               name: str | None = None, workers: int | None = None, pool: str = "thread",
               progress: bool = False) -> HostObjective:
    """An objective computed on the host by ``f``, a function of NumPy arrays.

    Args:
      f: with ``vectorized=True`` (default), ``f(x) -> e`` maps the particles ``x`` of shape
        ``(n, d)`` (a NumPy array) to their energies ``(n,)``; with ``vectorized=False`` it maps
        one particle ``(d,)`` to a scalar, and is called once per particle.
      dtype: the energies' dtype (default: the particles' float dtype).
      name: the name in messages (default: ``f.__name__``).
      workers: evaluate a step's particles in this many chunks at once, in a pool of
        ``pool="thread"`` (default: for an ``f`` that waits on a subprocess, a file or a
        server, or releases the GIL) or ``"process"`` (spawned processes, for pure-Python
        work: ``f`` must be picklable, a function defined at a module's top level). The pool
        lives until :meth:`HostObjective.close`.
      progress: a progress bar that counts the evaluations (particles evaluated), for
        objectives that take seconds.

    Every dynamics, :func:`cbo_jax.simulate` (``num_runs``, parameter sweeps) and
    :func:`cbo_jax.minimize` accept the result; a step calls ``f`` once with every particle of
    every run, so ``f`` sees ``n = N · runs`` rows. NaN and inf energies behave as a JAX
    objective's. An exception in ``f`` reaches the caller as itself (with a note naming the
    call). ``f`` runs on the host, outside XLA: it is not differentiated (no gradient terms),
    not fused and not run on an accelerator; write the objective with ``jax.numpy`` where you
    can.

    Example::

        def rastrigin(x):  # NumPy, (n, d) -> (n,)
            return 10 * x.shape[1] + np.sum(x**2 - 10 * np.cos(2 * np.pi * x), axis=1)

        res = cj.minimize(cj.objectives.from_numpy(rastrigin), dim=10, num_steps=500)
    """
    return HostObjective(f, vectorized=vectorized, dtype=dtype, name=name, workers=workers, pool=pool,
                         progress=progress)
