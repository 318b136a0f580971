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

Memory: the weights are formed for a block of ``chunk`` rows and up to 2^10 columns at a
time, each row normalised by a running log-sum-exp over the column blocks, so a step holds
one block's ``(chunk, columns)`` matrix and never the ``(N, N)`` one (CBXpy forms
``(N, N, d)`` arrays), nor a copy of the particles; ``chunk=None`` picks
``max(1, 2^22 // (columns · d))`` rows. The
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
from cbo_jax import population as pop
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


def _blocks(n: int, chunk: int | None, d: int = 1, cols: int | None = None):
    """``(rows, cols)``: particles ``i`` per block of the weight matrix (``chunk``, or as many as
    keep a block's ``(rows, cols, d)`` differences near 2^22 numbers) and particles ``j`` per
    block of its columns (``cols``, or up to 2^10)."""
    bj = min(n, cols if cols is not None else 1 << 10)
    bi = min(n, chunk) if chunk is not None else min(n, max(1, (1 << 22) // max(bj * d, 1)))  # a chunk > N: all rows
    return bi, bj


def _max_distance(xz, valid, bi, bj):
    """``max_{i,j} |x_i - x_j|`` over the valid particles, block by block (the Taz kernel's scale;
    ``1`` when every valid particle is at one point, where the kernel is ``1`` for any scale)."""
    n = xz.shape[0]

    def row_block(r2max, _, i0, ni):
        xi, vi = pop.slice_rows(xz, i0, ni), pop.slice_rows(valid, i0, ni)

        def col_block(r2max, _, j0, nj):
            r2 = jnp.sum((xi[:, None, :] - pop.slice_rows(xz, j0, nj)[None]) ** 2, axis=-1)
            return jnp.maximum(r2max, jnp.max(jnp.where(vi[:, None] & pop.slice_rows(valid, j0, nj)[None], r2, 0)))

        return pop.over_blocks(n, bj, col_block, r2max)

    dmax = jnp.sqrt(pop.over_blocks(n, bi, row_block, jnp.zeros((), xz.dtype)))
    return jnp.where(dmax > 0, dmax, 1.0).astype(dmax.dtype)  # a collapsed swarm: r = 0 for every pair, any scale


def _logits(kernel, xi, x, ai, a, kappa, kf, ebias, dmax, shifted, kernel_factor, at_infinity, least=None):
    """``(B, C)`` log-weights ``-kf · (-log k(x_i, x_j)) - α E_j`` (``ebias = -α E``, ``-inf`` where
    excluded) of the rows ``xi`` against the columns ``x``. At ``α = ∞`` the limit of the
    normalised weights (``shifted``: ``E_j - E_min``, ``∞`` where excluded): with
    ``kernel_factor="alpha"`` the weights ``exp(-α (-log k_ij + E_j - E_min))`` concentrate,
    equally, on the ``j`` that minimise the score ``-log k_ij + E_j - E_min``; with ``"const"``
    (``k_ij exp(-α (E_j - E_min))``) on the ``j`` of least energy among those with
    ``k_ij > 0``, weighted by ``k_ij``. (The plain products would be ``∞ · 0``: NaN.) There
    ``least`` is each row's least score over every column (``None``: ``(logits, scores)``).
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
    if least is None:
        return score
    # The least score comes from a pass of its own: the same formula, compiled apart, may round
    # differently (by an ulp or so), so a score within a few ulps of it counts as least.
    tol = 8 * jnp.finfo(score.dtype).eps * jnp.maximum(jnp.abs(least), 1)
    win = (score <= (least + tol)[:, None]) & jnp.isfinite(score)
    return jnp.where(win, keep, -jnp.inf).astype(ebias.dtype)


def polar_consensus(x, energy, alpha, *, kappa, kernel="gaussian", kernel_factor="alpha", mask=None, chunk=None,
                    with_cov: str | None = None, drift_for_cov=None, col_chunk: int | None = None):
    """Per-particle consensus points ``m_i`` (``(N, d)``).

    With ``with_cov="local"`` also ``C_i = Σ_j w_ij (x_j - m_i)(x_j - m_i)ᵀ``; with
    ``with_cov="cbxpy"`` ``C_i = Σ_j w_ij u_j u_jᵀ`` for the given ``drift_for_cov`` ``u``.
    Returns ``m`` or ``(m, C)``. ``alpha = ∞`` gives the α → ∞ limit (see the module docstring).

    The weight matrix is never formed: rows ``i`` go ``chunk`` at a time and, within a block of
    rows, columns ``j`` ``col_chunk`` at a time (``None``: automatic), each row's normalisation
    a running log-sum-exp over the column blocks (rescaled where its maximum grows). Besides
    ``x`` and the result a call holds one block's temporaries, no ``(N, d)`` copy.
    """
    n, d = x.shape
    ok = jnp.all(jnp.isfinite(x), axis=1) & jnp.isfinite(energy)
    if mask is not None:
        ok = ok & mask
    center = jnp.sum(jnp.where(ok[:, None], x, 0), axis=0) / jnp.maximum(jnp.sum(ok), 1).astype(x.dtype)
    # Energies shifted by the smallest valid one (the weights are normalised per row, so a
    # common shift cancels): -α E itself overflows float32 for large α |E|.
    e_min = jnp.min(jnp.where(ok, energy, jnp.inf))
    infinite = jnp.isinf(jnp.asarray(alpha, x.dtype))  # the α = ∞ limit (see _logits)
    shifted = jnp.where(ok, energy - e_min, jnp.inf)  # E_j - E_min, ∞ where excluded: the α = ∞ limit's
    ebias = jnp.where(ok, gibbs_exponent(jnp.asarray(alpha, x.dtype), jnp.where(ok, energy - e_min, 0)), -jnp.inf)
    kf = alpha if kernel_factor == "alpha" else 1.0
    wdt = jnp.result_type(x.dtype, energy.dtype)  # the weights' dtype (energies may be wider than x)
    bi, bj = _blocks(n, chunk, d, col_chunk)
    dmax = None
    if kernel == "taz":
        dmax = _max_distance(jnp.where(ok[:, None], x, 0), ok, bi, bj)

    def columns(j0, nj):
        """Block ``j0``'s particles (0 where excluded), centred, and the values their weights average."""
        okj = pop.slice_rows(ok, j0, nj)[:, None]
        xj = pop.slice_rows(x, j0, nj)
        xz = jnp.where(okj, xj, 0)
        aj = jnp.where(okj, xj - center[None], 0)
        if with_cov is None:
            return xz, aj, xz
        u = aj if with_cov == "local" else jnp.where(okj, pop.slice_rows(drift_for_cov, j0, nj), 0)
        return xz, aj, jnp.concatenate([xz, (u[:, :, None] * u[:, None, :]).reshape(nj, d * d)], axis=1)

    def block(at_infinity, out, i0, ni):
        xi = pop.slice_rows(x, i0, ni)
        ai = xi - center[None]

        def logits(j0, nj, least):
            xz, aj, vals = columns(j0, nj)
            lg = _logits(kernel, xi, xz, ai, aj, kappa, kf, pop.slice_rows(ebias, j0, nj), dmax,
                         pop.slice_rows(shifted, j0, nj), kernel_factor, at_infinity, least)
            return lg, vals

        least = None
        if at_infinity:  # each row's least score over every column, a pass of its own
            def low(lo, _, j0, nj):
                xz, aj, _ = columns(j0, nj)
                score = _logits(kernel, xi, xz, ai, aj, kappa, kf, None, dmax, pop.slice_rows(shifted, j0, nj),
                                kernel_factor, True)
                return jnp.minimum(lo, jnp.min(score, axis=1))

            least = pop.over_blocks(n, bj, low, jnp.full((ni,), jnp.inf, wdt))

        def add(carry, _, j0, nj):
            top, total, acc = carry
            lg, vals = logits(j0, nj, least)
            new_top = jnp.maximum(top, jnp.max(lg, axis=1))
            safe = jnp.where(jnp.isfinite(new_top), new_top, 0)  # a row with no weight yet: nothing to rescale
            rescale = jnp.where(jnp.isfinite(top), jnp.exp(top - safe), 0)
            p = jnp.exp(lg - safe[:, None])
            p = jnp.where(jnp.isfinite(p), p, 0)
            return new_top, total * rescale + jnp.sum(p, axis=1), acc * rescale[:, None] + p @ vals

        width = d if with_cov is None else d + d * d
        top, total, acc = pop.over_blocks(n, bj, add, (jnp.full((ni,), -jnp.inf, wdt), jnp.zeros((ni,), wdt),
                                                    jnp.zeros((ni, width), wdt)))
        # A row with no weight at all (every pair excluded) gives m_i = 0, as the weights' NaN set to 0 would.
        acc = jnp.where((total > 0)[:, None], acc / jnp.where(total > 0, total, 1)[:, None], 0)
        m_i = acc[:, :d]
        if with_cov is None:
            return jax.lax.dynamic_update_slice_in_dim(out, m_i, i0, axis=0)
        c = acc[:, d:].reshape(ni, d, d)
        if with_cov == "local":
            am = m_i - center[None]
            c = c - am[:, :, None] * am[:, None, :]
        return (jax.lax.dynamic_update_slice_in_dim(out[0], m_i, i0, axis=0),
                jax.lax.dynamic_update_slice_in_dim(out[1], c, i0, axis=0))

    out: Any = jnp.zeros((n, d), wdt)
    if with_cov is not None:
        out = (out, jnp.zeros((n, d, d), wdt))
    # α = ∞ takes its own branch: finite α (every step but a degenerate schedule's) runs the plain kernel
    return jax.lax.cond(infinite, lambda o: pop.over_blocks(n, bi, lambda c, _, i0, ni: block(True, c, i0, ni), o),
                        lambda o: pop.over_blocks(n, bi, lambda c, _, i0, ni: block(False, c, i0, ni), o), out)


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
