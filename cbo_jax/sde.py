"""Drift and diffusion terms of the CBO SDE family and one Euler–Maruyama step.

FedCBO eq. (4) for one objective L, with consensus point m::

    dθ = -λ1 (θ - m) dt - λ2 ∇L(θ) dt + σ1 D(θ - m) dB + σ2 |∇L(θ)| dB~

with the consensus diffusion ``D`` either isotropic, ``D(u) dB = |u| dB`` (the norm of
the whole parameter vector of the agent), or anisotropic (Carrillo et al. 2021),
``D(u) dB = u ∘ dB`` (component-wise). Its Euler–Maruyama discretisation, eq. (15)::

    θ ← θ - λ1 γ (θ - m) - λ2 γ ∇L(θ) + σ1 √γ D(θ - m) z + σ2 √γ |∇L(θ)| z~,

``z, z~ ~ N(0, I)`` independent. Every function works on stacked populations.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching

from cbo_jax import population as pop

PyTree = Any

__all__ = ["NOISE_KINDS", "normal_like", "per_particle_normal", "diffusion", "euler_maruyama"]

NOISE_KINDS = ("anisotropic", "isotropic", "none")


_WRITE_OUT_ON_CPU = True


@custom_batching.custom_vmap
def _kernel_boundary(bits: jax.Array, z: jax.Array) -> jax.Array:
    first = jnp.ravel(bits)[0]
    return jax.lax.cond((first | jnp.ones_like(first)) != 0, lambda a: a, jnp.zeros_like, z)


@_kernel_boundary.def_vmap
def _kernel_boundary_vmap(axis_size, in_batched, bits, z):
    # One predicate for the whole batch (from its first key), so the conditional stays a
    # conditional instead of becoming a select that XLA fuses away.
    if not in_batched[1]:
        z = jnp.broadcast_to(z, (axis_size,) + z.shape)
    return _kernel_boundary(bits, z), True


def written_out(z: jax.Array, key: jax.Array) -> jax.Array:
    """``z``, computed in a kernel of its own on XLA:CPU (elsewhere: ``z`` unchanged).

    ``key`` is any PRNG key (or raw key data) of the step: only its bits are read. For
    example, XLA:CPU fuses the normal transform (``erf_inv`` of the threefry bits) into the kernel
    that reads the draw with the agent axis moved to the front, where it runs about 1.5x
    slower than over the contiguous ``(d, N)`` array (benchmarks/RESULTS_cbx.md). A
    conditional is a kernel boundary XLA keeps (it drops ``optimization_barrier`` on the
    CPU); its predicate, ``key_bits | 1 != 0``, is always true but not a compile-time
    constant, and stays one predicate under ``vmap`` (runs, sweeps). Not used on GPUs,
    where a conditional waits on its predicate.
    """
    if not _WRITE_OUT_ON_CPU or jax.default_backend() != "cpu":
        return z
    bits = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return _differentiable_boundary(bits, z)


@jax.custom_jvp
def _differentiable_boundary(bits: jax.Array, z: jax.Array) -> jax.Array:
    return _kernel_boundary(bits, z)


@_differentiable_boundary.defjvp
def _differentiable_boundary_jvp(primals, tangents):
    # The identity, so its derivative is the identity (custom_vmap alone has no JVP rule).
    bits, z = primals
    return _differentiable_boundary(bits, z), tangents[1]


def _normal_agent_axis_last(key: jax.Array, shape, dtype) -> jax.Array:
    # Drawn with the agent axis last, then moved to the front. Same distribution; on
    # XLA:CPU this avoids a slow fusion of the normal transform into the row-broadcast
    # update (1.9x faster full CBO step, benchmarks/RESULTS.md).
    if len(shape) < 2:
        return jax.random.normal(key, shape, dtype)
    z = written_out(jax.random.normal(key, tuple(shape[1:]) + (shape[0],), dtype), key)
    return jnp.moveaxis(z, -1, 0)


def normal_like(key: jax.Array, tree: PyTree) -> PyTree:
    """Independent standard normals with the structure, shapes and dtypes of ``tree``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys: Iterable[jax.Array] = [key]
    if len(leaves) > 1:
        keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [_normal_agent_axis_last(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)]
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


def _is_zero(v) -> bool:
    # Static (Python) zeros skip drawing noise that would be multiplied by 0.
    return isinstance(v, (int, float)) and v == 0


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
    """One Euler–Maruyama step of FedCBO eq. (15) for every agent of ``x``.

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
        # √dt of a negative step was NaN in every particle (traced steps are checked by the configs)
        raise ValueError(f"dt must be a finite number >= 0, got {dt!r}")
    u = pop.tree_sub(x, m)
    sqdt = jnp.sqrt(jnp.asarray(dt))
    key_c, key_g = jax.random.split(key)
    if noise == "none" or _is_zero(sigma1):
        new = jax.tree_util.tree_map(lambda xi, ui: xi - (lambda1 * dt) * ui, x, u)
    else:
        z = normal(key_c, x)
        dz = diffusion(noise, u, z)
        new = jax.tree_util.tree_map(lambda xi, ui, di: xi - (lambda1 * dt) * ui + (sigma1 * sqdt) * di, x, u, dz)
    if grad is not None:
        new = jax.tree_util.tree_map(lambda ni, gi: ni - (lambda2 * dt) * gi, new, grad)
        if _is_zero(sigma2):
            return new
        # σ2 |∇L| dB~ is isotropic by definition in eq. (4).
        z_g = normal(key_g, x)
        new = jax.tree_util.tree_map(
            lambda ni, di: ni + (sigma2 * sqdt) * di, new, diffusion("isotropic", grad, z_g)
        )
    return new
