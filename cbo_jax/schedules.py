"""Schedules for the inverse temperature α of the consensus weights.

A schedule is a pair of pure functions, in the style of optax transformations:
``init() -> α_0`` and ``update(α, energy) -> α_next``, where ``energy`` holds the
``(N,)`` energies the step just used. The dynamics call ``update`` once per step,
after the particle update, exactly as CBXpy's schedulers do, so step ``k`` uses
``α_k``. All updates are jittable and run per independent run under ``vmap``.

The kind of schedule is static structure; its numbers are not. ``schedule.params()``
returns them as a small named tuple (:class:`ConstantParams`, :class:`MultiplicativeParams`,
:class:`EffectiveSampleSizeParams`), and ``init(params)`` / ``update(α, energy,
params=params)`` use those (possibly traced, vmapped) numbers instead of the schedule's
own fields. That is how the α numbers join a parameter sweep (:mod:`cbo_jax.params`).
``PARAM_RULES`` names the constraint each number must meet (checked on the host for
every point of a sweep).

Any other number of a dynamics (σ1, λ1, dt, or a dynamic's own number such as PolarCBO's
``kappa``) follows a *rule* given in the config's ``schedule`` mapping, e.g.
``schedule={"sigma1": Multiply(0.99, minimum=0.1)}`` (CBXpy's ``multiply(name='sigma',
...)``). A rule has the α schedules' ``update(value, energy, mask=None, params=None)``;
:class:`Multiply` scales, :class:`Chain` composes rules (applied in order, as CBXpy's
``scheduler([...])``). The rules' own numbers are static; the scheduled value lives in
the state's :class:`~cbo_jax.params.Params`, so it starts from the (possibly swept)
value and the history records it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from typing import NamedTuple

from cbo_jax import _checks
from cbo_jax.consensus import _real_energy, effective_sample_size

__all__ = ["Constant", "Multiplicative", "EffectiveSampleSize", "Multiply", "Chain", "as_schedule", "ConstantParams",
           "MultiplicativeParams", "EffectiveSampleSizeParams"]


class ConstantParams(NamedTuple):
    """The number of :class:`Constant`: ``alpha``."""

    alpha: object


class MultiplicativeParams(NamedTuple):
    """The numbers of :class:`Multiplicative`: ``alpha0``, ``factor``, ``alpha_max``."""

    alpha0: object
    factor: object
    alpha_max: object


class EffectiveSampleSizeParams(NamedTuple):
    """The numbers of :class:`EffectiveSampleSize` (``iterations`` stays static)."""

    eta: object
    alpha0: object
    alpha_min: object
    alpha_max: object


@dataclasses.dataclass(frozen=True)
class Constant:
    """α fixed for the whole run."""

    alpha: float = 1.0

    PARAM_RULES = {"alpha": "non_negative"}

    def __post_init__(self):
        _checks.non_negative("alpha", self.alpha)

    def params(self) -> ConstantParams:
        return ConstantParams(float(self.alpha))

    def init(self, params: ConstantParams | None = None):
        return float(self.alpha) if params is None else params.alpha

    def update(self, alpha, energy, mask=None, params=None):
        return alpha


@dataclasses.dataclass(frozen=True)
class Multiplicative:
    """``α_{k+1} = min(factor · α_k, alpha_max)`` (CBXpy's default: ×1.05 up to 1e5)."""

    alpha0: float = 1.0
    factor: float = 1.05
    alpha_max: float = 1e5

    PARAM_RULES = {"alpha0": "non_negative", "factor": "positive", "alpha_max": "non_negative"}

    def __post_init__(self):
        _checks.non_negative("alpha0", self.alpha0)
        _checks.positive("factor", self.factor)
        _checks.non_negative("alpha_max", self.alpha_max)
        if self.alpha0 > self.alpha_max:
            raise ValueError(f"alpha0 = {self.alpha0!r} is above alpha_max = {self.alpha_max!r}: the schedule would cut "
                             f"α down at its first step; give alpha_max >= alpha0")

    def params(self) -> MultiplicativeParams:
        return MultiplicativeParams(float(self.alpha0), float(self.factor), float(self.alpha_max))

    def init(self, params: MultiplicativeParams | None = None):
        return float(self.alpha0) if params is None else params.alpha0

    def update(self, alpha, energy, mask=None, params=None):
        p = self.params() if params is None else params
        return jnp.minimum(alpha * p.factor, p.alpha_max)


@dataclasses.dataclass(frozen=True)
class EffectiveSampleSize:
    """Choose α so that the effective sample size is ``eta · N``.

    Solves ``J_eff(α) = (Σ ω_i)² / Σ ω_i² = η N`` (Carrillo, Hoffmann, Stuart and Vaes,
    *Consensus-based sampling*, 2022) by bisection on ``log α`` over
    ``[alpha_min, alpha_max]``; ``J_eff`` is non-increasing in α. If even ``alpha_max``
    keeps ``J_eff > η N``, α is ``alpha_max``; if ``alpha_min`` already gives less,
    ``alpha_min``. The previous α is not used (the schedule adapts every step).
    """

    eta: float = 0.5
    alpha0: float = 1.0
    alpha_min: float = 1e-6
    alpha_max: float = 1e5
    iterations: int = 32

    # alpha_max >= alpha_min is checked too (cbo_jax.params.validate).
    PARAM_RULES = {"eta": "fraction", "alpha0": "non_negative", "alpha_min": "positive", "alpha_max": "positive"}

    def __post_init__(self):
        eta = _checks.positive("eta", self.eta)
        if eta > 1:
            raise ValueError(f"eta must lie in (0, 1], got {self.eta!r}")
        _checks.non_negative("alpha0", self.alpha0)
        _checks.positive("alpha_min", self.alpha_min)
        if _checks.positive("alpha_max", self.alpha_max) < self.alpha_min:
            raise ValueError(f"alpha_max ({self.alpha_max}) must be >= alpha_min ({self.alpha_min})")
        _checks.positive_int("iterations", self.iterations)

    def params(self) -> EffectiveSampleSizeParams:
        return EffectiveSampleSizeParams(float(self.eta), float(self.alpha0), float(self.alpha_min),
                                         float(self.alpha_max))

    def init(self, params: EffectiveSampleSizeParams | None = None):
        return float(self.alpha0) if params is None else params.alpha0

    def update(self, alpha, energy, mask=None, params=None):
        # Integer energies (an objective that counts) are promoted, as the consensus weights
        # promote them: the bisection runs on log α, which an integer dtype would truncate.
        energy = _real_energy(energy)
        n_valid = jnp.sum(jnp.isfinite(energy) if mask is None else (jnp.isfinite(energy) & mask))
        dtype = energy.dtype
        if params is None:
            target = self.eta * n_valid.astype(jnp.result_type(float))  # promotion's float, spelled out (strict mode)
            lo = jnp.asarray(math.log(self.alpha_min), dtype)
            hi = jnp.asarray(math.log(self.alpha_max), dtype)
        else:
            target = params.eta * n_valid.astype(jnp.result_type(params.eta))
            lo = jnp.log(jnp.asarray(params.alpha_min, dtype))
            hi = jnp.log(jnp.asarray(params.alpha_max, dtype))

        def body(_, bounds):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            too_small = effective_sample_size(energy, jnp.exp(mid), mask) > target  # α too small
            return jnp.where(too_small, mid, lo), jnp.where(too_small, hi, mid)

        lo, hi = jax.lax.fori_loop(0, self.iterations, body, (lo, hi))
        return jnp.exp(0.5 * (lo + hi)).astype(jnp.result_type(alpha))


@dataclasses.dataclass(frozen=True)
class Multiply:
    """``v_{k+1} = clip(factor · v_k, minimum, maximum)`` for any number ``v`` (CBXpy's ``multiply``).

    As a rule of a config's ``schedule`` mapping it updates that number after every step
    (``factor < 1`` anneals σ, for example); as an α schedule inside a :class:`Chain` it
    does the same to α. CBXpy's ``multiply`` caps at ``maximum`` only (its default
    ``1e5``); here both bounds are optional.
    """

    factor: float = 1.05
    maximum: float = math.inf
    minimum: float = 0.0

    def __post_init__(self):
        _checks.positive("factor", self.factor)
        if not (isinstance(self.maximum, (float, np.floating)) and self.maximum == math.inf):  # inf: no cap
            _checks.positive("maximum", self.maximum)
        _checks.non_negative("minimum", self.minimum)
        if self.minimum > self.maximum:
            raise ValueError(f"minimum ({self.minimum}) must be <= maximum ({self.maximum})")

    def update(self, value, energy=None, mask=None, params=None):
        new = value * self.factor
        if math.isfinite(self.maximum):
            new = jnp.minimum(new, self.maximum)
        if self.minimum > 0:
            new = jnp.maximum(new, self.minimum)
        return new


class Chain:
    """Rules applied one after the other each step (CBXpy's ``scheduler([r1, r2, ...])``).

    As an α schedule, ``init`` comes from the first element, which must be an α schedule
    (:class:`Constant`, :class:`Multiplicative`, :class:`EffectiveSampleSize`); each
    element then updates the value in turn, e.g.
    ``Chain(EffectiveSampleSize(eta=0.5), Multiply(1.0, maximum=1e3))`` caps an adaptive α.
    A chain's numbers are static (it has no ``params()``; sweep the elements' own
    numbers by building one chain per grid point instead).
    """

    def __init__(self, *rules):
        if not rules:
            raise ValueError("Chain needs at least one rule")
        for r in rules:
            if not hasattr(r, "update"):
                raise ValueError(f"Chain: {r!r} is not a schedule rule (it has no update(value, energy))")
        self.rules = tuple(rules)

    def __repr__(self):
        return f"Chain{self.rules!r}"

    # Value equality, as the dataclass rules have: two chains of equal rules are one setting
    # (minimize's cache of dynamics, a config's equality).
    def __eq__(self, other):
        return type(other) is type(self) and self.rules == other.rules

    def __hash__(self):
        return hash((type(self), self.rules))

    def init(self):
        first = self.rules[0]
        if not hasattr(first, "init"):
            raise ValueError("a Chain used as an α schedule needs an α schedule first (it gives α_0)")
        return first.init()

    def update(self, value, energy=None, mask=None, params=None):
        for r in self.rules:
            value = r.update(value, energy, mask)
        return value


def as_schedule(alpha):
    """A number becomes :class:`Constant`; a schedule is returned unchanged."""
    if hasattr(alpha, "init") and hasattr(alpha, "update"):
        return alpha
    if hasattr(alpha, "update"):  # a rule (Multiply) has no α_0 of its own
        raise ValueError(f"alpha: {alpha!r} is a rule without an initial value (no init()); give α_0 with an α "
                         f"schedule first, e.g. alpha=Chain(Constant(1.0), {alpha!r})")
    return Constant(_checks.non_negative("alpha", alpha))
