"""``cj.minimize(f, dim=d)``: CBO on an objective in one call, with its dynamics cached.

:func:`minimize` builds :func:`cbo_jax.cbo` dynamics for an objective (lifting a function of
one particle with :func:`cbo_jax.population.per_agent`) and :func:`cbo_jax.simulate` s them. Calls
that differ only in their numbers (λ1, σ1, λ2, σ2, dt, the α schedule's) reuse one build of the
dynamics, their numbers passed as ``params=``, so a loop of calls compiles once.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.dynamics.base import Dynamics
from cbo_jax.dynamics.cbo import CBOConfig
from cbo_jax.simulate import SimulationResult, simulate

__all__ = ["minimize"]

PyTree = Any


def _typed(value: Any) -> Any:
    """A hashable key for a configuration value that tells ``1`` from ``1.0`` and ``True``.

    Dataclasses (configs, schedules) by their type and fields, recursively, a schedule
    ``Chain`` by its rules; sequences and dicts item by item; anything else as
    ``(type, value)`` (identity for objects without value equality). Unhashable leaves
    (arrays) make :func:`hash` of the key fail.
    """
    import dataclasses

    from cbo_jax.schedules import Chain

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value),) + tuple((f.name, _typed(getattr(value, f.name))) for f in dataclasses.fields(value))
    if isinstance(value, Chain):
        return (Chain,) + tuple(_typed(r) for r in value.rules)
    if isinstance(value, (tuple, list)):
        return (type(value),) + tuple(_typed(v) for v in value)
    if isinstance(value, dict):
        return (dict,) + tuple(sorted((k, _typed(v)) for k, v in value.items()))
    return (type(value), value)


def _structure(config) -> Any:
    """The key of ``config`` less its traced numbers (:class:`cbo_jax.params.Params`): ``dt``, the
    values of ``λ1, σ1, λ2, σ2`` (whether each is zero stays: a zero term is left out of the
    compiled step) and the α schedule's numbers (its kind and static fields stay). Two configs
    with one structure run the same compiled programs, their numbers passed as ``params``."""
    import dataclasses

    from cbo_jax import params as params_lib

    def schedule(s):
        numbers = getattr(s.params(), "_fields", ()) if hasattr(s, "params") else ()
        if not numbers or not dataclasses.is_dataclass(s):
            return _typed(s)
        return (type(s),) + tuple((f.name, _typed(getattr(s, f.name))) for f in dataclasses.fields(s)
                                  if f.name not in numbers)

    extra = getattr(config.extra_params(), "_fields", ()) if hasattr(config, "extra_params") else ()
    items: list[Any] = [type(config)]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "dt" or f.name in extra:
            continue
        if f.name in params_lib.SDE_FIELDS:
            items.append((f.name, value == 0))
        elif f.name == "alpha":
            items.append((f.name, schedule(value)))
        else:
            items.append((f.name, _typed(value)))
    return tuple(items)


# minimize's dynamics by (objective, the config's structure): calls that differ only in their numbers
# (λ1, σ1, λ2, σ2, dt, the α schedule's) reuse one Dynamics and pass their numbers as params=, so
# simulate's jitted programs (keyed on the step function and the state's shapes) compile once.
# Oldest entry out after 8.
_MINIMIZE_DYNAMICS: collections.OrderedDict = collections.OrderedDict()
_MINIMIZE_CACHE_SIZE = 8
_MINIMIZE_LOCK = threading.Lock()


def _minimize_dynamics(objective, lift: bool, config, cfg_kw: dict) -> tuple[Dynamics, Any]:
    """The dynamics for ``objective`` with ``config`` updated by ``cfg_kw``, and the numbers to run
    them with (a :class:`cbo_jax.params.Params` point, or ``None`` when built for this call)."""
    import dataclasses

    from cbo_jax import params as params_lib
    from cbo_jax import population as pop
    from cbo_jax.dynamics.cbo import cbo

    # cfg_kw holds CBOConfig fields only (minimize split them off); the resolved config is the key: CBOConfig(alpha=30), alpha=30 and CBOConfig() + alpha=30 are one setting
    config = dataclasses.replace(config, **cfg_kw) if config is not None else CBOConfig(**cfg_kw)

    def build() -> Dynamics:
        return cbo(pop.per_agent(objective) if lift else objective, config)

    try:
        key = (objective, lift, _structure(config))  # the objective by its own ``==`` (identity)
        hash(key)
    except TypeError:  # an unhashable objective or an array in the config: build afresh
        return build(), None
    numbers = params_lib.defaults(config)
    with _MINIMIZE_LOCK:  # minimize may be called from several threads
        if key in _MINIMIZE_DYNAMICS:
            _MINIMIZE_DYNAMICS.move_to_end(key)
            return _MINIMIZE_DYNAMICS[key], numbers
    dyn = build()  # outside the lock: building may trace the objective
    with _MINIMIZE_LOCK:
        dyn = _MINIMIZE_DYNAMICS.setdefault(key, dyn)
        while len(_MINIMIZE_DYNAMICS) > _MINIMIZE_CACHE_SIZE:
            _MINIMIZE_DYNAMICS.popitem(last=False)
    return dyn, numbers


def _refuse_ambiguous_objective(objective, single) -> None:
    """``objective`` maps ``single`` to ``(N,)`` *and* one particle to a scalar (an ``(N, d)``
    population with ``N = d``, say): compare the two readings on random particles and refuse
    when they differ. ``jnp.sum((x - 1) ** 2, axis=0)``, written for one particle, gives ``(N,)``
    on an ``(N, N)`` population, and the run would quietly minimise the sums of the columns."""
    from cbo_jax import population as pop

    leaves, tree = jax.tree_util.tree_flatten(single)
    keys = jax.random.split(jax.random.key(20250601), len(leaves))
    probe = jax.tree_util.tree_unflatten(
        tree, [jax.random.normal(k, np.shape(leaf), jnp.float32) for k, leaf in zip(keys, leaves)])
    try:
        with jax.ensure_compile_time_eval():
            as_population = np.asarray(objective(probe), np.float64)
            row_by_row = np.asarray(jax.vmap(objective)(probe), np.float64)
    except Exception:  # noqa: BLE001 - not evaluable eagerly: nothing to compare, the population reading stands
        return
    if np.allclose(as_population, row_by_row, rtol=1e-4, atol=1e-5, equal_nan=True):
        return  # a row-wise function: both readings are the same function
    n = pop.num_agents(single)
    shapes = jax.tree_util.tree_map(np.shape, single)
    raise ValueError(f"minimize cannot tell how to read the objective: on x0 ({shapes}) it returns shape ({n},) as a "
                     "population objective (N, d) -> (N,), and a scalar for one particle, and the two readings give "
                     "different energies. For a single-particle function pass cj.population.per_agent(objective); for "
                     "a population objective, reduce over the particle's axes (axis=-1), not the particles' axis")


_SIMULATE_OPTIONS = ("num_runs", "chunk_size", "progress", "record_consensus", "observe", "mesh", "initial_state",
                     "desc", "params", "out", "log_every", "tensorboard", "overwrite")


def minimize(objective: Callable[..., jax.Array], x0: PyTree | None = None, key: jax.Array | int = 0,
             num_steps: int = 1000, config: CBOConfig | None = None, *, dim: int | None = None,
             num_particles: int = 100, init_bounds: tuple[float, float] = (-3.0, 3.0),
             **kwargs: Any) -> SimulationResult:
    """Minimise ``objective`` with CBO: build :func:`cbo_jax.cbo` dynamics and :func:`simulate` them.

    ``cj.minimize(f, dim=d, key=0)`` is enough: without ``x0``, the initial population is
    ``num_particles`` (default 100) particles drawn uniformly from ``init_bounds``
    (default ``[-3, 3]``) in every coordinate of ``R^dim`` (with ``num_runs=M``, ``M`` such
    populations), from the first half of ``jax.random.split(key)``; the run uses the
    second half. With ``x0`` given, ``key`` drives the run directly.

    Args:
      objective: a population objective ``(N, d) -> (N,)`` (every function of
        :mod:`cbo_jax.objectives`), or a single-particle one ``(d,) -> ()``, which is
        lifted with :func:`cbo_jax.population.per_agent` (detected from the shapes on
        the host before anything runs; where both readings fit the shapes, as with
        ``N = d``, they are compared on random particles, and a disagreement is an error).
      x0: initial population ``(N, d)`` (or ``(M, N, d)`` with ``num_runs``, or a stacked
        pytree); ``None`` draws the default one above (needs ``dim``).
      key: PRNG key or integer seed (default ``0``).
      num_steps: steps of Euler–Maruyama (default 1000).
      config: a :class:`~cbo_jax.CBOConfig`.
      kwargs: :class:`~cbo_jax.CBOConfig` fields (override ``config``) and
        :func:`simulate` options; any other keyword is an error that lists the valid ones.

    The best particle is ``result.state.best_x``. A call with the same ``objective`` object
    and the same structure of settings as one of the last eight reuses its dynamics and
    compiled programs, so a loop of calls over seeds, ``x0`` or the numbers ``lambda1``,
    ``sigma1``, ``lambda2``, ``sigma2``, ``dt`` and the α schedule's (a constant ``alpha``,
    or a :class:`~cbo_jax.schedules.Multiplicative`'s ``alpha0``, ``factor``, ``alpha_max``)
    compiles once. Any other setting (the noise, the dtype, the kind of α schedule, a zero
    ``sigma1``, ``lambda2`` or ``sigma2``, ``energy_tol``, ``max_abs``, the population's shape)
    compiles anew. For a sweep in one program see :func:`simulate` with ``num_runs`` or
    ``params``. As with :func:`jax.jit`, the objective is taken to be a pure
    function: a global or an attribute it reads, changed between two calls with the same
    function object, is not seen by the second (pass a new function, or put the value in
    the objective's fields, e.g. ``Rastrigin(shift=b)``).
    """
    import dataclasses

    from cbo_jax import population as pop
    from cbo_jax.dynamics.cbo import CBOConfig, looks_single_particle

    fields = [f.name for f in dataclasses.fields(CBOConfig)]
    own = ["x0", "key", "num_steps", "config", "dim", "num_particles", "init_bounds"]
    _checks.known_keywords("minimize", kwargs, own + fields + list(_SIMULATE_OPTIONS))
    cfg_kw = {k: v for k, v in kwargs.items() if k in fields}
    sim_kw = {k: v for k, v in kwargs.items() if k not in fields}
    _checks.config_with("minimize", CBOConfig, config, {})  # a CBOConfig (a dict is refused, naming the fix)
    key = _checks.as_key("key", key)
    num_runs = sim_kw.get("num_runs")
    if x0 is None:
        if dim is None:
            raise ValueError("minimize needs an initial population x0 or the dimension dim=d (for the default "
                             f"population of num_particles={num_particles} uniform in {tuple(init_bounds)}^d)")
        _checks.positive_int("dim", dim)
        _checks.positive_int("num_particles", num_particles, int32=False)
        dtype = cfg_kw.get("dtype", config.dtype if config is not None else "float32")  # a keyword overrides config
        if isinstance(init_bounds, (str, bytes)) or not hasattr(init_bounds, "__len__") or len(init_bounds) != 2:
            raise ValueError(f"init_bounds must be a pair (low, high), got {init_bounds!r}")
        low, high = (_checks.finite_number("init_bounds", b, f32=dtype != "float64") for b in init_bounds)
        if not low < high:
            raise ValueError(f"init_bounds must be (low, high) with low < high, got {tuple(init_bounds)}")
        k_init, key = jax.random.split(key)
        shape = (num_particles, dim) if num_runs is None else (num_runs, num_particles, dim)
        # else simulate explains what is missing; the flag is not in jax's Config stub (narrow ignore)
        wide = dtype == "float64" and jax.config.jax_enable_x64  # type: ignore[attr-defined]
        x0 = jax.random.uniform(k_init, shape, jnp.float64 if wide else jnp.float32, low, high)
    elif dim is not None:
        if isinstance(x0, (np.ndarray, jax.Array)):
            if np.shape(x0)[-1:] != (dim,):
                raise ValueError(f"dim={dim} does not match x0's last axis (x0 has shape {np.shape(x0)})")
        else:  # a pytree population: dim counts the numbers of one particle, over every leaf
            lead = 1 if num_runs is None else 2
            size = sum(math.prod(np.shape(leaf)[lead:]) for leaf in jax.tree_util.tree_leaves(x0))
            if size != dim:
                raise ValueError(f"dim={dim} does not match x0, a pytree population of {size} numbers per particle "
                                 "(dim is only needed without x0)")
    single = jax.tree_util.tree_map(lambda leaf: leaf[0], x0) if num_runs is not None else x0
    try:
        out = jax.eval_shape(objective, jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.float32), single))
        batched_ok = tuple(out.shape) == (pop.num_agents(single),)
    except Exception:  # noqa: BLE001 - maybe a single-particle function; decided below
        batched_ok = False
    # a host objective (objectives.from_numpy) is a population objective: not read as one of one particle
    single_ok = not getattr(objective, "host", False) and looks_single_particle(objective, single)
    if batched_ok and single_ok:  # both readings fit the shapes (N = d): they must agree
        _refuse_ambiguous_objective(objective, single)
    lift = not batched_ok and single_ok
    dynamics, numbers = _minimize_dynamics(objective, lift, config, cfg_kw)
    if numbers is not None and sim_kw.get("params") is None and sim_kw.get("initial_state") is None:
        sim_kw["params"] = numbers  # this call's numbers, traced: the dynamics may be another call's
    return simulate(dynamics, x0, key, num_steps, **sim_kw)
