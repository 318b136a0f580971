"""Polarized CBO: one kernel-weighted consensus point per particle (CBXpy's ``PolarCBO``).

Bungert, Roith and Wacker (*Polarized consensus-based dynamics for optimization and
sampling*, Math. Program. 2024, eq. (2.1)–(2.2)): particle ``i`` is pulled toward its own
consensus point, a Gibbs mean localised by a kernel ``k``::

    m_i = Σ_j x_j k(x_i, x_j) e^{-α E(x_j)} / Σ_j k(x_i, x_j) e^{-α E(x_j)},
    dx_i = -λ1 (x_i - m_i) dt + σ1 D(x_i - m_i) dB_i.

Particles near different minimisers follow different consensus points, so one run finds
several minima at once. With ``kernel_factor="alpha"`` (CBXpy's default) the kernel is
raised to the power α, ``k^α``, i.e. the weights are ``exp(-α (κ-scaled distance + E))``.

``α = ∞`` (a state or schedule reaching it) is the limit α → ∞ of the normalised weights,
not the product ``∞ · 0`` (NaN): with ``k^α``, ``m_i`` is the mean of the ``x_j`` that
minimise ``-log k(x_i, x_j) + E(x_j)`` (the Gaussian kernel's width ``κ/√α`` shrinks to 0,
but the energy still counts: particle ``i`` itself, or an exact duplicate, wins unless a
neighbour's energy is lower by more than ``-log k``); with ``kernel_factor="const"``,
the ``k``-weighted mean of the ``x_j`` of least energy among those with ``k(x_i, x_j) > 0``.
Finite α is computed as before. ``α = 0`` with ``k^α`` is likewise the limit α → 0⁺:
a pair with ``k(x_i, x_j) = 0`` (the constant kernel beyond κ) keeps weight 0, so ``m_i`` is
the plain mean of the ``x_j`` with ``k(x_i, x_j) > 0`` (the product ``0 · ∞`` would be NaN).

Kernels (``-log k`` of the distance ``r = |x_i - x_j|``, width ``κ > 0``), as CBXpy's:
``"gaussian"`` ``r²/(2κ²)``, ``"laplace"`` ``r/κ``, ``"constant"`` ``0`` within ``κ``
and ``∞`` outside, ``"inverse_quadratic"`` ``log(1 + (r/κ)²)``, ``"taz"``
``(r / (κ max_{jl} r_{jl}))²``; or a callable ``neg_log(x_i, x_j) -> scalar`` on two
particles.

Memory: the weights are formed for a block of ``chunk`` rows at a time (``lax.map``), so
a step holds a ``(chunk, N)`` matrix and never the ``(N, N)`` one (CBXpy forms
``(N, N, d)`` arrays); ``chunk=None`` picks ``min(N, max(1, 2^22 // (N d)))``. The
distances come from the ``(chunk, N, d)`` differences of centred particles (the matrix
product form ``|a_i|² + |a_j|² - 2 a_i·a_j`` would be faster, but its rounding error,
multiplied by α in the weights, is of order 1 in float32 at α = 1e5).

Covariance noise (``noise="covariance"``) is particle-local too: ``σ1 √(2 dt (1+α))
C_i^{1/2} ξ_i`` with ``covariance="local"`` (default; the paper's
``C_i = Σ_j w_ij (x_j - m_i)(x_j - m_i)ᵀ``) or ``covariance="cbxpy"`` (CBXpy 1.0.4's
``PolarCBO.update_covariance``, ``Σ_j w_ij (x_j - m_j)(x_j - m_j)ᵀ``, which is defined
for one run only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.consensus import gibbs_exponent
from cbo_jax.dynamics import core
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _no_gradient

__all__ = ["PolarCBOConfig", "PolarParams", "polar_cbo", "polar_consensus", "KERNELS"]

KERNELS = ("gaussian", "laplace", "constant", "inverse_quadratic", "taz")


class PolarParams(NamedTuple):
    """PolarCBO's own number (``Params.extra``): the kernel width ``kappa``."""

    kappa: Any


