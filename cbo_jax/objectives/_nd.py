"""CBXpy's other test functions of any dimension ``d``.

Michalewicz, the multiplicative multimodal Rastrigin and Ackley, accelerated sinus, n-d
sinus, the 4th-order polynomial and the Gaussian-mixture ``-log`` density. Public path:
:mod:`cbo_jax.objectives`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from cbo_jax.objectives._base import Objective, _norm
from cbo_jax.objectives._classic import Ackley, Rastrigin


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
