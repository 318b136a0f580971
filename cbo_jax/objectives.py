"""Batched test objectives with known minimisers.

Every objective maps an array ``x`` of shape ``(..., d)`` to energies of shape
``(...)``: one call evaluates a whole population ``(N, d)``, or ``M`` runs at once
``(M, N, d)``. Each one can be shifted, ``f_b(x) = f(x - b)``, which moves the
minimiser to ``minimiser(d) + b``; this is how problems with several distinct known
minimisers are built (for example the clustered system's K objectives).

Two Rastrigin forms are provided and named apart, because libraries disagree:

* :class:`Rastrigin` -- CBXpy's un-normalised form ``10 d + Σ_i (x_i² - 10 cos 2π x_i)``
  (used by CBXpy's reference success check, :mod:`cbo_jax.experiments.rastrigin_success`);
* :class:`RastriginNormalized` -- the ``1/d``-normalised form
  ``(1/d) Σ_i (x_i² - 10 cos 2π x_i + 10)`` common in the CBO literature.

The rest of CBXpy's test functions (``cbx.objectives``) are here too, each with its
known minimisers (``minimisers(d)``: all of them, ``minimiser(d)``: the first):
Himmelblau, three-hump camel, McCormick, Easom, Bukin N.6, cross-in-tray, drop wave,
Hölder table, snowflake, eggholder, Michalewicz, the multiplicative multimodal
Rastrigin and Ackley, accelerated sinus, n-d sinus, the 4th-order polynomial, banana,
bimodal, unimodal and Gaussian-mixture ``-log`` densities. The 2-D ones have ``dim = 2``
(another dimension is an error when the objective is traced); ``domain`` is the box a
minimiser is known on (eggholder's lies on its boundary). Two of CBXpy's ``minima``
attributes are wrong and corrected here: Bukin N.6's minimiser is ``(-10, 1)`` (CBXpy
lists ``(0, 0)``, where ``f = 0.1``), and CBXpy's ``drop_wave`` is not the textbook drop
wave but ``-(1 + cos 12r) exp(-r²/(2(1 + r²/1000)))``, minimum ``-2`` at ``0``, which is
what :class:`DropWave` computes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar

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
    "Himmelblau",
    "ThreeHumpCamel",
    "McCormick",
    "Easom",
    "Bukin6",
    "CrossInTray",
    "DropWave",
    "HolderTable",
    "Snowflake",
    "Eggholder",
    "Michalewicz",
    "RastriginMultimodal",
    "AckleyMultimodal",
    "AcceleratedSinus",
    "NdSinus",
    "P4thOrder",
    "Banana",
    "Bimodal",
    "Unimodal",
    "GaussianMixture",
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


def _norm(sq):
    """``sqrt(sq)`` whose derivative at ``sq = 0`` is finite (``jnp.sqrt``'s is infinite, and the chain
    rule's ``inf * 0`` made ``jax.grad`` NaN at the origin). Where ``sq = 0`` the first derivative taken
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
            if given.dtype.kind not in "iuf":  # "1" read as 1.0, True as 1, complex dropping its part
                raise TypeError
            shift = given.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"shift must be a number or a vector of numbers, got {self.shift!r}") from None
        if shift.ndim > 1 or not np.all(np.isfinite(shift)):
            raise ValueError(f"shift must be a finite number or (d,) vector, got {self.shift!r}")
        if isinstance(self.shift, np.ndarray):
            # a read-only copy: a caller's array changed later moved eager calls (minimiser(), f(x))
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
        if x.ndim == 0 or x.shape[-1] == 0:  # a scalar was numpy's "axis -1 is out of bounds", d = 0 a silent 0
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
        r = _norm(jnp.mean(z * z, axis=-1))
        return -20.0 * jnp.exp(-0.2 * r) - jnp.exp(jnp.mean(cos_2pi(z), axis=-1)) + 20.0 + math.e


class Sphere(Objective):
    """Sphere: ``Σ z_i²``; min 0 at 0. Gradient Lipschitz constant 2."""

    name = "sphere"

    def _f(self, z):
        return jnp.sum(z * z, axis=-1)