@dataclasses.dataclass(frozen=True)
class PolarCBOConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus the kernel.

    Attributes:
      kernel: one of ``KERNELS`` or a callable ``neg_log(x_i, x_j)``.
      kappa: kernel width ``κ > 0`` (CBXpy's ``kappa``, default 1).
      kernel_factor: ``"alpha"`` (weights ``k^α``, CBXpy's default) or ``"const"`` (``k``).
      chunk: rows per block of the weight matrix (``None``: automatic).
      covariance: ``"local"`` or ``"cbxpy"`` (see the module docstring).
    """

    kernel: Any = "gaussian"
    kappa: float = 1.0
    kernel_factor: str = "alpha"
    chunk: int | None = None
    covariance: str = "local"

    EXTRA_RULES = {"kappa": "positive"}

    def __post_init__(self):
        super().__post_init__()
        if not callable(self.kernel):
            _checks.one_of("kernel", self.kernel, KERNELS)
        v = _checks.finite_number("kappa", self.kappa)
        if v <= 0:
            raise ValueError(f"kappa (the kernel width) must be > 0, got {self.kappa!r}")
        _checks.one_of("kernel_factor", self.kernel_factor, ("alpha", "const"))
        if self.chunk is not None:
            _checks.positive_int("chunk", self.chunk)
        _checks.one_of("covariance", self.covariance, ("local", "cbxpy"))
        _no_gradient(self, "polar_cbo")

    def extra_params(self) -> PolarParams:
        return PolarParams(float(self.kappa))


def _neg_log(kernel, r2, kappa, dmax):
    """``-log k`` from squared distances ``r2`` (built-in kernels)."""
    if kernel == "gaussian":
        return r2 / (2 * kappa ** 2)
    r = jnp.sqrt(r2)
    if kernel == "laplace":
        return r / kappa
    if kernel == "constant":
        q = r / kappa
        return jnp.where(q < 1, 0.0, jnp.where(q > 1, jnp.inf, 1.0)).astype(r.dtype)
    if kernel == "inverse_quadratic":
        return jnp.log1p((r / kappa) ** 2)
    if kernel == "taz":
        return (r / (kappa * dmax)) ** 2
    raise ValueError(f"unknown kernel {kernel!r}")


def _blocks(n: int, chunk: int | None, d: int = 1):
    b = min(n, chunk) if chunk is not None else min(n, max(1, (1 << 22) // max(n * d, 1)))  # a chunk > N: all rows
    return b, -(-n // b)


def _row_blocks(a, b, nb):
    """``a``'s rows padded to ``nb · b`` and split into ``nb`` blocks of ``b``."""
    pad = nb * b - a.shape[0]
    if pad:
        a = jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)])
    return a.reshape((nb, b) + a.shape[1:])


def _max_distance(x, valid, b, nb):
    """``max_{i,j} |x_i - x_j|`` over the valid particles, block by block (the Taz kernel's scale;
    ``1`` when every valid particle is at one point, where the kernel is ``1`` for any scale)."""
    xs = _row_blocks(x, b, nb)
    vs = _row_blocks(valid, b, nb)

    def one(args):
        xi, vi = args
        r2 = jnp.sum((xi[:, None, :] - x[None]) ** 2, axis=-1)
        return jnp.max(jnp.where(vi[:, None] & valid[None], r2, 0))

    dmax = jnp.sqrt(jnp.max(jax.lax.map(one, (xs, vs))))
    return jnp.where(dmax > 0, dmax, 1.0).astype(dmax.dtype)  # a collapsed swarm: r = 0 for every pair, any scale


def _logits(kernel, xi, x, ai, a, kappa, kf, ebias, dmax, shifted, kernel_factor, at_infinity):
    """``(B, N)`` log-weights ``-kf · (-log k(x_i, x_j)) - α E_j`` (``ebias = -α E``, ``-inf`` where excluded).

    At ``α = ∞`` the limit of the normalised weights (``shifted``: ``E_j - E_min``, ``∞`` where
    excluded): with ``kernel_factor="alpha"`` the weights ``exp(-α (-log k_ij + E_j - E_min))``
    concentrate, equally, on the ``j`` that minimise ``-log k_ij + E_j - E_min``; with
    ``"const"`` (``k_ij exp(-α (E_j - E_min))``) on the ``j`` of least energy among those with
    ``k_ij > 0``, weighted by ``k_ij``. (The plain products would be ``∞ · 0``: NaN.)
    """
    if callable(kernel):
        nl = jax.vmap(lambda p: jax.vmap(lambda q: kernel(p, q))(x))(xi)
    else:
        # Differences, not |a_i|² + |a_j|² - 2 a_i·a_j: that form's rounding, ε (|a_i|² + |a_j|²),
        # is multiplied by α in the weights (float32, α = 1e5: errors of order 1 in the logits).
        r2 = jnp.sum((ai[:, None, :] - a[None]) ** 2, axis=-1)
        nl = _neg_log(kernel, r2, kappa, dmax)
    if not at_infinity:
        # k_ij = 0 (-log k = ∞) excludes the pair at every α, α = 0 included (the α → 0⁺ limit, not 0 · ∞)
        kern = jnp.where(nl == jnp.inf, -jnp.inf, -kf * nl)
        return jnp.where(jnp.isfinite(ebias)[None], kern + ebias[None], -jnp.inf)
    if kernel_factor == "alpha":
        score, keep = nl + shifted[None], jnp.zeros_like(nl)
    else:
        score, keep = jnp.where(nl < jnp.inf, shifted[None], jnp.inf), -nl
    win = (score == jnp.min(score, axis=1, keepdims=True)) & jnp.isfinite(score)
    return jnp.where(win, keep, -jnp.inf).astype(ebias.dtype)


