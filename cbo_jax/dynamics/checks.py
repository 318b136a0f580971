"""Host-side checks of a particle system's inputs, made once before anything is compiled.

A population must have an agent axis (after the run axis of ``num_runs`` runs), at least
one particle of at least one coordinate, real and finite numbers; an objective must map it
to one real energy per particle. Each failure is a ``ValueError`` naming the argument and
what to do.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.dynamics.base import Particles

PyTree = Any

__all__ = ["check_population", "check_objective", "looks_single_particle", "require_array",
           "host_eval", "check_values"]


def check_population(name: str, x0: PyTree, objective, num_runs: int | None = None, extra=None, *,
                     gradient: str = "") -> int:
    """Host-side checks before compilation; returns ``N``.

    ``x0`` must have a leading agent axis (after the run axis when ``num_runs`` is
    given), hold only finite values, and ``objective`` must map it to ``(N,)``.
    ``extra(single_run_x0, N)``, if given, runs after the checks of ``x0`` and before the
    objective is traced (a dynamic's own checks: mirror maps, constraints, ...).
    ``gradient``: the gradient terms' settings when the dynamics differentiate the
    objective (its energies must then be floats; see :func:`check_objective`).
    """
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(f"{name} has no array leaves")
    lead = 2 if num_runs is not None else 1
    for leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) < lead + (1 if isinstance(x0, (np.ndarray, jax.Array)) else 0):
            want = "(M, N, d)" if num_runs is not None else "(N, d)"
            hint = ""
            if isinstance(x0, (list, tuple)) and not shape:  # its numbers are a pytree's scalar leaves
                hint = (f": {name} is a Python {type(x0).__name__} of numbers, which JAX reads as a pytree of scalars; "
                        f"pass an array (np.asarray({name}))")
            raise ValueError(f"{name} must have shape {want} (or be a stacked pytree), got shape {shape}{hint}")
        if num_runs is not None and shape[0] != num_runs:
            raise ValueError(f"{name} has {shape[0]} runs on its leading axis, but num_runs={num_runs}")
    single = jax.tree_util.tree_map(lambda leaf: leaf[0], x0) if num_runs is not None else x0
    n = pop.num_agents(single)
    if n < 1:
        raise ValueError(f"{name} needs at least one particle (N >= 1), got N={n}")
    d = sum(math.prod(np.shape(leaf)[1:]) for leaf in jax.tree_util.tree_leaves(single))
    if d < 1:  # every step would run, on nothing: an objective of no coordinates, a "consensus" of empty points
        raise ValueError(f"{name} has no coordinates per particle (d = 0, shape "
                         f"{tuple(np.shape(leaves[0]))}); a particle needs at least one (d >= 1)")
    for path, leaf in jax.tree_util.tree_leaves_with_path(x0):  # else strings fail in isfinite, complex loses its part
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            raise ValueError(f"{name}{jax.tree_util.keystr(path)} must hold real numbers (float or integer), got "
                             f"dtype {dtype}" + (": take the real part or split it into two real coordinates"
                                                 if jnp.issubdtype(dtype, jnp.complexfloating) else ""))
    _checks.all_finite(name, x0)
    if extra is not None:
        extra(single, n)
    try:
        check_objective(name, objective, single, n, gradient=gradient)
    except ValueError as err:
        if num_runs is None and isinstance(x0, (np.ndarray, jax.Array)) and np.ndim(x0) == 3:
            shape = tuple(np.shape(x0))
            raise ValueError(f"{err} ({name} has shape {shape}: if its leading axis holds {shape[0]} independent "
                             f"runs of {shape[1]} particles, pass num_runs={shape[0]})") from err
        raise
    return n


def check_objective(name: str, objective, single: PyTree, n: int, what: str = "objective", *,
                    gradient: str = "") -> None:
    """Trace ``objective`` on the shapes of one run's population ``single`` (``N = n``
    agents): it must run and return ``(n,)`` real (float or integer) energies; a clear ``ValueError``
    otherwise. ``gradient`` (the gradient terms' settings, when the dynamics have them): the
    energies must be floats, which ``jax.grad`` can differentiate."""
    if gradient and getattr(objective, "host", False):
        raise ValueError(f"{gradient}: the gradient terms differentiate the {what}, and a host objective "
                         "(objectives.from_numpy) has no derivative in JAX; build the dynamics without gradient "
                         "terms, or write the objective with jax.numpy")
    try:
        out = jax.eval_shape(objective, jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.float32), single))
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise ValueError(f"{what} failed on a population shaped like {name}: {err}{_not_jax_hint(err)}") from err
    if tuple(out.shape) != (n,):
        hint = ""
        one = _one_particle_shape(objective, single)
        if one == ():
            hint = (" It looks like an objective of ONE particle (it maps one particle to a scalar): lift it with "
                    "cbo_jax.population.per_agent(f) (cbo_jax.minimize does this by itself).")
        elif one is not None and len(one) > 0 and int(np.prod(one)) == 1:
            hint = (" On one particle it returns an array of one element, not a scalar: return a scalar (drop "
                    "keepdims=True, or end with .squeeze()) and it is taken as an objective of one particle, or "
                    "return one energy per row of the population.")
        raise ValueError(f"{what} must return one energy per particle, shape ({n},); got {tuple(out.shape)}."
                         + hint)
    if not (jnp.issubdtype(out.dtype, jnp.floating) or jnp.issubdtype(out.dtype, jnp.integer)):
        raise ValueError(f"{what} must return real energies (a float or integer array); got dtype {out.dtype}"
                         + (": take the real part or the modulus" if jnp.issubdtype(out.dtype, jnp.complexfloating)
                            else ": cast it to float (x.astype(float))"))
    if gradient and not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"{gradient}: the gradient terms differentiate the {what}, which returns {out.dtype} "
                         "energies; return floats (a differentiable objective), or build the dynamics without "
                         "gradient terms")


def _not_jax_hint(err: Exception) -> str:
    """How to wrap an objective that is not written in JAX, when ``err`` says it is one."""
    if isinstance(err, (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
                        jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError)):
        return ("\nThe objective reads the particles' values in Python or NumPy (np.asarray, float(), if/while on "
                "them, a library call), which a compiled step cannot do. Write it with jax.numpy, or wrap the "
                "NumPy function: cbo_jax.objectives.from_numpy(f) for f(x: (n, d) array) -> (n,) energies "
                "(vectorized=False for f(one particle (d,)) -> scalar); it then runs on the host, once per step "
                "(docs/guides/black_box.md).")
    return ""


def _one_particle_shape(objective, population: PyTree) -> tuple[int, ...] | None:
    """The shape ``objective`` returns on one particle (one row of ``population``); ``None`` when it fails
    there."""
    row = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], jnp.float32), population)
    try:
        return tuple(jax.eval_shape(objective, row).shape)
    except Exception:  # noqa: BLE001 - any failure means "not an objective of one particle"
        return None


def looks_single_particle(objective, population: PyTree) -> bool:
    """Whether ``objective`` maps one particle (one row of ``population``) to a scalar."""
    return _one_particle_shape(objective, population) == ()


def require_array(name: str, x0, what: str) -> int:
    """Host check: ``x0`` (one run) is an ``(N, d)`` array, as ``what`` needs; returns ``d``."""
    if not isinstance(x0, (np.ndarray, jax.Array)) or np.ndim(x0) != 2:
        raise ValueError(f"{name}: {what} needs an (N, d) array population, got "
                         f"{type(x0).__name__} of shape {np.shape(x0) if hasattr(x0, 'shape') else '?'}; "
                         "flatten a pytree population with cbo_jax.population.ravel")
    return int(np.shape(x0)[1])


def host_eval(what: str, fn, x0, name: str = "x0", dtype=np.float64):
    """Evaluate ``fn`` on the host population ``x0`` (eagerly, before any simulation is compiled).

    A failure inside ``fn`` (a map, constraint or surface built for another dimension: a
    reshape, broadcasting or ``dot_general`` error) is re-raised as a ``ValueError`` that names
    ``what`` and the particles' shape."""
    try:
        with jax.ensure_compile_time_eval():
            return np.asarray(fn(jnp.asarray(np.asarray(x0), jax.dtypes.canonicalize_dtype(dtype))))
    except Exception as err:  # noqa: BLE001 - re-raised with context
        shape = tuple(np.shape(x0))
        raise ValueError(f"{what} failed on {name} of shape {shape} (particles in d = {shape[-1]}); was it built "
                         f"for another dimension? {type(err).__name__}: {err}") from err


def check_values(what: str, values, shape) -> None:
    """Raise unless ``values`` has ``shape`` and only finite entries (host side)."""
    values = np.asarray(values)
    if values.shape != tuple(shape):
        raise ValueError(f"{what} returned shape {values.shape} at the initial particles; expected {tuple(shape)}")
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{what} returned a non-finite value (NaN or inf) at the initial particles "
                         f"(first at particle {row}): check its domain")