class Quadratic(Objective):
    """Quadratic ``½ |z|²``; min 0 at 0, gradient ``z`` (Lipschitz constant 1).

    Not CBXpy's ``Quadratic``, which is ``|x|²`` (:class:`Sphere` here): the ½ makes the
    gradient's Lipschitz constant 1, as the FedCBO paper's quadratic examples assume."""

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


class _Planar(Objective):
    dim = 2


class Himmelblau(_Planar):
    """Himmelblau: ``(x² + y - 11)² + (x + y² - 7)²``; min 0 at four points."""

    name = "himmelblau"

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return (x * x + y - 11) ** 2 + (x + y * y - 7) ** 2

    def _argmins(self, d):
        return [[3.0, 2.0], [-2.805118086952745, 3.131312518250573], [-3.779310253377747, -3.2831859912861696],
                [3.5844283403304917, -1.8481265269644034]]


class ThreeHumpCamel(_Planar):
    """Three-hump camel: ``2x² - 1.05x⁴ + x⁶/6 + xy + y²``; min 0 at 0."""

    name = "three-hump-camel"

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return 2 * x * x - 1.05 * x ** 4 + x ** 6 / 6 + x * y + y * y


class McCormick(_Planar):
    """McCormick: ``sin(x + y) + (x - y)² - 1.5x + 2.5y + 1``; min ``-1.9132229549810362`` on ``[-1.5, 4] × [-3, 4]``
    (unbounded below outside: ``f(t, t) = sin 2t + t + 1``)."""

    name = "mccormick"
    min_value = -1.9132229549810362
    domain = ((-1.5, -3.0), (4.0, 4.0))

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return jnp.sin(x + y) + (x - y) ** 2 - 1.5 * x + 2.5 * y + 1

    def _argmins(self, d):
        return [[-0.5471975511965976, -1.5471975511965976]]


class Easom(_Planar):
    """Easom: ``-cos x cos y exp(-((x - π)² + (y - π)²))``; min -1 at ``(π, π)``."""

    name = "easom"
    min_value = -1.0

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return -jnp.cos(x) * jnp.cos(y) * jnp.exp(-((x - jnp.pi) ** 2 + (y - jnp.pi) ** 2))

    def _argmins(self, d):
        return [[math.pi, math.pi]]


class Bukin6(_Planar):
    """Bukin N.6: ``100 √|y - 0.01 x²| + 0.01 |x + 10|``; min 0 at ``(-10, 1)`` (on ``[-15, 5] × [-3, 3]``)."""

    name = "bukin6"
    domain = ((-15.0, -3.0), (5.0, 3.0))

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return 100 * jnp.sqrt(jnp.abs(y - 0.01 * x * x)) + 0.01 * jnp.abs(x + 10)

    def _argmins(self, d):
        return [[-10.0, 1.0]]


class CrossInTray(_Planar):
    """Cross-in-tray: ``-1e-4 (|sin x sin y e^{|100 - r/π|}| + 1)^{0.1}``; min ``-2.062611870822738`` at four points
    (on ``[-10, 10]²``; unbounded below outside, where ``e^{r/π - 100}`` grows past ``e^{100}`` for ``r > 200π``)."""

    name = "cross-in-tray"
    min_value = -2.062611870822738
    domain = (-10.0, 10.0)
    _X = 1.3494066171539107

    def _f(self, z):
        # (|s| e^a + 1)^{0.1} = exp(0.1 logaddexp(log|s| + a, 0)): e^a reaches e^100, past float32's range.
        # Where s = 0 (the axes, a ridge |s| of local maxima) the value is -1e-4 and the gradient is taken as 0,
        # a subgradient of the ridge: log|s|'s infinite derivative made it NaN on both axes.
        x, y = z[..., 0], z[..., 1]
        r = _norm(x * x + y * y)
        a = jnp.abs(100 - r / jnp.pi)
        s = jnp.abs(jnp.sin(x) * jnp.sin(y))
        pos = s > 0
        inner = jnp.where(pos, jnp.logaddexp(jnp.log(jnp.where(pos, s, 1.0)) + a, 0.0), 0.0)
        return -0.0001 * jnp.exp(0.1 * inner)

    def _argmins(self, d):
        a = self._X
        return [[a, a], [-a, a], [a, -a], [-a, -a]]


