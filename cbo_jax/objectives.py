"""Batched test objectives with known minimisers.

Every objective maps an array ``x`` of shape ``(..., d)`` to energies of shape
``(...)``: one call evaluates a whole population ``(N, d)``, or ``M`` runs at once
``(M, N, d)``. Each one can be shifted, ``f_b(x) = f(x - b)``, which moves the
minimiser to ``minimiser(d) + b``; this is how problems with several distinct known
minimisers are built (for example the clustered system's K objectives).

Two Rastrigin forms are provided and named apart, because libraries disagree:

* :class:`Rastrigin` -- CBXpy's un-normalised form ``10 d + Σ_i (x_i² - 10 cos 2π x_i)``
  (used by its reference success check, REFERENCE_NOTES §4);
* :class:`RastriginNormalized` -- the ``1/d``-normalised form
  ``(1/d) Σ_i (x_i² - 10 cos 2π x_i + 10)`` common in the CBO literature.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

__all__ = [
    "Objective",
    "Rastrigin",
    "RastriginNormalized",
    "Ackley",
    "Sphere",
    "Quadratic",
    "Rosenbrock",
    "Griewank",
    "StyblinskiTang",
    "OBJECTIVES",
    "get_objective",
    "cos_2pi",
]


# Taylor coefficients of cos(x) = Σ_k (-1)^k x^{2k} / (2k)!. On [0, π/2] the remainder
# after k = 0..7 is below 7e-11 (float32), after k = 0..11 below 1e-19 (float64).
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(12))


def cos_2pi(z):
    """``cos(2π z)`` with an exact period-1 reduction and an even polynomial.

    ``r = z - round(z)`` is exact in floating point, so the result is correct for any
    ``|z|`` (``jnp.cos(2π z)`` loses all accuracy once ``2π z`` is large); the reduced
    argument is folded to ``[0, 1/4]`` by ``cos(2π r) = -cos(2π (1/2 - r))`` and the
    polynomial evaluated on ``x = 2π r ∈ [0, π/2]`` (degree 14 in float32, 22 in float64).
    Max error about 2e-7 in float32,
    several times faster than XLA:CPU's ``cos`` (benchmarks/RESULTS.md).
    """
    r = jnp.abs(z - jnp.round(z))  # in [0, 1/2]
    flip = r > 0.25
    x = (2.0 * jnp.pi) * jnp.where(flip, 0.5 - r, r)
    x2 = x * x
    coeffs = _COS_TAYLOR[: 12 if x.dtype == jnp.float64 else 8]
    acc = jnp.asarray(coeffs[-1], x.dtype)
    for c in reversed(coeffs[:-1]):
        acc = acc * x2 + c
    return jnp.where(flip, -acc, acc)


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
    """Base class: ``obj(x)`` evaluates ``f(x - shift)`` over the last axis.

    Attributes:
      shift: scalar or ``(d,)`` translation ``b`` of the minimiser.
    """

    shift: Any = 0.0
    name = "objective"
    min_value = 0.0

    def __post_init__(self):
        try:
            shift = np.asarray(self.shift, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"shift must be a number or a vector of numbers, got {self.shift!r}") from None
        if shift.ndim > 1 or not np.all(np.isfinite(shift)):
            raise ValueError(f"shift must be a finite number or (d,) vector, got {self.shift!r}")

    def _f(self, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def _argmin(self, d: int) -> np.ndarray:
        return np.zeros(d)

    def __call__(self, x):
        x = jnp.asarray(x)
        return self._f(x - jnp.asarray(self.shift, x.dtype))

    def minimiser(self, d: int) -> np.ndarray:
        """The global minimiser in dimension ``d`` (float64 NumPy array)."""
        return self._argmin(d) + np.broadcast_to(np.asarray(self.shift, np.float64), (d,))

    def minimum(self, d: int) -> float:
        """The global minimum value in dimension ``d``."""
        return float(self.min_value)


class Rastrigin(Objective):
    """CBXpy's un-normalised Rastrigin: ``10 d + Σ (z_i² - 10 cos 2π z_i)``; min 0 at 0."""

    name = "rastrigin"

    def _f(self, z):
        d = z.shape[-1]
        return 10.0 * d + jnp.sum(z * z - 10.0 * cos_2pi(z), axis=-1)


class RastriginNormalized(Objective):
    """``1/d``-normalised Rastrigin: ``(1/d) Σ (z_i² - 10 cos 2π z_i + 10)``; min 0 at 0."""

    name = "rastrigin-normalized"

    def _f(self, z):
        return jnp.mean(z * z - 10.0 * cos_2pi(z) + 10.0, axis=-1)


class Ackley(Objective):
    """Ackley: ``-20 exp(-0.2 sqrt(mean z²)) - exp(mean cos 2π z) + 20 + e``; min 0 at 0."""

    name = "ackley"

    def _f(self, z):
        r = jnp.sqrt(jnp.mean(z * z, axis=-1))
        return -20.0 * jnp.exp(-0.2 * r) - jnp.exp(jnp.mean(cos_2pi(z), axis=-1)) + 20.0 + math.e


class Sphere(Objective):
    """Sphere: ``Σ z_i²``; min 0 at 0. Gradient Lipschitz constant 2."""

    name = "sphere"

    def _f(self, z):
        return jnp.sum(z * z, axis=-1)


class Quadratic(Objective):
    """Quadratic ``½ |z|²``; min 0 at 0, gradient ``z`` (Lipschitz constant 1)."""

    name = "quadratic"

    def _f(self, z):
        return 0.5 * jnp.sum(z * z, axis=-1)


class Rosenbrock(Objective):
    """Rosenbrock: ``Σ 100 (z_{i+1} - z_i²)² + (1 - z_i)²``; min 0 at (1, ..., 1)."""

    name = "rosenbrock"

    def _f(self, z):
        a, b = z[..., :-1], z[..., 1:]
        return jnp.sum(100.0 * (b - a * a) ** 2 + (1.0 - a) ** 2, axis=-1)

    def _argmin(self, d):
        return np.ones(d)


class Griewank(Objective):
    """Griewank: ``1 + Σ z_i²/4000 - Π cos(z_i / sqrt(i))``; min 0 at 0."""

    name = "griewank"

    def _f(self, z):
        i = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
        return 1.0 + jnp.sum(z * z, axis=-1) / 4000.0 - jnp.prod(jnp.cos(z / jnp.sqrt(i)), axis=-1)


class StyblinskiTang(Objective):
    """Styblinski–Tang: ``½ Σ (z⁴ - 16 z² + 5 z)``; min ``-39.16616570 d`` at ``z_i = -2.90353402``."""

    name = "styblinski-tang"
    _ZSTAR = -2.903534027771178

    def _f(self, z):
        return 0.5 * jnp.sum(z**4 - 16.0 * z * z + 5.0 * z, axis=-1)

    def _argmin(self, d):
        return np.full(d, self._ZSTAR)

    def minimum(self, d):
        z = self._ZSTAR
        return float(0.5 * d * (z**4 - 16 * z * z + 5 * z))


OBJECTIVES: dict[str, Callable[..., Objective]] = {
    cls.name: cls
    for cls in (Rastrigin, RastriginNormalized, Ackley, Sphere, Quadratic, Rosenbrock, Griewank, StyblinskiTang)
}


def get_objective(name: str, shift=0.0) -> Objective:
    """Build a registered objective by name (see ``OBJECTIVES``)."""
    try:
        cls = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose from {sorted(OBJECTIVES)}") from None
    return cls(shift=shift)
