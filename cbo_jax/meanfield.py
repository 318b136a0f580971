"""Mean-field diagnostics of the (clustered) CBO particle systems.

* :func:`class_variance`: ``V(ρ^k_t) = ½ ∫ |θ - θ*_k|² dρ^k_t`` for the empirical
  measure of each class (FedCBO Theorem 2.3).
* :func:`predicted_decay_rate`: the exponent of Theorem 2.3,
  ``2λ1 - 2λ2 M - d σ1² - d σ2² M²`` (isotropic noise; ``M`` the Lipschitz constant of
  the gradients), and its anisotropic counterpart.
* :func:`fit_decay_rate`: the exponent fitted from a simulated ``V_t``.
* :func:`sliced_wasserstein`: the sliced 1-Wasserstein (or p-Wasserstein) distance
  between two empirical measures of any sizes, exact per direction, vectorised over
  directions: the distance between an ``N``-particle system and a large-``N``
  reference (Theorem 2.2, propagation of chaos).
* :func:`fit_loglog_slope`: slope of ``log(error)`` against ``log(N)``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop

PyTree = Any

__all__ = [
    "class_variance",
    "predicted_decay_rate",
    "ideal_quadratic_rate",
    "fit_decay_rate",
    "sliced_wasserstein",
    "SlicedReference",
    "random_directions",
    "sorted_projections",
    "fit_loglog_slope",
]


def class_variance(x: PyTree, label: jax.Array, centers: PyTree, include: jax.Array | None = None) -> jax.Array:
    """``V^k = ½ mean_{i : label_i = k} |θ_i - θ*_k|²`` for every class ``k``.

    Args:
      x: population ``(N, d)`` or stacked pytree.
      label: ``(N,)`` integer classes in ``[0, K)``.
      centers: the ``K`` reference points ``θ*_k`` (leading axis ``K``).
      include: optional ``(N,)`` boolean (for example the benign particles).

    Returns ``(K,)``; a class with no particle gets NaN.
    """
    k = jax.tree_util.tree_leaves(centers)[0].shape[0]
    diff = pop.tree_sub(x, pop.gather(centers, label))
    sq = 0.5 * pop.sq_norms(diff)
    onehot = jax.nn.one_hot(label, k, dtype=sq.dtype).T  # (K, N)
    if include is not None:
        onehot = onehot * include.astype(sq.dtype)[None, :]
    count = jnp.sum(onehot, axis=-1)
    return jnp.where(count > 0, (onehot @ sq) / jnp.maximum(count, 1), jnp.nan)


def predicted_decay_rate(lambda1, lambda2, sigma1, sigma2, d: int, lipschitz: float, noise: str = "isotropic"):
    """Decay exponent of ``V(ρ^k_t)`` predicted by FedCBO Theorem 2.3 (with ``τ → 0``).

    ``2λ1 - 2λ2 M - d σ1² - d σ2² M²`` for isotropic consensus noise (the theorem's
    setting). For anisotropic noise ``σ1 (θ - m) ∘ dB`` the Itô correction is
    ``σ1² |θ - m|²`` instead of ``d σ1² |θ - m|²``, so ``d σ1²`` becomes ``σ1²`` (the
    gradient noise is isotropic in both cases). The theorem needs the result ``> 0``.
    Works elementwise on arrays.
    """
    _checks.positive_int("d", d)
    lip = float(lipschitz)
    c1 = d if noise == "isotropic" else 1
    return 2 * lambda1 - 2 * lambda2 * lip - c1 * np.square(sigma1) - d * np.square(sigma2) * lip**2


def ideal_quadratic_rate(lambda1, lambda2, sigma1, sigma2, d: int, noise: str = "isotropic"):
    """Exact decay exponent of ``E|θ - θ*|²`` for ``L = ½|θ - θ*|²`` when ``m = θ*``.

    Itô on ``|u|²`` with ``u = θ - θ*``: drift ``-2(λ1 + λ2)|u|²``, consensus noise
    ``d σ1² |u|²`` (isotropic; ``σ1² |u|²`` anisotropic), gradient noise ``d σ2² |u|²``.
    Theorem 2.3 bounds the gradient drift by ``-2λ2 M`` from the wrong side (it allows
    any ``L`` with ``M``-Lipschitz gradient), so for this ``L`` the measured rate
    should sit near this value, above the theorem's.
    """
    c1 = d if noise == "isotropic" else 1
    return 2 * (lambda1 + lambda2) - c1 * np.square(sigma1) - d * np.square(sigma2)


def fit_decay_rate(t, v, *, t_min: float | None = None, floor_factor: float = 10.0) -> float:
    """Exponent ``r`` of ``v(t) ≈ C exp(-r t)`` by least squares on ``log v``.

    Uses the points with ``t >= t_min`` (default: the first 5 % of the horizon is
    skipped as transient) and ``v > floor_factor · min(v)`` (the finite-``N``,
    finite-``α`` floor where the decay stops is excluded; on a run too short to
    decay by ``floor_factor²``, the bottom quarter of the log range is excluded
    instead). Needs at least 3 points.
    """
    t = np.asarray(t, np.float64)
    v = np.asarray(v, np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(f"t and v must be 1-D of the same length, got {t.shape} and {v.shape}")
    t_min = t[0] + 0.05 * (t[-1] - t[0]) if t_min is None else t_min
    ok = np.isfinite(v) & (v > 0) & (t >= t_min)
    if np.any(ok):
        lo, hi = np.log(np.min(v[ok])), np.log(v[ok][0])
        # Above the floor: 10x its level, or the top 3/4 of the log range on short runs.
        ok &= np.log(np.where(v > 0, v, 1.0)) > lo + min(np.log(floor_factor), 0.25 * (hi - lo))
    if np.sum(ok) < 3:
        raise ValueError("fewer than 3 points above the floor: run longer or lower floor_factor")
    slope, _ = np.polyfit(t[ok], np.log(v[ok]), 1)
    return float(-slope)


def _quantile_grid(n: int, r: int, dtype):
    """Merged breakpoints of two empirical quantile functions with n and r atoms.

    Returns the widths of the pieces of ``(0, 1)`` on which both quantile functions
    are constant and, for each piece, the atom index into each sorted sample.
    """
    levels = np.unique(np.concatenate([np.arange(1, n + 1) / n, np.arange(1, r + 1) / r]))
    levels[-1] = 1.0
    lower = np.concatenate([[0.0], levels[:-1]])
    mid = 0.5 * (lower + levels)
    widths = levels - lower
    ix = np.minimum((mid * n).astype(np.int64), n - 1)
    iy = np.minimum((mid * r).astype(np.int64), r - 1)
    return jnp.asarray(widths, dtype), jnp.asarray(ix, jnp.int32), jnp.asarray(iy, jnp.int32)


def random_directions(key: jax.Array, num: int, d: int, dtype=jnp.float32) -> jax.Array:
    """``num`` directions drawn uniformly on the unit sphere of ``R^d``: ``(num, d)``."""
    theta = jax.random.normal(key, (num, d), dtype)
    return theta / jnp.linalg.norm(theta, axis=-1, keepdims=True)


@jax.jit
def sorted_projections(y: jax.Array, directions: jax.Array) -> jax.Array:
    """``(P, R)``: the samples ``y`` projected on each direction, sorted."""
    return jnp.sort(directions @ y.T, axis=-1)


@functools.partial(jax.jit, static_argnames=("p",))
def _sw_from_sorted(x, directions, py, widths, ix, iy, *, p: float):
    px = sorted_projections(x, directions)  # (P, N)
    per_dir = jax.lax.map(lambda ab: jnp.sum(widths * jnp.abs(ab[0][ix] - ab[1][iy]) ** p), (px, py))
    return jnp.mean(per_dir) ** (1.0 / p)


def _as_samples(name, x):
    x = pop.ravel(x)[0] if not isinstance(x, (jax.Array, np.ndarray)) else jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be (n, d) samples, got shape {x.shape}")
    return x


def sliced_wasserstein(x, y, key: jax.Array, *, num_projections: int = 64, p: float = 1.0) -> jax.Array:
    """Sliced ``p``-Wasserstein distance between the empirical measures of ``x`` and ``y``.

    ``SW_p(μ, ν)^p = E_θ W_p(θ·μ, θ·ν)^p`` over uniformly random directions ``θ`` on the
    sphere (``num_projections`` of them, drawn from ``key``). Each 1-D distance is the
    exact ``∫_0^1 |F^{-1}(u) - G^{-1}(u)|^p du`` of the two empirical quantile
    functions (sizes may differ; the integral runs over their merged breakpoints).
    Cost ``O(P (N + R) log(N + R))``.

    Args:
      x: ``(N, d)`` samples (or a stacked pytree, raveled per particle).
      y: ``(R, d)`` samples.

    To compare many samples with one large reference, see :class:`SlicedReference`
    (the reference is projected and sorted once).
    """
    return SlicedReference(y, key, num_projections=num_projections, p=p).distance(x)


class SlicedReference:
    """A reference sample projected on fixed random directions and sorted once.

    ``ref.distance(x)`` is :func:`sliced_wasserstein` between ``x`` and the reference,
    on the same directions for every ``x`` (so distances of different samples are
    directly comparable and the reference's sort is not repeated).
    """

    def __init__(self, y, key: jax.Array, *, num_projections: int = 64, p: float = 1.0):
        _checks.positive_int("num_projections", num_projections)
        self.p = float(_checks.positive("p", p))
        y = _as_samples("y", y)
        self.d, self.size, self.dtype = y.shape[1], y.shape[0], y.dtype
        self.directions = random_directions(key, num_projections, self.d, y.dtype)
        self.sorted = sorted_projections(y, self.directions)

    def distance(self, x) -> jax.Array:
        x = _as_samples("x", x)
        if x.shape[1] != self.d:
            raise ValueError(f"x has dimension {x.shape[1]}, the reference {self.d}")
        dtype = jnp.result_type(x.dtype, self.dtype)
        widths, ix, iy = _quantile_grid(x.shape[0], self.size, dtype)
        return _sw_from_sorted(x.astype(dtype), self.directions.astype(dtype), self.sorted.astype(dtype), widths,
                               ix, iy, p=self.p)


def fit_loglog_slope(n, err) -> float:
    """Least-squares slope of ``log(err)`` against ``log(n)``."""
    n = np.asarray(n, np.float64)
    err = np.asarray(err, np.float64)
    if n.shape != err.shape or n.size < 2 or np.any(n <= 0) or np.any(err <= 0):
        raise ValueError("need at least 2 positive (n, err) pairs of equal length")
    return float(np.polyfit(np.log(n), np.log(err), 1)[0])