class DropWave(_Planar):
    """CBXpy's drop wave: ``-(1 + cos 12r) exp(-r²/(2(1 + r²/1000)))``; min -2 at 0."""

    name = "drop-wave"
    min_value = -2.0

    def _f(self, z):
        r2 = jnp.sum(z * z, axis=-1)
        return -(1 + jnp.cos(12 * _norm(r2))) * jnp.exp(-0.5 * r2 / (1 + 0.001 * r2))


class HolderTable(_Planar):
    """Hölder table: ``-|sin x cos y e^{|1 - r/π|}|``; min ``-19.208502567886732`` at four points (on ``[-10, 10]²``)."""

    name = "holder-table"
    min_value = -19.208502567886732
    domain = (-10.0, 10.0)
    _XY = (8.055023475736563, 9.664590019241272)

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return -jnp.abs(jnp.sin(x) * jnp.cos(y) * jnp.exp(jnp.abs(1 - _norm(x * x + y * y) / jnp.pi)))

    def _argmins(self, d):
        a, b = self._XY
        return [[a, b], [-a, b], [a, -b], [-a, -b]]


@dataclasses.dataclass(frozen=True, eq=False)
class Snowflake(_Planar):
    """CBXpy's snowflake (Bungert, Roith, Wacker 2022): six minima of value ``-1/4``.

    With ``u = a x`` in polar coordinates ``(r, φ)``:
    ``min(0.8, min_{ψ ∈ {0, π/3, 2π/3}} r⁸ - r⁴ + |cos(φ + ψ)|^{1/2} r^{0.3})``.
    """

    name = "snowflake"
    min_value = -0.25
    a: float = 0.5

    def _f(self, z):
        u = self.a * z
        sq = jnp.sum(u * u, axis=-1)
        # The origin is a cusp (r^0.3) where f = 0: evaluated away from it, so that jax.grad takes
        # the subgradient 0 there, not the NaN of arctan2(0, 0) and 0^-0.7 (as Ackley's cone, _norm).
        at_0 = sq == 0
        u = jnp.where(at_0[..., None], jnp.ones_like(u), u)
        r = jnp.sqrt(jnp.where(at_0, 2.0, sq))
        phi = jnp.arctan2(u[..., 1], u[..., 0])
        g = [r ** 8 - r ** 4 + jnp.abs(jnp.cos(phi + psi)) ** 0.5 * r ** 0.3 for psi in (0.0, math.pi / 3,
                                                                                          2 * math.pi / 3)]
        return jnp.where(at_0, 0.0, jnp.minimum(jnp.minimum(jnp.minimum(g[0], g[1]), g[2]), 0.8))

    def _argmins(self, d):
        rad = 0.5 ** 0.25 / self.a
        return [[s * rad * math.cos(t), s * rad * math.sin(t)] for t in (math.pi / 2, math.pi / 6, -math.pi / 6)
                for s in (1, -1)]


class Eggholder(_Planar):
    """Eggholder on ``[-512, 512]²``: min ``-959.6406627208507`` at ``(512, 404.2318051137578)``, on the
    boundary (unbounded below outside the box: keep particles inside, e.g. with ``max_abs=512``)."""

    name = "eggholder"
    min_value = -959.6406627208507
    domain = (-512.0, 512.0)

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return (-(y + 47) * jnp.sin(jnp.sqrt(jnp.abs(y + x / 2 + 47)))
                - x * jnp.sin(jnp.sqrt(jnp.abs(x - (y + 47)))))

    def _argmins(self, d):
        return [[512.0, 404.2318051137578]]


@dataclasses.dataclass(frozen=True, eq=False)
class Michalewicz(Objective):
    """Michalewicz (``m = 10``) on ``[0, π]^d``: ``-Σ_i sin(x_i) sin(i x_i²/π)^{2m}``.

    Known minimiser for ``d = 2`` (``(2.2029055201726093, π/2)``, ``-1.8013034100985528``);
    known minimum values for ``d = 5`` (-4.687658) and ``d = 10`` (-9.66015).
    """

    name = "michalewicz"
    domain = (0.0, math.pi)
    m: int = 10
    _MINIMA = {2: -1.8013034100985528, 5: -4.687658, 10: -9.66015}

    def _f(self, z):
        i = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
        return -jnp.sum(jnp.sin(z) * jnp.sin(i * z * z / jnp.pi) ** (2 * self.m), axis=-1)

    def _argmins(self, d):
        if d != 2:
            raise ValueError("Michalewicz's minimiser is known here for d = 2 only")
        return [[2.2029055201726093, math.pi / 2]]

    def minimum(self, d):
        if d not in self._MINIMA:
            raise ValueError(f"Michalewicz's minimum is known for d in {sorted(self._MINIMA)}, not {d}")
        return self._MINIMA[d]


