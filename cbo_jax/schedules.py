"""Schedules for the inverse temperature α of the consensus weights.

A schedule is a pair of pure functions, in the style of optax transformations:
``init() -> α_0`` and ``update(α, energy) -> α_next``, where ``energy`` holds the
``(N,)`` energies the step just used. The dynamics call ``update`` once per step,
after the particle update, exactly as CBXpy's schedulers do, so step ``k`` uses
``α_k``. All updates are jittable and run per independent run under ``vmap``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.consensus import effective_sample_size

__all__ = ["Constant", "Multiplicative", "EffectiveSampleSize", "as_schedule"]


@dataclasses.dataclass(frozen=True)
class Constant:
    """α fixed for the whole run."""

    alpha: float = 1.0

    def __post_init__(self):
        _checks.non_negative("alpha", self.alpha)

    def init(self) -> float:
        return float(self.alpha)

    def update(self, alpha, energy, mask=None):
        return alpha


@dataclasses.dataclass(frozen=True)
class Multiplicative:
    """``α_{k+1} = min(factor · α_k, alpha_max)`` (CBXpy's default: ×1.05 up to 1e5)."""

    alpha0: float = 1.0
    factor: float = 1.05
    alpha_max: float = 1e5

    def __post_init__(self):
        _checks.non_negative("alpha0", self.alpha0)
        _checks.positive("factor", self.factor)
        _checks.non_negative("alpha_max", self.alpha_max)

    def init(self) -> float:
        return float(self.alpha0)

    def update(self, alpha, energy, mask=None):
        return jnp.minimum(alpha * self.factor, self.alpha_max)


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

    def __post_init__(self):
        eta = _checks.positive("eta", self.eta)
        if eta > 1:
            raise ValueError(f"eta must lie in (0, 1], got {self.eta!r}")
        _checks.non_negative("alpha0", self.alpha0)
        _checks.positive("alpha_min", self.alpha_min)
        if _checks.positive("alpha_max", self.alpha_max) < self.alpha_min:
            raise ValueError(f"alpha_max ({self.alpha_max}) must be >= alpha_min ({self.alpha_min})")
        _checks.positive_int("iterations", self.iterations)

    def init(self) -> float:
        return float(self.alpha0)

    def update(self, alpha, energy, mask=None):
        n_valid = jnp.sum(jnp.isfinite(energy) if mask is None else (jnp.isfinite(energy) & mask))
        target = self.eta * n_valid
        dtype = energy.dtype
        lo = jnp.asarray(math.log(self.alpha_min), dtype)
        hi = jnp.asarray(math.log(self.alpha_max), dtype)

        def body(_, bounds):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            too_small = effective_sample_size(energy, jnp.exp(mid), mask) > target  # α too small
            return jnp.where(too_small, mid, lo), jnp.where(too_small, hi, mid)

        lo, hi = jax.lax.fori_loop(0, self.iterations, body, (lo, hi))
        return jnp.exp(0.5 * (lo + hi)).astype(jnp.result_type(alpha))


def as_schedule(alpha):
    """A number becomes :class:`Constant`; a schedule is returned unchanged."""
    if hasattr(alpha, "init") and hasattr(alpha, "update"):
        return alpha
    return Constant(_checks.non_negative("alpha", alpha))