# ----------------------------------------------------------------------------------------
# A state to continue (simulate's initial_state)
# ----------------------------------------------------------------------------------------


def _state_levels(state, num_runs) -> int:
    """Leading vmapped axes of a state to continue: a sweep's grid axes and the run axis."""
    step = getattr(state, "step", None)
    if step is None:
        return int(num_runs is not None)
    shape = np.shape(step)
    if num_runs is not None and (not shape or shape[-1] != num_runs):
        runs = f"{shape[-1]} runs on its run axis" if shape else "no run axis"
        raise ValueError(f"initial_state has {runs}, but num_runs={num_runs}: pass the num_runs it was made with "
                         "(None for a state of one run)")
    return len(shape)


def _describe(value: Any) -> str:
    """A short name for a state field's value in an error message."""
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        kind = "key" if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key) else np.dtype(value.dtype).name
        return f"an array {kind}{tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _same_structure(a: Any, b: Any) -> bool:
    treedef: Any = jax.tree_util.tree_structure(a)  # Any: the PyTreeDef stub declares no __eq__
    return bool(treedef == jax.tree_util.tree_structure(b))


def _differences(got: Any, want: Any, path: str) -> list[str]:
    """Where two states' tree structures differ, field by field (named tuples are descended)."""
    if _same_structure(got, want):
        return []
    fields = getattr(want, "_fields", None)
    if fields and type(got) is type(want):
        return [d for f in fields for d in _differences(getattr(got, f), getattr(want, f), f"{path}.{f}")]
    return [f"its {path or 'state'} is {_describe(got)} where these dynamics have {_describe(want)}"]