@dataclasses.dataclass(frozen=True, eq=False)
class RastriginMultimodal(Objective):
    """``Π_k V(α_k (x - z_k))`` with ``V`` the Rastrigin function: min 0 at every ``z_k``.

    Attributes:
      alpha: the scales ``α_k``, one per factor (``K`` of them).
      z: the centres ``z_k``: ``(K, d)`` (CBXpy's layout), or anything that broadcasts to it
        (a ``(d,)`` centre shared by every factor, ``(K, 1)`` or ``(1, d)`` rows, a scalar);
        ``None``: every centre at 0. Rows other than ``1`` or ``K`` are refused at
        construction, coordinates other than ``1`` or the particles' ``d`` when evaluated.
    """

    name = "rastrigin-multimodal"
    alpha: Any = (1.0,)
    z: Any = None
    _base = None

    def __post_init__(self):
        super().__post_init__()
        try:
            alpha = np.asarray(self.alpha, np.float64)
        except (TypeError, ValueError):
            alpha = np.zeros((0, 0))
        if alpha.ndim != 1 or alpha.size == 0 or not np.all(np.isfinite(alpha)):
            raise ValueError(f"alpha must be a non-empty sequence of finite numbers (one scale per factor), "
                             f"got {self.alpha!r}")
        if self.z is None:
            return
        try:
            z = np.asarray(self.z, np.float64)
        except (TypeError, ValueError):
            z = np.asarray(np.nan)
        if not np.all(np.isfinite(z)):
            raise ValueError(f"z must be None or finite numbers (the centres z_k), got {self.z!r}")
        if z.ndim > 2:
            raise ValueError(f"z must have shape (K, d) (one centre per factor of alpha), got shape {z.shape}")
        if z.ndim == 2 and z.shape[0] not in (1, alpha.size):
            raise ValueError(f"z has {z.shape[0]} centres (rows), but alpha has {alpha.size} factors: give one "
                             f"centre per factor, z of shape ({alpha.size}, d)")

    def _terms(self, d):
        k = len(self.alpha)
        if self.z is None:
            return np.zeros((k, d))
        z = np.asarray(self.z, np.float64)
        n = z.shape[-1] if z.ndim else 1
        if n not in (1, d):
            raise ValueError(f"{type(self).__name__}'s z's centres have {n} coordinates, but the particles have "
                             f"dimension {d}")
        return np.broadcast_to(z, (k, d))

    def _f(self, x):
        base = Rastrigin() if self._base is None else self._base
        z = jnp.asarray(self._terms(x.shape[-1]), x.dtype)
        out = 1.0
        for k, a in enumerate(self.alpha):
            out = out * base(a * (x - z[k]))
        return out

    def _argmins(self, d):
        return np.unique(self._terms(d), axis=0)


@dataclasses.dataclass(frozen=True, eq=False)
class AckleyMultimodal(RastriginMultimodal):
    """``Π_k A(α_k (x - z_k))`` with ``A`` the Ackley function: min 0 at every ``z_k``."""

    name = "ackley-multimodal"

    def _f(self, x):
        z = jnp.asarray(self._terms(x.shape[-1]), x.dtype)
        out = 1.0
        for k, a in enumerate(self.alpha):
            out = out * Ackley()(a * (x - z[k]))
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class AcceleratedSinus(Objective):
    """``sin(a r/(1 + r²)) + 1``, ``r = |x|`` (``a = 1``): min 1 at 0."""

    name = "accelerated-sinus"
    min_value = 1.0
    a: float = 1.0

    def _f(self, z):
        r = _norm(jnp.sum(z * z, axis=-1))
        return jnp.sin(self.a * r / (1 + r * r)) + 1


