"""The classic test functions of the CBO literature, in any dimension ``d``.

Rastrigin (CBXpy's un-normalised form and the ``1/d``-normalised one), Ackley, sphere,
the quadratic ``½ |z|²``, Rosenbrock, Griewank and Styblinski–Tang. Public path:
:mod:`cbo_jax.objectives`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from cbo_jax.objectives._base import Objective, _norm, cos_2pi


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
