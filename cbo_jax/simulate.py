"""Run a particle system: ``lax.scan`` over chunks of steps, ``vmap`` over runs.

:func:`simulate` is the loop every dynamics shares. Each chunk of ``chunk_size``
steps is one jitted ``lax.scan`` (compiled once per chunk length and reused), the
``M`` independent runs are a ``vmap``, a parameter sweep (``params=``, a grid of
:class:`cbo_jax.params.Params`) is a ``vmap`` around them, and between chunks the host
updates a progress bar and stops early when every run has met its stopping criterion.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from cbo_jax import _checks
from cbo_jax import params as params_lib
from cbo_jax.dynamics.base import Dynamics
from cbo_jax.dynamics.checks import _check_state_fits, _state_levels, check_population
from cbo_jax.objectives._host import user_errors
from cbo_jax.runtime import provenance
from cbo_jax.runtime.driver import Output, RunFiles, drive
from cbo_jax.runtime.progress import advance

__all__ = ["SimulationResult", "simulate", "rng_context"]

PyTree = Any


class SimulationResult(NamedTuple):
    """What :func:`simulate` returns.

    Attributes:
      state: the final state (leading run axis on every field when ``num_runs`` is set;
        before it, the grid axes of a parameter sweep).
      history: dict of NumPy arrays with one row per step taken (``T == steps``), each of
        shape ``(T,)``, ``(T, M)`` with runs, or ``(T, *grid, M)`` in a sweep, followed by
        the entry's own axes; the entries are the dynamics' ``record(state)``. The CBX
        family (:func:`cbo_jax.cbo` and the others): ``best_energy``, ``min_energy`` (the
        least energy of the current particles), ``alpha``, ``active``, ``evals`` (objective
        evaluations so far) and, with resampling, ``resamplings``. The clustered and CB²O
        systems: ``min_energy`` and ``alpha`` per class (a last axis ``K``). Then
        ``consensus`` if requested and what ``observe`` returns. A run that stops while
        others go on keeps its last values (frozen) in the rows after its stop, with
        ``active`` False.
      steps: number of steps simulated: ``num_steps``, or, when every run stopped early
        (``energy_tol``, ``diff_tol``, ``max_evals``, ``stagnation_patience``), the step at
        which the last of them stopped (``0`` when none could take a step); the history
        has exactly this many rows. A run's own count is ``state.step`` (its steps since
        ``initial_state``'s count when continuing).
      seconds: wall time of the simulation, compilation included.
    """

    state: Any
    history: dict
    steps: int
    seconds: float

    def __repr__(self) -> str:  # shapes and names: the arrays printed in full would fill a notebook cell
        from cbo_jax.runtime import display as _repr

        history = _repr.fields(self.history, sep=": ") if isinstance(self.history, dict) else ""
        return (f"SimulationResult(steps={self.steps}, seconds={self.seconds:.3g},\n"
                f"    state={_repr.tree(self.state)},\n"
                f"    history={{{history}}})")


def rng_context(config) -> contextlib.AbstractContextManager:
    """Trace-time PRNG layout selected by ``config.rng`` (see :class:`CBOConfig`)."""
    from cbo_jax.dynamics.core import rng_layout

    return rng_layout(getattr(config, "rng", "partitionable"))


def _record_cbo(state) -> dict:
    return {
        "best_energy": state.best_energy,
        "min_energy": jnp.min(jnp.where(jnp.isnan(state.energy), jnp.inf, state.energy), axis=-1),
        "alpha": state.alpha,
        "active": state.active,
    }


def _record(state, record, observe, with_consensus: bool) -> dict:
    rec = _as_dict("the dynamics' record(state)", record(state))
    if with_consensus:
        rec["consensus"] = state.consensus
    if observe is not None:
        rec.update(_as_dict("observe(state)", observe(state)))
    return rec


def _as_dict(what: str, value) -> dict:
    return _checks.returns_dict(what, value, "of arrays: name -> value, e.g. {'spread': ...}")


def _vmapped(fn, levels: int):
    for _ in range(levels):
        fn = jax.vmap(fn)
    return fn


@functools.partial(
    jax.jit, static_argnames=("step", "record", "observe", "length", "batched", "with_consensus", "blocking"),
    donate_argnums=(0,)
)
def _run_chunk(state, *, step, record, observe, length: int, batched: int, with_consensus: bool,
               blocking: bool = True):
    # batched: how many leading vmapped axes the state has (runs, and a sweep's points). blocking:
    # False for a population sharded over devices, whose rows are not taken block by block.
    if not blocking and _takes_blocking(step):
        step = functools.partial(step, blocking=False)
    step_fn = _vmapped(step, int(batched))
    rec_fn = _vmapped(functools.partial(_record, record=record, observe=observe, with_consensus=with_consensus),
                      int(batched))

    def body(s, _):
        s = step_fn(s)
        return s, rec_fn(s)

    return jax.lax.scan(body, state, None, length=length)


@functools.lru_cache(maxsize=None)
def _takes_blocking(step) -> bool:
    """Whether a dynamics' ``step`` takes ``blocking`` (the package's own do)."""
    try:
        return "blocking" in inspect.signature(step).parameters
    except (TypeError, ValueError):
        return False


def _init_fn(x0, key, *, init, batched: bool):
    return jax.vmap(init)(x0, key) if batched else init(x0, key)


_init = jax.jit(_init_fn, static_argnames=("init", "batched"))
_init_donating = jax.jit(_init_fn, static_argnames=("init", "batched"), donate_argnums=(0,))  # x0 becomes the state


@functools.partial(jax.jit, static_argnames=("init", "batched"))
def _init_point(x0, key, params, *, init, batched: bool):
    """The state of one point of numbers (a grid of shape ``()``), passed traced: the state has
    the unswept run's shapes, so its chunks are the unswept run's compiled programs, whatever
    the numbers (how :func:`minimize` reuses them across settings)."""
    if batched:
        return jax.vmap(init, in_axes=(0, 0, None))(x0, key, params)
    return init(x0, key, params)


@functools.partial(jax.jit, static_argnames=("init", "batched"))
def _init_sweep(x0, key, params, *, init, batched: bool):
    """One state per point of the flattened sweep axis; every point starts from the same
    ``x0`` and keys (common random numbers), so point ``g`` equals a separate run."""

    def one(prm):
        if batched:
            return jax.vmap(init, in_axes=(0, 0, None))(x0, key, prm)
        return init(x0, key, prm)

    return jax.vmap(one)(params)


def simulate(
    dynamics: Dynamics,
    x0: PyTree,
    key: jax.Array | int | None,
    num_steps: int,
    *,
    num_runs: int | None = None,
    chunk_size: int = 500,
    progress: bool = False,
    record_consensus: bool = False,
    observe: Callable[[Any], dict] | None = None,
    mesh: Mesh | None = None,
    initial_state: Any = None,
    desc: str = "cbo",
    params: Any = None,
    out: str | Path | None = None,
    log_every: int | None = None,
    tensorboard: bool = False,
    overwrite: bool = False,
    donate: bool = False,
) -> SimulationResult:
    """Simulate ``num_steps`` steps of ``dynamics`` from ``x0``.

    Args:
      dynamics: an ``(init, step)`` pair, e.g. from :func:`cbo_jax.cbo`.
      x0: initial population ``(N, d)`` or stacked pytree; with ``num_runs=M``, every
        leaf carries a leading run axis ``M`` (``(M, N, d)``) and the runs are vmapped.
      key: PRNG key, or an integer seed (``jax.random.key(seed)``). With
        ``num_runs=M``, run ``r`` starts from ``jax.random.split(key, M)[r]`` (split
        with JAX's default settings): run ``r`` draws the random numbers of the single
        run started from that key. In float64 the two runs are equal bit for bit; in
        float32 they agree up to rounding, which the batched reductions order
        differently and a chaotic run amplifies (measured up to 1e-4 after 20 steps of
        anisotropic CBO on Rastrigin).
      params: a :class:`cbo_jax.params.Params` whose leaves carry the axes of a sweep
        grid (for example from :func:`cbo_jax.params.grid`); ``None`` runs the
        dynamics' own numbers. Every grid point runs from the same ``x0`` and keys, all
        points and runs in one jitted program; the result's state and history carry
        the grid axes before the run axis. Every entry is validated on the host before
        anything is traced (:func:`cbo_jax.params.validate`). A single point (every leaf a
        number: grid shape ``()``) runs without a sweep axis, as the dynamics' own numbers
        would, and reuses their compiled programs: one build of the dynamics serves any
        numbers (the terms its config leaves out stay out).
      num_steps: maximum number of steps (``>= 0``).
      chunk_size: steps per compiled scan; the host checks progress and early
        stopping between chunks (a chunk's steps after every run has stopped are left
        out of ``steps`` and the history).
      progress: show a progress bar (tqdm) with the best energy so far (into a file or a
        pipe, printed at most every 30 s).
      record_consensus: also record the consensus point after every step.
      observe: optional ``observe(state) -> dict`` of arrays computed on device after
        every step and added to the history (for example a mean-field diagnostic);
        with ``num_runs`` it sees one run's state (it is vmapped). Pass the same
        function object across calls to reuse the compiled chunk.
      initial_state: continue from this state (for example one restored with
        :func:`cbo_jax.checkpoint.restore`) instead of initialising from ``x0`` and
        ``key`` (both must then be ``None``); ``num_runs`` must match it. The state
        carries its own PRNG key, so a run split at any step equals the whole run.
      mesh: a :func:`cbo_jax.sharding.agent_mesh`: shard the agent axis over its
        devices. ``N`` is padded to a multiple of the device count with inactive
        (NaN) agents that never influence real ones; the returned state keeps those
        rows at the end of the agent axis (``state.x[:N]`` are the real agents).
        With ``rng="per-particle"`` the result equals the single-device run up to
        float rounding. With ``initial_state`` (a restored checkpoint arrives on one
        device), the state's agent axis is placed over the mesh; its ``N`` (a sharded
        run's, padding included) must be a multiple of the device count.
      out: a directory: the recorded history is also written there, one row per logged step,
        to ``metrics.jsonl`` (and TensorBoard event files with ``tensorboard``) by the
        writer federated runs use (:class:`cbo_jax.writer.MetricsWriter`), chunk by chunk
        as the run goes. A directory holding such results is refused unless ``overwrite``.
      log_every: write every this many steps (default: about 1000 rows for the whole run), and
        the first and the last step taken (a stop, or ``num_steps`` not a multiple).
      donate: consume ``x0`` (or ``initial_state``): its device buffers become the run's state
        and are deleted for the caller, so a population as large as the device's memory
        allows runs without a second copy of it (``benchmarks/large_n.py``). Default: they are
        copied and stay the caller's.
    """
    output = _check_call(dynamics, num_steps, num_runs=num_runs, chunk_size=chunk_size, progress=progress,
                         record_consensus=record_consensus, observe=observe, out=out, log_every=log_every,
                         tensorboard=tensorboard, overwrite=overwrite)
    _refuse_tracers(x0=x0, key=key, initial_state=initial_state, params=params)
    plan = _plan(dynamics, x0, key, num_runs=num_runs, params=params, mesh=mesh, initial_state=initial_state)
    record = dynamics.record or _record_cbo
    config = dynamics.config
    t0 = time.perf_counter()
    # The library's dynamics enter config.rng's layout in init/step themselves; this context also
    # covers what they do not: a user's `observe` and dynamics of one's own that draw noise.
    # With out, summary.json names the code of the run's start (the git state read now), not of its end.
    # user_errors: an exception raised by a host objective (objectives.from_numpy) reaches the caller as itself
    with user_errors(), rng_context(config), (provenance.started() if out is not None else contextlib.nullcontext()):
        _checks.flags(donate=donate)
        state = _initial_state(dynamics, plan, initial_state, donate)
        plan = plan._replace(x0=None, state=None)  # nothing of the start held besides the state
        run_chunk = functools.partial(_run_chunk, step=dynamics.step, record=record, observe=observe,
                                      batched=plan.levels, with_consensus=record_consensus, blocking=mesh is None)
        state, done, chunks = _steps(state, run_chunk, num_steps, chunk_size, output, plan.grid, desc,
                                     early=bool(getattr(config, "early_stop", False)),
                                     summary=lambda state, done: {
                                         "seconds": time.perf_counter() - t0, "num_steps": num_steps,
                                         "num_runs": num_runs, "config": config, "params": plan.params,
                                         "initial_state": initial_state is not None, "steps": done})
        jax.block_until_ready(state)
        if not chunks:  # num_steps=0: the history's arrays with no rows (shapes only, nothing is run)
            _, spec = jax.eval_shape(functools.partial(run_chunk, length=0), state)
            chunks.append(jax.tree_util.tree_map(lambda v: np.zeros(v.shape, v.dtype), spec))
    # An entry may be a pytree (the consensus of a pytree population, an observe() dict): leaf by leaf.
    history = {k: jax.tree_util.tree_map(lambda *rows: np.concatenate([np.asarray(r) for r in rows]),
                                         *[c[k] for c in chunks]) for k in chunks[0]}
    if done:
        _warn_if_consensus_lost(state, history, plan.levels)
    grid = plan.grid
    if grid is not None:  # swept: the flattened sweep axis back to the grid's axes
        state = jax.tree_util.tree_map(lambda v: v.reshape(grid + v.shape[1:]), state)
        history = {k: jax.tree_util.tree_map(lambda v: v.reshape(v.shape[:1] + grid + v.shape[2:]), h)
                   for k, h in history.items()}
    return SimulationResult(state=state, history=history, steps=done, seconds=time.perf_counter() - t0)


def _check_call(dynamics, num_steps, *, num_runs, chunk_size, progress, record_consensus, observe, out, log_every,
                tensorboard, overwrite) -> Output:
    """:func:`simulate`'s arguments that need no population, checked; its output options."""
    if not isinstance(dynamics, Dynamics):
        hint = (": to minimise an objective, call cbo_jax.minimize(objective, ...), or build the dynamics with "
                "cbo_jax.cbo(objective, ...)") if callable(dynamics) else ""
        raise TypeError(f"simulate takes dynamics (a cbo_jax.Dynamics, e.g. cbo_jax.cbo(objective)), got "
                        f"{type(dynamics).__name__}{hint}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
    if num_steps > 2**31 - 1:  # the step counter is an int32: more steps never finish (and wrap around)
        raise ValueError(f"num_steps must be at most 2**31 - 1 (JAX counts steps in int32), got {num_steps!r}")
    _checks.flags(record_consensus=record_consensus)
    if observe is not None and not callable(observe):
        raise TypeError(f"observe must be a function observe(state) -> dict, got {type(observe).__name__}")
    output = Output(None if out is None else Path(out), overwrite=overwrite, tensorboard=tensorboard, progress=progress,
                    log_every=log_every)
    _checks.positive_int("chunk_size", chunk_size)
    if num_runs is not None:
        _checks.positive_int("num_runs", num_runs)
    return output


class _Plan(NamedTuple):
    """What a :func:`simulate` call starts from: the population and keys as prepared (padded over a
    mesh, one key per run), the sweep's grid (``None``: no sweep) or one point of numbers, and how
    many leading vmapped axes (runs, the sweep's points) the state has."""

    x0: Any
    key: Any
    grid: tuple | None
    flat: Any
    point: Any
    levels: int
    batched: bool
    params: Any = None  # the swept numbers as Params (summary.json names them)
    state: Any = None  # initial_state, placed on the mesh


def _plan(dynamics, x0, key, *, num_runs, params, mesh, initial_state) -> _Plan:
    """Check the population and the numbers on the host (nothing is compiled) and prepare them."""
    grid, point, flat = None, None, None
    config = dynamics.config
    dtype = jnp.dtype(getattr(config, "dtype", "float32"))
    if initial_state is not None and (x0 is not None or key is not None):  # they would be ignored
        raise ValueError("initial_state carries the population and its PRNG key: pass x0=None and key=None with it "
                         "(simulate(dynamics, None, None, num_steps, initial_state=state))")
    if params is not None:
        if initial_state is not None:
            raise ValueError("params and initial_state exclude each other: the state carries its own params")
        params = params_lib.as_params(params, dynamics)
        grid = params_lib.validate(params, dynamics)  # every entry, on the host, before tracing
        if grid == ():  # one point: no sweep axis, so the chunks are those of the dynamics' own numbers
            point = params_lib.flatten(params, (), dtype)
            point = jax.tree_util.tree_map(lambda v: v.reshape(()), point)
            grid = None
        else:
            flat = params_lib.flatten(params, grid, dtype)
    if initial_state is None:
        key = _checks.as_key("key", key)
        _checks.single_key(key, "with num_runs=M, simulate splits the key into the M runs' keys itself (run r "
                                "uses jax.random.split(key, M)[r])")
        _check_population(dynamics, x0, num_runs, mesh)
    _checks.x64_for(config)
    batched = num_runs is not None
    levels = int(batched) + int(grid is not None)
    if initial_state is not None:
        levels = _state_levels(initial_state, num_runs)
        _check_state_fits(dynamics, initial_state, levels)
        if mesh is not None:
            from cbo_jax.sharding import shard_state

            initial_state = shard_state(initial_state, mesh, levels)
        return _Plan(None, None, None, None, None, levels, batched, state=initial_state)
    if mesh is not None:
        from cbo_jax.sharding import prepare_population

        unsafe = "max_abs clipping turns the NaN padding agents into real ones" if getattr(
            config, "max_abs", None) is not None else None
        if getattr(config, "batch_size", None) is not None:
            unsafe = "random batches would be drawn over the padding agents too"
        x0, _ = prepare_population(x0, mesh, axis=1 if batched else 0, forbid_padding=unsafe)
    if num_runs is not None:
        key = jax.random.split(cast(jax.Array, key), num_runs)  # a key since as_key above
    return _Plan(x0, key, grid, flat, point, levels, batched, params)


def _check_population(dynamics, x0, num_runs, mesh) -> None:
    """The dynamics' host checks of ``x0``, and what the config asks of its ``N``."""
    config = dynamics.config
    if dynamics.check is not None:
        n = dynamics.check("x0", x0, num_runs)
    else:
        n = check_population("x0", x0, dynamics.objective, num_runs)
    batch_size = getattr(config, "batch_size", None)
    if batch_size is not None and n is not None and batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds the number of particles N={n}")
    chunk = getattr(config, "particle_chunk", None)
    if chunk is not None and mesh is not None:
        raise ValueError("particle_chunk bounds one device's memory; with a mesh, shard the particles instead")


def _initial_state(dynamics, plan: _Plan, initial_state, donate: bool = False):
    """The state of step 0: a copy of ``initial_state`` (the run donates its buffers), or ``init``'s;
    with ``donate``, ``initial_state`` itself, or ``init``'s made in ``x0``'s buffers."""
    if initial_state is not None:
        if donate:
            return plan.state
        return jax.tree_util.tree_map(lambda v: v.copy() if isinstance(v, jax.Array) else v, plan.state)
    if plan.grid is not None:  # swept: one flattened sweep axis
        state = _init_sweep(plan.x0, plan.key, plan.flat, init=dynamics.init, batched=plan.batched)
    elif plan.point is not None:  # one point of numbers (grid shape ()): the unswept run's shapes
        state = _init_point(plan.x0, plan.key, plan.point, init=dynamics.init, batched=plan.batched)
    else:
        state = (_init_donating if donate else _init)(plan.x0, plan.key, init=dynamics.init, batched=plan.batched)
    _check_some_energy_finite(state, plan.levels)
    return state


def _steps(state, run_chunk, num_steps: int, chunk_size: int, output: Output, grid, desc: str, *, early: bool,
           summary: Callable[[Any, int], dict]):
    """The chunks of steps (:func:`cbo_jax.runtime.driver.drive`): ``(state, steps taken, records)``.

    A stopped run is frozen (its step count too), so once every run has stopped, the steps taken
    are the largest step count gained, and the chunk's rows after that are dropped (dynamics of
    one's own without a step count still stop early; their chunks are not trimmed)."""
    chunks: list[dict] = []
    stops = early and hasattr(state, "step")
    start = jnp.array(state.step, copy=True) if stops else None  # a copy: the state is donated
    stride = output.log_every or max(1, num_steps // 1000)
    with RunFiles() as files:
        if output.progress:
            files.open_bar(num_steps, desc=desc, unit="step")
        if output.directory is not None and jax.process_index() == 0:  # one writer in a multi-process run
            files.hold(output.directory, overwrite=output.overwrite,
                       owned=("metrics.jsonl", "summary.json", "events.out.tfevents.*"), resumable=False)
            files.open_writer(output.directory, tensorboard=output.tensorboard, step_key="step")

        def at_stop(state, done, end, records):
            (length, rec), = records
            stopped = early and not bool(jnp.any(state.active))
            if stopped and stops:
                taken = int(jnp.max(state.step - start))  # on device: a sharded state may span hosts
                length = min(length, max(0, taken - done))
                rec = jax.tree_util.tree_map(lambda v, n=length: v[:n], rec)
            chunks.append(rec)
            if files.writer is not None:  # the run's last row too (a stop, or num_steps not a multiple of the stride)
                _write_rows(files.writer, rec, done, stride, final=stopped or done + length >= num_steps, grid=grid)
            if files.bar is not None:
                # Dispatch is asynchronous: wait for the chunk, so the bar shows steps done, not queued.
                jax.block_until_ready(state)
                best = {"best": f"{float(jnp.min(state.best_energy)):.4g}"} if hasattr(state, "best_energy") else None
                advance(files.bar, length, best)
            return state, done + length, stopped

        state, done = drive(state, 0, num_steps, next_stop=lambda done: min(num_steps, done + chunk_size),
                            length=lambda done, stop: stop - done,
                            scan=lambda state, done, n: run_chunk(state, length=n), at_stop=at_stop)
        if files.writer is not None:
            _write_summary(output.files, state, grid, summary(state, done))
    return state, done, chunks


def _check_some_energy_finite(state, levels: int) -> None:
    """Refuse a start where the objective is NaN or infinite at every particle of a run: its
    consensus weights are all zero, and the run would go on as NaN without a word."""
    energy = getattr(state, "energy", None)
    if not isinstance(energy, jax.Array) or energy.ndim <= levels:
        return
    loss = getattr(state, "loss", None)
    if isinstance(loss, jax.Array) and loss.shape == energy.shape and energy.ndim >= levels + 2:
        # the clustered / CB²O system, (K, N): every class needs a particle with a finite lower-level
        # loss L_k and a finite energy (CB²O: the upper level G); a lower level NaN everywhere
        # leaves Q_β empty, and the run would go on as NaN with a warning that it "became" so
        ok = jnp.any(jnp.isfinite(energy) & jnp.isfinite(loss), axis=-1)  # (..., K)
        some = jnp.all(ok.reshape(energy.shape[:levels] + (-1,)), axis=-1)
        what = "the objective (for some class k, the lower level L_k or the upper level) is"
    else:
        some = jnp.any(jnp.isfinite(energy).reshape(energy.shape[:levels] + (-1,)), axis=-1)
        what = "the objective is"
    if not bool(jnp.all(some)):  # on device: a sharded state may span hosts
        which = "" if levels == 0 else f" (of {int(jnp.sum(~some))} of the {some.size} runs or grid points)"
        raise ValueError(f"{what} NaN or infinite at every particle of x0{which}: the consensus point "
                         "would be NaN. Start the particles where the objective is finite (inside its domain, at "
                         "magnitudes where it does not overflow)")


@functools.partial(jax.jit, static_argnums=1)
def _finite_per_run(leaves, levels: int):
    """Whether every entry of the leaves is finite, per run (the ``levels`` leading axes), and in
    all runs: one small program, rather than eager operations compiled one by one (one of them
    equal to the start check's, compiled again and read back from the persistent cache)."""
    ok = functools.reduce(jnp.logical_and, [
        jnp.all(jnp.isfinite(leaf).reshape(leaf.shape[:levels] + (-1,)), axis=-1) for leaf in leaves])
    return ok, jnp.all(ok)


def _warn_if_consensus_lost(state, history: dict, levels: int) -> None:
    """Warn when a run ended with a non-finite consensus point: its objective became NaN or
    infinite at every particle during the run (x0 is checked before), and from then on the
    particles move as NaN while ``best_energy`` keeps the last finite value, so the run looks
    healthy. One reduction on the device; the step is read from the history's ``min_energy``."""
    m = getattr(state, "consensus", None)
    leaves = jax.tree_util.tree_leaves(m)
    if not leaves or not all(isinstance(leaf, jax.Array) for leaf in leaves):
        return
    ok, every = _finite_per_run(leaves, levels)
    if bool(every):  # on device: a sharded state may span hosts
        return
    ok = np.asarray(ok)
    lost, total = int(np.sum(~ok)), int(ok.size)
    which = "the run" if levels == 0 else f"{lost} of the {total} runs or grid points"
    first = ""
    low = history.get("min_energy")
    if isinstance(low, np.ndarray) and low.size:
        rows = np.flatnonzero((~np.isfinite(low.reshape(low.shape[0], -1))).any(axis=1))  # steps x runs
        if rows.size:
            first = f" (first after step {int(rows[0]) + 1})"
    warnings.warn(f"simulate: in {which} the objective became NaN or infinite at every particle{first}; the "
                  "consensus point and the particles are NaN from then on, while best_energy keeps the last "
                  "finite value. Keep the particles in the objective's domain (a smaller dt or sigma1, or "
                  "max_abs= to clip them)", RuntimeWarning, stacklevel=3)


def _write_summary(out: Path, state, grid, run: dict) -> None:
    """``out/summary.json`` of a finished :func:`simulate` run: the steps taken, the wall time,
    the best energy found (overall, and per run / grid point where there are several), what
    ran (the dynamics' config, the swept ``params`` by name with the grid's shape, ``num_runs``,
    ``num_steps``) and the environment (:func:`cbo_jax.runtime.writer.write_summary`)."""
    from cbo_jax.runtime.writer import describe, write_summary

    summary: dict[str, Any] = {"steps": int(run["steps"]), "seconds": round(run["seconds"], 3),
                               "num_steps": int(run["num_steps"]), "num_runs": run["num_runs"],
                               "config": describe(run["config"])}
    if run["initial_state"]:
        summary["continued"] = True  # from initial_state: its own numbers
    prm = run["params"]
    if prm is not None:  # the numbers each grid point ran: every leaf by its dotted name, as given
        summary["params"] = {name: describe(np.asarray(leaf)) for name, leaf in
                             zip(params_lib.names(prm), jax.tree_util.tree_leaves(prm))}
        summary["grid_shape"] = list(params_lib.grid_shape(prm))
    if hasattr(state, "best_energy"):
        best = np.asarray(jax.device_get(state.best_energy), np.float64)
        finite = best[np.isfinite(best)]
        summary["best_energy"] = float(finite.min()) if finite.size else None
        if best.ndim:
            summary["best_energy_per_run"] = best.reshape(grid + best.shape[1:]) if grid is not None else best
    write_summary(out / "summary.json", summary)


def _refuse_tracers(**args: Any) -> None:
    """A clear error for :func:`simulate` called under ``jax.jit``, ``vmap`` or ``grad``.

    ``simulate`` is a host loop (early stopping and progress between compiled chunks, host checks of
    the population before compiling), so its inputs must be concrete; traced, the first host check
    would fail deep inside JAX (``TracerArrayConversionError``) without saying what to do instead.
    """
    for name, value in args.items():
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(value)):
            raise ValueError(
                f"simulate got a traced {name} (simulate called inside jax.jit, jax.vmap or jax.grad): it runs a "
                "host loop of compiled chunks and cannot itself be traced. Batch runs with num_runs= and "
                "parameters with params= (both vmapped inside simulate), or transform the pure pair "
                "dynamics.init / dynamics.step yourself (e.g. jax.lax.scan over dynamics.step)")


def _write_rows(writer, rec: dict, done: int, stride: int, final: bool = False, grid: tuple | None = None) -> None:
    """One row per ``stride``-th step of a chunk's record (steps count from 1), the first step's,
    and, for the chunk that ends the run (``final``), its last step's. A sweep's record has one
    flattened sweep axis: written with the ``grid``'s axes, as the returned history has them."""
    rec = jax.device_get(rec)
    if grid is not None:
        rec = jax.tree_util.tree_map(lambda v: np.reshape(v, v.shape[:1] + grid + v.shape[2:]), rec)
    leaves = jax.tree_util.tree_leaves(rec)
    length = len(leaves[0]) if leaves else 0
    for i in range(length):
        step = done + i + 1
        if step % stride == 0 or step == 1 or (final and i == length - 1):  # an entry may be a pytree
            writer.write({"step": step, **{k: jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), v)
                                            for k, v in rec.items()}})
