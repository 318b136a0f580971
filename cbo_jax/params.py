"""Numeric parameters of the particle systems as a traced pytree: sweeps are a ``vmap``.

A particle system has two kinds of settings (the split evosax makes between static
construction values and traced ``Params``):

* **static structure**, fixed when the dynamics are built: the objective(s), the noise
  kind, the dtype, the random-number layout, the kind of α schedule, the random batch
  size, which SDE terms exist at all;
* **numbers**, a :class:`Params` pytree carried in the state: ``λ1, σ1, λ2, σ2`` and the
  time step ``dt`` of FedCBO eq. (4)/(15) (Euler–Maruyama), and the α schedule's numbers
  (:mod:`cbo_jax.schedules`: ``alpha`` of a constant schedule, ``alpha0, factor,
  alpha_max`` of the multiplicative one, ...).

Because the numbers are traced, ``simulate(dyn, x0, key, T, params=P)`` runs a whole
grid of them as one jitted program: ``P``'s leaves carry the grid's axes (every leaf the
same shape, or shapes that broadcast to it), and the grid is ``vmap``-ped around the
runs (``num_runs`` seeds per point). :func:`grid` builds the outer product of a few
swept values around a dynamics' own numbers. :func:`validate` checks every entry on the
host before anything is traced, naming the parameter and the grid index.

A term whose strength is ``0`` in the dynamics' config (``sigma1``, ``lambda2``,
``sigma2``, or ``noise="none"``) is left out of the compiled step; a sweep cannot switch
it on (build the dynamics with a non-zero value to sweep it, zeros included).

The other dynamics of the CBX family (:mod:`cbo_jax.dynamics.family`) carry their own
numbers in ``Params.extra``, a named tuple given by their config's ``extra_params()``
(PSO's inertia ``m`` and friction ``gamma``, PolarCBO's kernel width ``kappa``, ...);
:func:`grid` sweeps them by their plain names and :func:`validate` checks them with the
config's ``EXTRA_RULES``.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, NamedTuple

import numpy as np

from cbo_jax import _checks

__all__ = ["Params", "defaults", "grid", "validate", "as_params", "grid_shape", "point", "GridIndexError", "flatten",
           "names", "indices", "in_dtype", "alpha_init", "alpha_update"]

SDE_FIELDS = ("lambda1", "sigma1", "lambda2", "sigma2", "dt")
_RULES = {"lambda1": "non_negative", "sigma1": "non_negative", "lambda2": "non_negative",
          "sigma2": "non_negative", "dt": "positive"}
_WORDS = {"non_negative": ">= 0", "positive": "> 0", "fraction": "in (0, 1]", "unit": "in [0, 1)"}


class Params(NamedTuple):
    """Numbers of a particle system (a pytree; every leaf may carry sweep axes).

    Attributes:
      lambda1: consensus drift ``λ1`` (FedCBO eq. (4)).
      sigma1: consensus noise ``σ1``.
      lambda2: gradient drift ``λ2``.
      sigma2: gradient noise ``σ2``.
      dt: Euler–Maruyama time step ``γ`` (eq. (15)).
      alpha: the α schedule's numbers (``schedule.params()``, e.g.
        :class:`cbo_jax.schedules.MultiplicativeParams`), or ``None`` for a user schedule
        without numbers of its own.
      extra: a dynamic's own numbers (a named tuple from its config's
        ``extra_params()``, e.g. PSO's ``m`` and ``gamma``), or ``None``.
    """

    lambda1: Any
    sigma1: Any
    lambda2: Any
    sigma2: Any
    dt: Any
    alpha: Any
    extra: Any = None


def _config_of(obj):
    config = getattr(obj, "config", obj)
    missing = [f for f in SDE_FIELDS + ("alpha",) if not hasattr(config, f)]
    if missing:
        raise ValueError(f"{type(config).__name__} has no parameter pytree (missing {missing}); "
                         "Params work with cbo(), clustered() and cb2o() dynamics or their configs")
    return config


def _schedule_params(schedule):
    return schedule.params() if hasattr(schedule, "params") else None


def _extra_params(cfg):
    return cfg.extra_params() if hasattr(cfg, "extra_params") else None


def defaults(dynamics_or_config) -> Params:
    """The numbers a dynamics (or a :class:`~cbo_jax.CBOConfig` / ``ClusteredConfig``) was built with."""
    cfg = _config_of(dynamics_or_config)
    lambda1, sigma1, lambda2, sigma2, dt = (float(getattr(cfg, f)) for f in SDE_FIELDS)
    return Params(lambda1, sigma1, lambda2, sigma2, dt, alpha=_schedule_params(cfg.alpha), extra=_extra_params(cfg))


def names(params: Params) -> list[str]:
    """Dotted names of the leaves, in ``jax.tree_util`` order (``alpha.alpha0``, ..., ``extra.kappa``)."""
    out = list(SDE_FIELDS)
    if params.alpha is not None:
        out += [f"alpha.{f}" for f in params.alpha._fields]
    if params.extra is not None:
        out += [f"extra.{f}" for f in params.extra._fields]
    return out


def _leaves(params: Params) -> list:
    return ([getattr(params, f) for f in SDE_FIELDS] + ([] if params.alpha is None else list(params.alpha))
            + ([] if params.extra is None else list(params.extra)))


def _rebuild(params: Params, leaves: list) -> Params:
    k = len(SDE_FIELDS)
    n_alpha = 0 if params.alpha is None else len(params.alpha)
    alpha = None if params.alpha is None else type(params.alpha)(*leaves[k:k + n_alpha])
    extra = None if params.extra is None else type(params.extra)(*leaves[k + n_alpha:])
    lambda1, sigma1, lambda2, sigma2, dt = leaves[:k]
    return Params(lambda1, sigma1, lambda2, sigma2, dt, alpha=alpha, extra=extra)


def grid(dynamics_or_config, **axes) -> Params:
    """The outer product of swept values around a dynamics' own numbers.

    ``grid(dyn, sigma1=[0.5, 1.0], alpha=[10, 100], dt=[0.01, 0.02])`` is a ``(2, 2, 2)``
    grid (axes in the order given). Keys are :class:`Params` fields (``lambda1``,
    ``sigma1``, ``lambda2``, ``sigma2``, ``dt``) or the α schedule's numbers (``alpha`` of
    a constant schedule; ``alpha0``, ``factor``, ``alpha_max`` of a multiplicative one;
    ``eta``, ``alpha0``, ``alpha_min``, ``alpha_max`` of the effective-sample-size one).
    Every leaf of the result has the full grid shape (float64 NumPy arrays).
    """
    cfg = _config_of(dynamics_or_config)
    base = defaults(cfg)
    alpha_fields = () if base.alpha is None else base.alpha._fields
    extra_fields = () if base.extra is None else base.extra._fields
    valid = list(SDE_FIELDS) + [f for f in alpha_fields if f not in SDE_FIELDS] + [
        f for f in extra_fields if f not in SDE_FIELDS and f not in alpha_fields]
    sizes: list[int] = []
    for name, values in axes.items():
        if name not in valid:
            raise ValueError(f"grid: unknown parameter {name!r} for a {type(cfg.alpha).__name__} α schedule; "
                             f"valid: {valid}")
        arr = _real_array(f"grid: {name}", values)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"grid: {name} must be a non-empty 1-D sequence of values, got shape {arr.shape}")
        sizes.append(arr.size)
    shape = tuple(sizes)
    leaves = {n: np.full(shape, v, np.float64) for n, v in zip(names(base), _leaves(base))}
    for axis, (name, values) in enumerate(axes.items()):
        arr = np.asarray(values, dtype=np.float64)
        view = arr.reshape((1,) * axis + (arr.size,) + (1,) * (len(shape) - axis - 1))
        key = name if name in SDE_FIELDS else (f"alpha.{name}" if name in alpha_fields else f"extra.{name}")
        leaves[key] = np.broadcast_to(view, shape).copy()
    return _rebuild(base, [leaves[n] for n in names(base)])


def as_params(params, dynamics_or_config) -> Params:
    """Accept :class:`Params` or the clustered system's 4-field ``SDEParams`` (the rest from the config)."""
    cfg = _config_of(dynamics_or_config)
    if isinstance(params, Params):
        if params.extra is None and _extra_params(cfg) is not None:  # the dynamic's own numbers from its config
            return params._replace(extra=_extra_params(cfg))
        return params
    fields = getattr(params, "_fields", None)
    if fields == ("lambda1", "sigma1", "lambda2", "sigma2"):
        base = defaults(cfg)
        return base._replace(**{f: getattr(params, f) for f in fields})
    raise ValueError(f"params must be a cbo_jax.params.Params (see cbo_jax.params.grid), got {type(params).__name__}")


