"""The SDE of every particle system: noise draws, diffusion models and one Euler–Maruyama step.

FedCBO eq. (4) for one objective L, with consensus point m::

    dθ = -λ1 (θ - m) dt - λ2 ∇L(θ) dt + σ1 D(θ - m) dB + σ2 |∇L(θ)| dB~

with the consensus diffusion ``D`` either isotropic, ``D(u) dB = |u| dB`` (the norm of
the whole parameter vector of the agent), or anisotropic (Carrillo et al. 2021),
``D(u) dB = u ∘ dB`` (component-wise). Its Euler–Maruyama discretisation, eq. (15)::

    θ ← θ - λ1 γ (θ - m) - λ2 γ ∇L(θ) + σ1 √γ D(θ - m) z + σ2 √γ |∇L(θ)| z~,

``z, z~ ~ N(0, I)`` independent. :func:`em_update` is that step for any increment model:
the CBX family's noise models (:func:`noise_term`: also constant, covariance and
user-supplied noise) and the clustered systems' (:func:`euler_maruyama`) call it, and
FedCBO's aggregation step uses :func:`diffusion`. Every function works on stacked
populations (rows are agents). How the draws are laid out for XLA:CPU is
:mod:`cbo_jax._xla_cpu`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import population as pop
from cbo_jax._xla_cpu import normal_agent_axis_last, written_out

PyTree = Any

__all__ = ["NOISE_KINDS", "FAMILY_NOISE", "normal_like", "per_particle_normal", "counter_normal", "draw_normal",
           "diffusion",
           "noise_term", "weighted_cov", "cov_sqrt", "em_update", "euler_maruyama"]

NOISE_KINDS = ("anisotropic", "isotropic", "none")
FAMILY_NOISE = ("anisotropic", "isotropic", "constant", "covariance", "sampling", "none")

# ----------------------------------------------------------------------------------------
# Draws
# ----------------------------------------------------------------------------------------


def normal_like(key: jax.Array, tree: PyTree) -> PyTree:
    """Independent standard normals with the structure, shapes and dtypes of ``tree``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys: Iterable[jax.Array] = [key]
    if len(leaves) > 1:
        keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [normal_agent_axis_last(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)]
    )