def polar_consensus(x, energy, alpha, *, kappa, kernel="gaussian", kernel_factor="alpha", mask=None, chunk=None,
                    with_cov: str | None = None, drift_for_cov=None):
    """Per-particle consensus points ``m_i`` (``(N, d)``), formed ``chunk`` rows at a time.

    With ``with_cov="local"`` also ``C_i = Σ_j w_ij (x_j - m_i)(x_j - m_i)ᵀ``; with
    ``with_cov="cbxpy"`` ``C_i = Σ_j w_ij u_j u_jᵀ`` for the given ``drift_for_cov`` ``u``.
    Returns ``m`` or ``(m, C)``. ``alpha = ∞`` gives the α → ∞ limit (see the module docstring).
    """
    n = x.shape[0]
    ok = jnp.all(jnp.isfinite(x), axis=1) & jnp.isfinite(energy)
    if mask is not None:
        ok = ok & mask
    xz = jnp.where(ok[:, None], x, 0)
    center = jnp.sum(xz, axis=0) / jnp.maximum(jnp.sum(ok), 1).astype(x.dtype)
    a = jnp.where(ok[:, None], x - center[None], 0)
    # Energies shifted by the smallest valid one (the weights are normalised per row, so a
    # common shift cancels): -α E itself overflows float32 for large α |E|.
    e_min = jnp.min(jnp.where(ok, energy, jnp.inf))
    infinite = jnp.isinf(jnp.asarray(alpha, x.dtype))  # the α = ∞ limit (see _logits)
    shifted = jnp.where(ok, energy - e_min, jnp.inf)  # E_j - E_min, ∞ where excluded: the α = ∞ limit's
    ebias = jnp.where(ok, gibbs_exponent(jnp.asarray(alpha, x.dtype), jnp.where(ok, energy - e_min, 0)), -jnp.inf)
    kf = alpha if kernel_factor == "alpha" else 1.0
    b, nb = _blocks(n, chunk, x.shape[1])
    dmax = _max_distance(xz, ok, b, nb) if kernel == "taz" else None
    if with_cov == "cbxpy":
        uz = jnp.where(ok[:, None], drift_for_cov, 0)
        outer = (uz[:, :, None] * uz[:, None, :]).reshape(n, -1)
    elif with_cov == "local":
        outer = (a[:, :, None] * a[:, None, :]).reshape(n, -1)

    def one(xi, at_infinity):
        ai = xi - center[None]
        lg = _logits(kernel, xi, xz, ai, a, kappa, kf, ebias, dmax, shifted, kernel_factor, at_infinity)
        w = jnp.exp(lg - jax.nn.logsumexp(lg, axis=1, keepdims=True))
        w = jnp.where(jnp.isfinite(w), w, 0)
        m_i = w @ xz
        if with_cov is None:
            return m_i
        c = (w @ outer).reshape(xi.shape[0], x.shape[1], x.shape[1])
        if with_cov == "local":
            am = m_i - center[None]
            c = c - am[:, :, None] * am[:, None, :]
        return m_i, c

    blocks = _row_blocks(x, b, nb)
    # α = ∞ takes its own branch: finite α (every step but a degenerate schedule's) runs the plain kernel
    out = jax.lax.cond(infinite, lambda: jax.lax.map(lambda xi: one(xi, True), blocks),
                       lambda: jax.lax.map(lambda xi: one(xi, False), blocks))
    unblock = lambda t: t.reshape((nb * b,) + t.shape[2:])[:n]  # noqa: E731
    return jax.tree_util.tree_map(unblock, out)


def polar_cbo(objective: Callable[[PyTree], jax.Array], config: PolarCBOConfig | None = None,
              **overrides: Any) -> Dynamics:
    """Polarized CBO (see the module docstring). Needs an ``(N, d)`` array population."""
    config = _checks.config_with("polar_cbo", PolarCBOConfig, config, overrides)
    quiet = config.noise_kind == "none"
    cov = config.noise_kind == "covariance"

    def consensus(state, in_batch):
        return polar_consensus(state.x, state.energy, state.alpha, kappa=state.params.extra.kappa,
                               kernel=config.kernel, kernel_factor=config.kernel_factor, mask=in_batch,
                               chunk=config.chunk)

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        u = ctx.correct(st.x - ctx.m)
        x = st.x - (prm.lambda1 * prm.dt) * u
        if quiet:
            return x, st.aux
        if cov:
            _, c = polar_consensus(st.x, st.energy, st.alpha, kappa=prm.extra.kappa, kernel=config.kernel,
                                   kernel_factor=config.kernel_factor, mask=ctx.in_batch, chunk=config.chunk,
                                   with_cov=config.covariance, drift_for_cov=u)
            z = ctx.normal(ctx.key, u)
            direction = jnp.einsum("nab,nb->na", core.cov_sqrt(c), z)
            scale = jnp.sqrt(2.0 * prm.dt * (1.0 + st.alpha))
        else:
            scale, direction = ctx.noise(ctx.key, u)
        return x + (prm.sigma1 * scale) * direction, st.aux

    def check(x0, n, cfg):
        core.require_array("x0", x0, "polar_cbo")

    kernel = core.Kernel(name="polar_cbo", move=move, consensus=consensus, per_particle_consensus=True, check=check)
    return core.build(objective, config, kernel)
