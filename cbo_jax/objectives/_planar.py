"""CBXpy's test functions of the plane (``dim = 2``; another dimension is an error).

Himmelblau, three-hump camel, McCormick, Easom, Bukin N.6, cross-in-tray, drop wave, Hölder
table, snowflake, eggholder, and the banana, bimodal and unimodal ``-log`` densities. Public
path: :mod:`cbo_jax.objectives`.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from cbo_jax.objectives._base import Objective, _norm


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
        # a subgradient of the ridge: log|s|'s infinite derivative would make it NaN on both axes.
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
        # (|y| > 8 in float32), and -log(0) would make the energy +inf where it is about (y + 0.7)²/0.5.
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