def _real_array(what: str, values) -> np.ndarray:
    """``values`` as float64, refused unless real numbers: a complex value would lose its imaginary
    part (a warning, not an error), a bool or a numeric string would be read as a number, None as NaN."""
    try:
        raw = np.asarray(values)
        if raw.dtype.kind in "bcSUMm" or (raw.dtype.kind == "O" and not all(
                isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                for v in raw.ravel())):
            raise TypeError
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must hold real numbers, got {values!r}") from None


def _where(name: str, index, shape) -> str:
    if not shape:
        return f"params.{name}"
    idx = ", ".join(str(int(i)) for i in index)
    return f"params.{name}[{idx}]"


def validate(params, dynamics_or_config) -> tuple[int, ...]:
    """Check every entry of a (possibly swept) ``params`` on the host; return the grid shape.

    Raises ``ValueError`` naming the parameter and the grid index for: a value that is not
    a real number (bools, strings and complex numbers included), NaN or infinity, a value out
    of range (``λ1, σ1, λ2, σ2 >= 0``, ``dt > 0``, the schedule's rules in ``PARAM_RULES``,
    ``alpha_min <= alpha_max``, ``alpha0 <= alpha_max`` of a multiplicative schedule), leaves
    whose axes do not broadcast to one grid or make a grid of no points, an α-number tuple
    of another schedule kind, or a sweep that
    switches on a term the dynamics were built without (``sigma1``, ``lambda2``, ``sigma2`` at
    ``0``, and a config's ``switched_off()`` terms: ``drift_constrained_cbo``'s ``sigma_indep``
    at ``0``, ``reg_combination_cbo``'s ``eps`` at or above 1e15).
    """
    cfg = _config_of(dynamics_or_config)
    params = as_params(params, cfg)
    schedule = cfg.alpha
    expected = _schedule_params(schedule)
    if (expected is None) != (params.alpha is None) or (
            expected is not None and type(params.alpha) is not type(expected)):
        raise ValueError(f"params.alpha must be {type(expected).__name__ if expected is not None else 'None'} "
                         f"(the dynamics' α schedule is {type(schedule).__name__}), got {type(params.alpha).__name__}")
    leaf_names = names(params)
    arrays = []
    for name, leaf in zip(leaf_names, _leaves(params)):
        arrays.append(_real_array(f"params.{name}", leaf))
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        swept = ", ".join(f"{n} has shape {a.shape}" for n, a in zip(leaf_names, arrays) if a.ndim)
        raise ValueError(f"params: the sweep axes do not match ({swept}); give every swept parameter the grid's "
                         "shape, or shapes that broadcast to it (cbo_jax.params.grid builds an outer product)") from None
    if 0 in shape:  # a grid of no points would run into a bare IndexError inside simulate
        empty = ", ".join(f"{n} has shape {a.shape}" for n, a in zip(leaf_names, arrays) if 0 in a.shape)
        raise ValueError(f"params: the sweep grid {tuple(shape)} has no points ({empty}); every swept parameter "
                         "needs at least one value")
    expected_extra = _extra_params(cfg)
    if (expected_extra is None) != (params.extra is None) or (
            expected_extra is not None and type(params.extra) is not type(expected_extra)):
        raise ValueError(f"params.extra must be {type(expected_extra).__name__ if expected_extra is not None else 'None'}"
                         f" (the numbers of a {type(cfg).__name__}), got {type(params.extra).__name__}")
    rules = dict(_RULES)
    rules.update({f"alpha.{k}": v for k, v in getattr(schedule, "PARAM_RULES", {}).items()})
    rules.update({f"extra.{k}": v for k, v in getattr(cfg, "EXTRA_RULES", {}).items()})
    full = {n: np.broadcast_to(a, shape) for n, a in zip(leaf_names, arrays)}
    for name, arr in full.items():
        bad = ~np.isfinite(arr)
        if bad.any():
            idx = np.argwhere(bad)[0] if arr.ndim else ()
            raise ValueError(f"{_where(name, idx, shape)} = {float(arr[tuple(idx)])!r}: {name.split('.')[-1]} must be "
                             f"finite{_grid_note(idx, shape)}")
        big = np.abs(arr) > _checks.FLOAT32_MAX if getattr(cfg, "dtype", "float32") == "float32" else np.zeros(1, bool)
        if big.any():
            idx = np.argwhere(big)[0] if arr.ndim else ()
            raise ValueError(f"{_where(name, idx, shape)} = {float(arr[tuple(idx)])!r} overflows float32, the run's "
                             f"dtype{_grid_note(idx, shape)}")
        rule = rules.get(name)
        if rule is None:
            continue
        bad = {"non_negative": arr < 0, "positive": arr <= 0, "fraction": (arr <= 0) | (arr > 1),
               "unit": (arr < 0) | (arr >= 1)}[rule]
        if bad.any():
            idx = np.argwhere(bad)[0] if arr.ndim else ()
            raise ValueError(f"{_where(name, idx, shape)} = {float(arr[tuple(idx)])!r}: {name.split('.')[-1]} must "
                             f"be {_WORDS[rule]}{_grid_note(idx, shape)}")
    if "alpha.alpha_min" in full and "alpha.alpha_max" in full:
        bad = full["alpha.alpha_max"] < full["alpha.alpha_min"]
        if bad.any():
            idx = np.argwhere(bad)[0] if bad.ndim else ()
            raise ValueError(f"{_where('alpha.alpha_max', idx, shape)} is below alpha_min{_grid_note(idx, shape)}")
    from cbo_jax.schedules import MultiplicativeParams

    if isinstance(params.alpha, MultiplicativeParams):  # as Multiplicative's own constructor refuses
        bad = full["alpha.alpha0"] > full["alpha.alpha_max"]
        if bad.any():
            idx = np.argwhere(bad)[0] if bad.ndim else ()
            raise ValueError(f"{_where('alpha.alpha0', idx, shape)} = {float(full['alpha.alpha0'][tuple(idx)])!r} is "
                             f"above alpha_max = {float(full['alpha.alpha_max'][tuple(idx)])!r}: the schedule would cut "
                             f"α down at its first step{_grid_note(idx, shape)}")
    off = {"sigma1": cfg.sigma1 == 0 or getattr(cfg, "noise", "") == "none", "lambda2": cfg.lambda2 == 0,
           "sigma2": cfg.sigma2 == 0}
    for name, left_out in off.items():
        if left_out and np.any(full[name] != 0):
            idx = np.argwhere(full[name] != 0)[0] if shape else ()
            why = "noise='none'" if name == "sigma1" and getattr(cfg, "noise", "") == "none" else f"{name}=0"
            raise ValueError(f"{_where(name, idx, shape)} = {float(full[name][tuple(idx)])!r}, but the dynamics were "
                             f"built with {why}, which leaves that term out of the compiled step; build them with a "
                             f"non-zero {name} to sweep it{_grid_note(idx, shape)}")
    # A dynamic's own numbers that decide at build time whether a term is compiled at all
    # (the config's switched_off(): name -> (values that need the term, why it is out, how to keep it)).
    for name, (needs, why, fix) in (cfg.switched_off() if hasattr(cfg, "switched_off") else {}).items():
        bad = np.asarray(needs(full[name]))
        if bad.any():
            idx = np.argwhere(bad)[0] if shape else ()
            short = name.split(".")[-1]
            raise ValueError(f"{_where(name, idx, shape)} = {float(full[name][tuple(idx)])!r}, but the dynamics were "
                             f"built with {why} out of the compiled step; build them with {fix} to sweep "
                             f"{short}{_grid_note(idx, shape)}")
    return tuple(int(s) for s in shape)