def per_particle_normal(key: jax.Array, tree: PyTree, ids: jax.Array) -> PyTree:
    """Standard normals for each agent from its own stream ``fold_in(key, ids[i])``.

    Agent ``i``'s draw depends only on ``key`` and its id, not on its row: permuting
    the agents together with their ids permutes the draws the same way (the
    permutation-invariance property of the particle system holds exactly in
    simulation). Slower than :func:`normal_like` (one key derivation per agent).
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys: Iterable[jax.Array] = [key]
    if len(leaves) > 1:
        keys = jax.random.split(key, len(leaves))

    def draw(k, leaf):
        return jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(k, i), leaf.shape[1:], leaf.dtype))(ids)

    return jax.tree_util.tree_unflatten(treedef, [draw(k, leaf) for k, leaf in zip(keys, leaves)])


def _unit_interval(words, dtype) -> jax.Array:
    """Uniforms in ``[nextafter(-1, 0), 1)`` from random bits: one uint32 word per float32 number
    (its 23 high bits), a pair ``(hi, lo)`` per float64 number (52 bits)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        hi, lo = words
        bits = (hi.astype(jnp.uint64) << jnp.uint64(32)) | lo.astype(jnp.uint64)
        f = jax.lax.bitcast_convert_type((bits >> jnp.uint64(12)) | jnp.uint64(0x3FF0000000000000), jnp.float64)
    else:
        f = jax.lax.bitcast_convert_type((words >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32)
    f = f - 1.0  # [0, 1)
    low = np.nextafter(np.array(-1.0, f.dtype), np.array(0.0, f.dtype))
    return jnp.maximum(low, f * (1.0 - low) + low)


def counter_normal(key: jax.Array, tree: PyTree, ids: jax.Array) -> PyTree:
    """Standard normals shaped like ``tree`` whose row ``i`` depends only on ``key`` and ``ids[i]``.

    A counter-based layout: number ``j`` of row ``i`` of a leaf is made from the Threefry-2x32
    hash of ``key`` (one key per leaf) at the counter ``(⌊j/2⌋, ids[i])`` (float32: the two
    words of one hash make two numbers; float64: one number), through ``sqrt(2) erf⁻¹(u)`` of a
    uniform ``u``. A block of rows, or the rows one device holds, computes exactly the numbers the
    whole population would, at the speed of JAX's non-partitionable layout (one hash per two
    float32 numbers), where :func:`per_particle_normal` derives a key per row and JAX's
    partitionable layout spends a hash per number.
    """
    from jax.extend.random import threefry2x32_p

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys: Iterable[jax.Array] = [key]
    if len(leaves) > 1:
        keys = jax.random.split(key, len(leaves))
    rows = jnp.asarray(ids).astype(jnp.uint32)

    def draw(k, leaf):
        dtype = jnp.dtype(leaf.dtype)
        wide = dtype == jnp.float64
        per_row = math.prod(leaf.shape[1:])
        hashes = per_row if wide else -(-per_row // 2)
        kd = jax.random.key_data(k)
        n = rows.shape[0]
        # On XLA:CPU the numbers are made with the agent axis last and written out before it moves
        # to the front (as normal_like's): a CBO step at N = 1e5 ran 1.06x faster (the same numbers).
        last = jax.default_backend() == "cpu"
        # the counters flattened before the hash: over a 2-D array it ran 5x slower on XLA:CPU
        shape = (hashes, n) if last else (n, hashes)
        x0 = jnp.broadcast_to(jnp.arange(hashes, dtype=jnp.uint32).reshape((-1, 1) if last else (1, -1)), shape)
        x1 = jnp.broadcast_to(rows.reshape((1, -1) if last else (-1, 1)), shape)
        y0, y1 = threefry2x32_p.bind(kd[..., 0], kd[..., 1], x0.reshape(-1), x1.reshape(-1))
        if wide:
            u = _unit_interval((y0, y1), dtype).reshape(shape)
        elif last:  # row i's numbers 2j, 2j + 1 are the two words of hash j
            u = _unit_interval(jnp.stack([y0.reshape(shape), y1.reshape(shape)], axis=1).reshape(2 * hashes, n)[:per_row],
                               jnp.float32)
        else:
            u = _unit_interval(jnp.stack([y0, y1], axis=-1).reshape(n, 2 * hashes)[:, :per_row], jnp.float32)
        z = jnp.sqrt(jnp.asarray(2.0, u.dtype)) * jax.lax.erf_inv(u)
        # in a kernel of its own on XLA:CPU, as normal_like's draws: fused into the update that reads
        # it, the transform runs slower and rounds as that kernel's vector code does
        z = written_out(z.astype(dtype), k)
        return (jnp.moveaxis(z, 0, -1) if last else z).reshape(leaf.shape)

    return jax.tree_util.tree_unflatten(treedef, [draw(k, leaf) for k, leaf in zip(keys, leaves)])


def draw_normal(key, tree, ids, rng: str):
    """Standard normals with the structure of ``tree``, in the layout ``rng`` names.

    ``"counter"``: :func:`counter_normal` of the rows ``ids`` (block- and device-invariant);
    ``"per-particle"``: row ``i`` from ``fold_in(key, ids[i])``; ``"fast"`` and
    ``"partitionable"``: one array per leaf (:func:`normal_like`) in JAX's layout of that name.
    """
    if rng == "counter":
        return counter_normal(key, tree, ids)
    if rng == "per-particle":
        return per_particle_normal(key, tree, ids)
    return normal_like(key, tree)


# ----------------------------------------------------------------------------------------
# Diffusion and noise models
# ----------------------------------------------------------------------------------------


def diffusion(kind: str, u: PyTree, z: PyTree) -> PyTree:
    """``D(u) z`` for a population ``u`` (rows are agents) and normals ``z``.

    ``"anisotropic"``: ``u ∘ z``; ``"isotropic"``: ``|u_i| z_i`` with ``|u_i|`` the
    Euclidean norm of agent ``i`` over all leaves; ``"none"``: zeros.
    """
    if kind == "anisotropic":
        return jax.tree_util.tree_map(jnp.multiply, u, z)
    if kind == "isotropic":
        return pop.tree_scale_rows(z, pop.norms(u))
    if kind == "none":
        return jax.tree_util.tree_map(jnp.zeros_like, z)
    raise ValueError(f"unknown noise kind {kind!r}; choose from {NOISE_KINDS}")


def weighted_cov(u: jax.Array, logw: jax.Array) -> jax.Array:
    """``Σ_j w_j u_j u_jᵀ`` for rows ``u`` (``(N, D)``) and log-weights ``(N,)`` (``-inf``: excluded)."""
    w = jnp.exp(logw).astype(u.dtype)
    u = jnp.where(jnp.isfinite(logw)[:, None] & jnp.all(jnp.isfinite(u), axis=1, keepdims=True), u, 0)
    return jnp.einsum("j,ja,jb->ab", w, u, u)


def cov_sqrt(c: jax.Array) -> jax.Array:
    """Symmetric square root of a positive semi-definite matrix (batched): ``V √max(Λ, 0) Vᵀ``."""
    lam, v = jnp.linalg.eigh(c)
    return jnp.einsum("...ab,...b,...cb->...ac", v, jnp.sqrt(jnp.maximum(lam, 0)), v)


def noise_term(kind, key, u, *, dt, alpha, normal, logw=None, mode: str = "sampling", root=None):
    """The noise increment of one step before ``σ``: ``(scale, direction)``, increment = ``scale · direction``.

    ``u`` is the drift ``x_i - m`` (a population). Kinds (CBXpy's ``cbx.noise``):

    * ``"anisotropic"``: ``√dt · u_i ∘ ξ_i``;  ``"isotropic"``: ``√dt · |u_i| ξ_i`` (:func:`diffusion`);
    * ``"constant"``: ``√dt · ξ_i``;
    * ``"covariance"``: ``√(2 dt / λ) · C^{1/2} ξ_i`` with ``C = Σ_j w_j u_j u_jᵀ`` (the
      consensus weights ``w``) and ``λ = 1/(1 + α)`` (``mode="sampling"``, CBXpy's default
      for every dynamic) or ``λ = 1`` (``mode="optimization"``, CBS); consensus-based
      sampling, Carrillo, Hoffmann, Stuart and Vaes (2022), eq. (1.4);
    * a callable ``kind(key, u, dt)``: its result (scale ``1``).

    ``root``: ``C^{1/2}`` computed already (over every particle's drift, where ``u`` is a block of
    them: :meth:`cbo_jax.dynamics.core.Engine.blocked`), in place of ``logw``.
    """
    sqdt = jnp.sqrt(jnp.asarray(dt))
    if callable(kind):
        return 1.0, _callable_increment(kind(key, u, dt), u)
    if kind in ("anisotropic", "isotropic"):
        return sqdt, diffusion(kind, u, normal(key, u))
    if kind == "constant":
        return sqdt, normal(key, u)
    if kind in ("covariance", "sampling"):
        flat, unravel = pop.ravel(u)
        root = cov_sqrt(weighted_cov(flat, logw)) if root is None else root
        z, _ = pop.ravel(normal(key, u))
        lam_inv = (1.0 + alpha) if mode == "sampling" else 1.0
        return jnp.sqrt(2.0 * dt * lam_inv), unravel(z @ root.T)
    raise ValueError(f"unknown noise model {kind!r}; choose from {FAMILY_NOISE} or pass a callable")


def _callable_increment(out, u):
    """A noise callable's increment, checked (while tracing) to be shaped like the drift ``u``: a
    ``(d,)`` or ``(N, 1)`` result would broadcast silently (one draw shared by every particle)."""
    want = jax.tree_util.tree_structure(u)
    try:
        leaves = want.flatten_up_to(out)
    except (TypeError, ValueError):
        raise ValueError(f"the noise callable must return an increment with the structure of the drift, {want}; "
                         f"got {jax.tree_util.tree_structure(out)}") from None
    for got, ref in zip(leaves, jax.tree_util.tree_leaves(u)):
        if np.shape(got) != np.shape(ref):
            raise ValueError(f"the noise callable returned shape {tuple(np.shape(got))} for a drift of shape "
                             f"{tuple(np.shape(ref))}: it must return one increment per particle, shaped like the "
                             "drift")
    return out


# ----------------------------------------------------------------------------------------
# One Euler–Maruyama step
# ----------------------------------------------------------------------------------------


def _is_zero(v) -> bool:
    # Static (Python) zeros skip drawing noise that would be multiplied by 0.
    return isinstance(v, (int, float)) and v == 0


def em_update(key: jax.Array, x: PyTree, u: PyTree, *, dt, lambda1, sigma1,
              increment: Callable[[jax.Array, PyTree], tuple[Any, PyTree]] | None, grad: PyTree | None = None,
              lambda2=0.0, sigma2=0.0, normal: Callable = normal_like) -> PyTree:
    """Eq. (15) for every agent of ``x`` with the drift ``u`` (``x - m``, possibly corrected)::

        x - λ1 dt u + σ1 · increment(u) - λ2 dt ∇L + σ2 √dt |∇L| ξ~.

    ``increment(key, u) -> (scale, direction)`` is the consensus noise before ``σ1``
    (:func:`noise_term`; ``None``: no noise); ``grad`` the gradients (``None``: no gradient
    terms); ``normal(key, tree)`` draws ``ξ~``. The key is split once, the consensus noise
    drawn from the first half and the gradient noise from the second. Strengths may be
    numbers or traced arrays; a Python ``0`` leaves its term out (and its draw).
    """
    key_c, key_g = jax.random.split(key)
    if increment is None or _is_zero(sigma1):
        new = jax.tree_util.tree_map(lambda xi, ui: xi - (lambda1 * dt) * ui, x, u)
    else:
        scale, dz = increment(key_c, u)
        new = jax.tree_util.tree_map(lambda xi, ui, di: xi - (lambda1 * dt) * ui + (sigma1 * scale) * di, x, u, dz)
    if grad is None:
        return new
    new = jax.tree_util.tree_map(lambda ni, gi: ni - (lambda2 * dt) * gi, new, grad)
    if _is_zero(sigma2):
        return new
    # σ2 |∇L| dB~ is isotropic by definition in eq. (4).
    sqdt = jnp.sqrt(jnp.asarray(dt))
    z_g = normal(key_g, x)
    return jax.tree_util.tree_map(lambda ni, di: ni + (sigma2 * sqdt) * di, new, diffusion("isotropic", grad, z_g))


def euler_maruyama(
    key: jax.Array,
    x: PyTree,
    m: PyTree,
    *,
    dt,
    lambda1,
    sigma1,
    noise: str = "anisotropic",
    grad: PyTree | None = None,
    lambda2=0.0,
    sigma2=0.0,
    normal=normal_like,
) -> PyTree:
    """One Euler–Maruyama step of FedCBO eq. (15) for every agent of ``x`` (:func:`em_update`).

    Args:
      key: PRNG key for this step.
      x: population ``θ`` (stacked pytree or ``(N, d)``).
      m: consensus point, broadcastable against ``x`` (no agent axis), or one per agent.
      dt: step ``γ``.
      lambda1, sigma1: consensus drift and diffusion strengths.
      noise: ``"anisotropic"``, ``"isotropic"`` or ``"none"``.
      grad: ``∇L(θ)`` per agent (same structure as ``x``) or ``None`` for no gradient terms.
      lambda2, sigma2: gradient drift and gradient-noise strengths.
      normal: ``normal(key, x)`` draws the standard normals (default
        :func:`normal_like`; see :func:`per_particle_normal`).

    Strengths may be Python numbers or traced arrays (for vmapped parameter sweeps);
    a Python ``0`` skips the corresponding noise draw.
    """
    if noise not in NOISE_KINDS:
        raise ValueError(f"unknown noise kind {noise!r}; choose from {NOISE_KINDS}")
    if isinstance(dt, (int, float, np.integer, np.floating)) and not (math.isfinite(dt) and dt >= 0):
        # √dt of a negative step would be NaN in every particle (traced steps are checked by the configs)
        raise ValueError(f"dt must be a finite number >= 0, got {dt!r}")

    def increment(k, u):
        return jnp.sqrt(jnp.asarray(dt)), diffusion(noise, u, normal(k, u))

    return em_update(key, x, pop.tree_sub(x, m), dt=dt, lambda1=lambda1, sigma1=sigma1,
                     increment=None if noise == "none" else increment, grad=grad, lambda2=lambda2, sigma2=sigma2,
                     normal=normal)
