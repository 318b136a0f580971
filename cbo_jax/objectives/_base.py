"""The base class of every test objective and the numerical helpers they share.

:class:`~cbo_jax.objectives.Objective` (``f(x - shift)`` over the last axis, the known
minimisers and minimum), :func:`~cbo_jax.objectives.cos_2pi` (an accurate, fast
``cos(2π z)``) and ``_norm`` (a square root whose gradient at 0 is finite). The objectives
themselves are in the sibling modules; :mod:`cbo_jax.objectives` is their public path.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np


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


def _norm(sq):
    """``sqrt(sq)`` whose derivative at ``sq = 0`` is finite (``jnp.sqrt``'s is infinite, and the chain
    rule's ``inf * 0`` would make ``jax.grad`` NaN at the origin). Where ``sq = 0`` the first derivative taken
    through it is 0: the gradient of functions that are smooth there (drop wave), and the subgradient
    ``0`` of the cone-shaped minima (Ackley, accelerated sinus). Higher derivatives at that point
    are not those of the function."""
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
    """Base class: ``obj(x)`` evaluates ``f(x - shift)`` over the last axis.

    Attributes:
      shift: scalar or ``(d,)`` translation ``b`` of the minimiser.
    """

    shift: Any = 0.0
    name = "objective"
    min_value = 0.0
    dim: ClassVar[int | None] = None  # a fixed dimension (2 for the planar test functions), or None
    # (low, high): the box the minimisers are known on, or None (all of R^d)
    domain: ClassVar[tuple[Any, Any] | None] = None
    isolated = True     # False: the minimisers form a continuum (NdSinus: a sphere)

    def __post_init__(self):
        try:
            given = np.asarray(self.shift)
            if given.dtype.kind not in "iuf":  # "1" would be read as 1.0, True as 1, complex drop its part
                raise TypeError
            shift = given.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"shift must be a number or a vector of numbers, got {self.shift!r}") from None
        if shift.ndim > 1 or not np.all(np.isfinite(shift)):
            raise ValueError(f"shift must be a finite number or (d,) vector, got {self.shift!r}")
        if isinstance(self.shift, np.ndarray):
            # a read-only copy: a caller's array changed later would move eager calls (minimiser(), f(x))
            # but not runs compiled with the old value
            own = np.array(self.shift, copy=True)
            own.flags.writeable = False
            object.__setattr__(self, "shift", own)

    def _f(self, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def _argmin(self, d: int) -> np.ndarray:
        return np.zeros(d)

    def _argmins(self, d: int) -> np.ndarray:
        return self._argmin(d)[None]

    def __call__(self, x):
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):  # integer particles: a fractional shift must not truncate
            x = x.astype(jnp.result_type(float))
        if x.ndim == 0 or x.shape[-1] == 0:  # scalar: numpy's "axis -1 is out of bounds"; d = 0: a silent 0
            raise ValueError(f"{type(self).__name__} takes particles of shape (..., d) with d >= 1, got shape "
                             f"{x.shape}")
        if self.dim is not None and x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__} is a function of R^{self.dim}; got particles of dimension "
                             f"{x.shape[-1]}")
        self._check_shift(x.shape[-1])
        return self._f(x - jnp.asarray(self.shift, x.dtype))

    def _check_dim(self, d: int) -> None:
        if self.dim is not None and d != self.dim:
            raise ValueError(f"{type(self).__name__} is a function of R^{self.dim}, not R^{d}")

    def _check_shift(self, d: int) -> None:
        n = np.shape(self.shift)[0] if np.ndim(self.shift) else 1
        if n not in (1, d):
            raise ValueError(f"{type(self).__name__}'s shift has {n} coordinates, but the particles have dimension {d}")

    def minimiser(self, d: int) -> np.ndarray:
        """The global minimiser in dimension ``d`` (float64 NumPy array); the first of several."""
        return self.minimisers(d)[0]

    def minimisers(self, d: int) -> np.ndarray:
        """Every known global minimiser in dimension ``d``, shape ``(K, d)``."""
        self._check_dim(d)
        self._check_shift(d)
        return np.asarray(self._argmins(d), np.float64) + np.broadcast_to(np.asarray(self.shift, np.float64), (d,))

    def minimum(self, d: int) -> float:
        """The global minimum value in dimension ``d``."""
        self._check_dim(d)
        return float(self.min_value)