def _grid_note(idx, shape) -> str:
    return f" (grid index {tuple(int(i) for i in idx)} of a {tuple(shape)} grid)" if shape else ""


def grid_shape(params: Params) -> tuple[int, ...]:
    """The broadcast shape of the leaves (``()`` for a single point)."""
    return tuple(np.broadcast_shapes(*(np.shape(v) for v in _leaves(params))))


def flatten(params: Params, shape: tuple[int, ...], dtype) -> Params:
    """Leaves broadcast to ``shape`` and flattened to one sweep axis of ``prod(shape)`` points."""
    size = math.prod(shape)
    return _rebuild(params, [np.broadcast_to(np.asarray(v, np.float64), shape).reshape(size).astype(dtype)
                             for v in _leaves(params)])


class GridIndexError(ValueError, IndexError):
    """An index that does not address a point of a sweep grid (:func:`point`).

    Both a ``ValueError`` (as the grid's other errors) and an ``IndexError`` (as NumPy's
    out-of-range error it replaces), like NumPy's ``AxisError``."""


def point(params: Params, index) -> Params:
    """The numbers at one grid index (leaves become Python floats).

    ``index`` holds one integer per grid axis (a single integer for a one-axis grid; ``()``
    for a single point, grid shape ``()``). Negative entries count from the end of their
    axis, as in NumPy (``-1`` is the last point). An index of the wrong length, with
    non-integer entries, or out of range raises :class:`GridIndexError` (a ``ValueError``
    and an ``IndexError``) naming the index and the grid's shape.
    """
    shape = grid_shape(params)
    entries = (index,) if np.ndim(index) == 0 else tuple(np.asarray(index, dtype=object).reshape(-1))
    if np.ndim(index) > 1 or not all(_is_index(i) for i in entries):
        raise GridIndexError(f"grid index entries must be integers, got {index!r} for a grid of shape {shape}")
    index = tuple(operator.index(i) for i in entries)
    if len(index) != len(shape):
        raise GridIndexError(f"index {index} does not address a grid of shape {shape}")
    if not all(-s <= i < s for i, s in zip(index, shape)):
        raise GridIndexError(f"index {index} is out of range for a grid of shape {shape} (entry k must lie in "
                             f"[-shape[k], shape[k]))")
    return _rebuild(params, [float(np.broadcast_to(np.asarray(v, np.float64), shape)[index])
                             for v in _leaves(params)])


def _is_index(i) -> bool:
    """An integer (anything with ``__index__``), not a bool."""
    if isinstance(i, (bool, np.bool_)):
        return False
    try:
        operator.index(i)
    except TypeError:
        return False
    return True


def indices(shape: tuple[int, ...]):
    """Every grid index of ``shape`` in C order (the order of the flattened sweep axis)."""
    return itertools.product(*(range(s) for s in shape))


def in_dtype(params: Params, dtype) -> Params:
    """Every leaf as a JAX array of ``dtype`` (traceable; used by the dynamics' ``init``)."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), params)


def alpha_init(schedule, alpha_params):
    """``α_0`` of ``schedule`` from its (possibly traced) numbers; user schedules without numbers use their own."""
    return schedule.init() if alpha_params is None else schedule.init(alpha_params)


def alpha_update(schedule, alpha, energy, alpha_params, mask=None):
    """``α_{k+1}`` of ``schedule`` from its (possibly traced) numbers."""
    if alpha_params is None:
        return schedule.update(alpha, energy) if mask is None else schedule.update(alpha, energy, mask)
    return schedule.update(alpha, energy, mask, params=alpha_params)