def _check_state_fits(dynamics, state: Any, levels: int) -> None:
    """Refuse an ``initial_state`` made by another dynamics or configuration, before compiling.

    The state ``dynamics.init`` would make from the state's own particles and key (its
    shapes only: :func:`jax.eval_shape`, nothing is compiled or run) must have the same
    type, fields and tree structure as ``state`` (less its ``levels`` leading run and grid
    axes). A CBOMemory or PSO state given to plain CBO, or a plain CBO state given to PSO,
    would fail deep inside the step (an ``AttributeError``) or, worse, run.
    """
    x, key = getattr(state, "x", None), getattr(state, "key", None)
    if x is None or key is None or not hasattr(key, "shape"):
        return  # not a particle state this check knows how to re-initialise

    def spec(v):
        return jax.ShapeDtypeStruct(np.shape(v)[levels:], v.dtype) if hasattr(v, "dtype") else v

    x0: Any = jax.tree_util.tree_map(spec, x)
    firsts = [x0]  # what init takes: the particles, or a clustered state's Particles
    fields = ("label", "malicious", "pid")
    if all(hasattr(state, f) for f in fields):
        firsts.insert(0, Particles(x0, *(jax.tree_util.tree_map(spec, getattr(state, f)) for f in fields)))
    like = None
    for first in firsts:
        try:
            like = jax.eval_shape(dynamics.init, first, spec(key))
            break
        except Exception:  # noqa: BLE001 - these particles do not suit init: try the next form
            continue
    if like is None:
        return  # nothing init accepts: leave it to the step
    if _same_structure(state, like):
        return
    name = type(getattr(dynamics, "config", None)).__name__
    diff = "; ".join(_differences(state, like, "")).replace("its .", "its ")
    raise ValueError(f"initial_state (a {type(state).__name__}) was made by other dynamics or another configuration "
                     f"than these ({name}): "
                     f"{diff}. Continue a state with the dynamics (same function and config) that made it, or start "
                     "these dynamics from its particles: simulate(dynamics, state.x, key, ...)")