class NdSinus(Objective):
    """``(sin(|0.3x|²/d) + 1)(u_1⁴ - u_1² + 1)``, ``u = 0.3x``: min 0 on the spheres ``|0.3x|² = d (3π/2 + 2πk)``,
    ``k = 0, 1, ...`` (``minimisers(d)``: a point of the innermost one)."""

    name = "nd-sinus"
    isolated = False

    def _f(self, z):
        u = 0.3 * z
        s = jnp.sum(u * u, axis=-1) / z.shape[-1]
        return (jnp.sin(s) + 1) * (u[..., 0] ** 4 - u[..., 0] ** 2 + 1)

    def _argmins(self, d):
        # sin(s) = -1 zeroes f whatever u_1 is (the second factor is >= 3/4): in R^1 too, at u_1 = √(3π/2)
        x = np.zeros(d)
        x[-1] = math.sqrt(1.5 * math.pi * d) / 0.3
        return x[None]


class P4thOrder(Objective):
    """``Σ x_i⁴ - Σ x_i² + 1``: min ``1 - d/4`` at the ``2^d`` points ``x_i = ±1/√2``
    (``minimisers(d)`` lists all of them up to ``d = 10``, beyond that the one with every
    ``x_i = +1/√2``)."""

    name = "p-4th-order"

    def _f(self, z):
        return jnp.sum(z ** 4, axis=-1) - jnp.sum(z * z, axis=-1) + 1

    def _argmins(self, d):
        grid = np.array(np.meshgrid(*[[1, -1]] * d, indexing="ij")).reshape(d, -1).T if d <= 10 else np.ones((1, d))
        return grid / math.sqrt(2)

    def minimum(self, d):
        return 1 - d / 4


@dataclasses.dataclass(frozen=True, eq=False)
class Banana(_Planar):
    """CBXpy's banana (a posterior): ``(G - m)²/(2σ²) + |x|²/(2σ_p²)``, ``G = (x_2 - 1)² - (x_1 - 2.5) - 1``."""

    name = "banana"
    min_value = 0.3575302971912591
    m: float = 0.0
    sigma: float = 0.5
    sigma_prior: float = 2.0

    def _f(self, z):
        g = (z[..., 1] - 1) ** 2 - (z[..., 0] - 2.5) - 1
        return 0.5 / self.sigma ** 2 * (g - self.m) ** 2 + 0.5 / self.sigma_prior ** 2 * jnp.sum(z * z, axis=-1)

    def _argmins(self, d):
        return [[1.4722549005654677, 0.7464830738376442]]


class Bimodal(_Planar):
    """CBXpy's bimodal ``-log(e^{-((x-1)² + (y-1.5)²/0.2)} + e^{-(x+1.2)²/8 - (y+0.7)²/0.5}/2)``."""

    name = "bimodal"
    min_value = -1.7071701960514817e-05

    def _f(self, z):
        # -log(e^{-a} + e^{-b}/2) as a logaddexp: both exponentials underflow a few units from the modes
        # (|y| > 8 in float32), and -log(0) made the energy +inf where it is about (y + 0.7)²/0.5.
        x, y = z[..., 0], z[..., 1]
        return -jnp.logaddexp(-((x - 1.0) ** 2 + (y - 1.5) ** 2 / 0.2),
                              math.log(0.5) - (x + 1.2) ** 2 / 8 - (y + 0.7) ** 2 / 0.5)

    def _argmins(self, d):
        return [[0.9999953049354683, 1.4999849758640378]]


class Unimodal(_Planar):
    """CBXpy's unimodal ``-log(e^{-(x+1.2)²/8 - (y+0.7)²/0.5}/2)``: min ``log 2`` at ``(-1.2, -0.7)``."""

    name = "unimodal"
    min_value = math.log(2.0)

    def _f(self, z):
        x, y = z[..., 0], z[..., 1]
        return math.log(2.0) + (x + 1.2) ** 2 / 8 + (y + 0.7) ** 2 / 0.5

    def _argmins(self, d):
        return [[-1.2, -0.7]]


@dataclasses.dataclass(frozen=True, eq=False)
class GaussianMixture(Objective):
    """CBXpy's ``Multimodal``: ``-log Σ_k N(x; μ_k, Σ_k)``; default one standard Gaussian in ``R^2``
    (min ``log 2π`` at 0). Minimisers are given for well-separated components (their means).

    ``means`` is ``(K, d)``; ``covs`` ``(K, d, d)`` symmetric positive definite matrices, one ``(d, d)``
    matrix shared by every component, or ``None`` (identities)."""

    name = "gaussian-mixture"
    means: Any = ((0.0, 0.0),)
    covs: Any = None

    def __post_init__(self):
        super().__post_init__()
        self._parts()  # bad means or covariances are refused here, not deep inside a traced call

    def _parts(self):
        try:
            means = np.asarray(self.means, np.float64)
        except (TypeError, ValueError):
            means = np.full((0, 0), np.nan)
        if means.ndim != 2 or means.size == 0 or not np.all(np.isfinite(means)):
            raise ValueError(f"GaussianMixture: means must be a (K, d) array of finite numbers (one mean per "
                             f"component), got {self.means!r}")
        k, d = means.shape
        if self.covs is None:
            covs = np.broadcast_to(np.eye(d), (k, d, d))
        else:
            try:
                covs = np.asarray(self.covs, np.float64)
            except (TypeError, ValueError):
                covs = np.full((0,), np.nan)
            if covs.shape == (d, d):  # one covariance shared by every component
                covs = np.broadcast_to(covs, (k, d, d))
            if covs.shape != (k, d, d) or not np.all(np.isfinite(covs)):
                raise ValueError(f"GaussianMixture: covs must be {k} finite ({d}, {d}) covariance matrices (shape "
                                 f"({k}, {d}, {d}), or one ({d}, {d}) matrix for all), got shape {covs.shape}")
            sym = np.allclose(covs, np.swapaxes(covs, -1, -2), rtol=1e-10, atol=1e-12)
            if not sym or np.min(np.linalg.eigvalsh(0.5 * (covs + np.swapaxes(covs, -1, -2)))) <= 0:
                raise ValueError("GaussianMixture: every covariance must be symmetric positive definite (its density "
                                 "is otherwise not a Gaussian: the log-determinant and the energies are wrong)")
        prec = np.linalg.inv(covs)
        logdet = np.linalg.slogdet(covs)[1]
        return means, prec, -0.5 * (d * math.log(2 * math.pi) + logdet)

    def _f(self, z):
        means, prec, lognorm = self._parts()
        if z.shape[-1] != means.shape[1]:
            raise ValueError(f"GaussianMixture: this mixture lives in R^{means.shape[1]}; got particles of dimension "
                             f"{z.shape[-1]}")
        diff = z[..., None, :] - jnp.asarray(means, z.dtype)
        quad = jnp.einsum("...ka,kab,...kb->...k", diff, jnp.asarray(prec, z.dtype), diff)
        return -jax_logsumexp(jnp.asarray(lognorm, z.dtype) - 0.5 * quad)

    def _argmins(self, d):
        means, _, _ = self._parts()
        if means.shape[1] != d:
            raise ValueError(f"this mixture lives in R^{means.shape[1]}, not R^{d}")
        vals = np.asarray(self._f(jnp.asarray(means)))
        return means[np.isclose(vals, vals.min())]

    def minimum(self, d):
        return float(np.min(np.asarray(self._f(jnp.asarray(self.minimisers(d))))))


def jax_logsumexp(a):
    import jax

    return jax.nn.logsumexp(a, axis=-1)


_ALL: tuple[type[Objective], ...] = (
    Rastrigin, RastriginNormalized, Ackley, Sphere, Quadratic, Rosenbrock, Griewank, StyblinskiTang, Himmelblau,
    ThreeHumpCamel, McCormick, Easom, Bukin6, CrossInTray, DropWave, HolderTable, Snowflake, Eggholder, Michalewicz,
    RastriginMultimodal, AckleyMultimodal, AcceleratedSinus, NdSinus, P4thOrder, Banana, Bimodal, Unimodal,
    GaussianMixture,
)
OBJECTIVES: dict[str, Callable[..., Objective]] = {cls.name: cls for cls in _ALL}


def get_objective(name: str, shift=0.0) -> Objective:
    """Build a registered objective by name (see ``OBJECTIVES``)."""
    try:
        cls = OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose from {sorted(OBJECTIVES)}") from None
    return cls(shift=shift)
