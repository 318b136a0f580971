"""Consensus kernels: Gibbs weights in log space, consensus points, sub-level masks.

The consensus point of a population ``{x_i}`` with energies ``E_i`` is

.. math::  m_\\alpha = \\sum_i x_i\\, \\omega_\\alpha(x_i) / \\sum_i \\omega_\\alpha(x_i),
           \\qquad \\omega_\\alpha(x) = e^{-\\alpha E(x)}

(FedCBO eq. (4) and (19); CB²O eq. (1.3) with ``E = G`` restricted to the
β-quantile set ``Q_β``). The weights are never formed as ``exp(-α E)``: energies are
shifted by their minimum over the valid agents so that the best agent has log-weight
exactly ``0`` and every other log-weight is ``-α (E_i - E_min) <= 0``; normalisation is
a log-sum-exp. The result is the exact normalised Gibbs weight, finite for any
``α >= 0`` (``1e12`` and ``∞``, the arg-min, included) and any finite energies. Agents with a non-finite
energy, or masked out, get weight exactly ``0``, and so does an agent whose parameters hold a NaN or an infinity: its
row is zeroed before the contraction (``0 · NaN`` would otherwise be NaN), so such an
agent can never poison the consensus.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.typing import ArrayLike
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop

PyTree = Any

__all__ = [
    "log_consensus_weights",
    "consensus_weights",
    "consensus_point",
    "streaming_consensus_point",
    "subset_consensus",
    "quantile_mask",
    "effective_sample_size",
]


def _real_energy(energy) -> jax.Array:
    """``energy`` as an array of a floating dtype of at least 32 bits: integer (or boolean)
    energies, from an objective that counts, are promoted (``float32`` for ``int32``), since α
    is cast to the energies' dtype; so are bfloat16 and float16 energies, whose weights and
    normaliser would otherwise be rounded to 8 or 11 bits (at N = 65536 the weights would sum
    to 0.97, and a streaming denominator would stop growing at 256)."""
    energy = jnp.asarray(energy)
    if not jnp.issubdtype(energy.dtype, jnp.inexact) or jnp.finfo(energy.dtype).bits < 32:
        energy = energy.astype(jnp.promote_types(energy.dtype, jnp.float32))
    return energy


def _alpha_col(alpha, energy):
    if isinstance(alpha, (int, float, np.number, np.ndarray)):  # a host value: checked (a traced one cannot be)
        host = np.asarray(alpha, np.float64)
        if np.isnan(host).any() or (host < 0).any():
            raise ValueError(f"alpha must be >= 0 (not NaN), got {alpha!r}: a negative α weighs the worst agents most")
    alpha = jnp.asarray(alpha, dtype=energy.dtype)
    # A scalar alpha, or one alpha per row of a batched energy (shape energy.shape[:-1]).
    if alpha.ndim and alpha.shape != energy.shape[:-1]:  # it broadcast into a (3, 3) "consensus" of one row
        raise ValueError(f"alpha must be a scalar or one value per row of the energies, shape {energy.shape[:-1]}; "
                         f"got shape {alpha.shape} for energies of shape {energy.shape}")
    return alpha if alpha.ndim == 0 else alpha[..., None]


@jax.custom_jvp
def gibbs_exponent(alpha, shifted):
    """``-α · (E - E_min)`` for shifted energies ``>= 0``, with its limits where the product
    is ``0 · ∞``: ``0`` for the best agents at ``α = ∞`` and for every agent at ``α = 0``
    (an energy spread beyond the float range). Anywhere else it is the plain product. Its
    derivative (:func:`_gibbs_exponent_jvp`) is the product's, ``-(E - E_min) dα``, at
    ``α = 0`` too, where the value's mask would have cut it to 0."""
    return jnp.where((shifted == 0) | (alpha == 0), 0.0, -alpha * shifted).astype(shifted.dtype)


@gibbs_exponent.defjvp
def _gibbs_exponent_jvp(primals, tangents):
    # A rule of its own, so that the value keeps the compiled form the pinned runs were made with.
    alpha, shifted = primals
    d_alpha, d_shifted = tangents
    out = gibbs_exponent(alpha, shifted)
    limit = (shifted == 0) | ((alpha == 0) & jnp.isinf(shifted)) | (jnp.isinf(alpha) & jnp.isinf(shifted))
    s = jnp.where(limit, 0.0, shifted)
    a = jnp.where(limit, 0.0, alpha)
    tangent = jnp.where(limit, 0.0, -(d_alpha * s + a * d_shifted))
    return out, jnp.broadcast_to(tangent, out.shape).astype(out.dtype)


def _bool_mask(mask, shape: tuple) -> jax.Array:
    """``mask`` checked: boolean, of (or broadcasting to) the energies' ``shape``."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_ or jnp.broadcast_shapes(mask.shape, shape) != tuple(shape):
        raise ValueError(f"mask must be boolean, of the energies' shape {tuple(shape)}; got {mask.dtype} {mask.shape}"
                         + (" (a 0/1 array: mask.astype(bool))" if mask.dtype != jnp.bool_ else ""))
    return mask


def log_consensus_weights(energy: jax.Array, alpha, mask: jax.Array | None = None) -> jax.Array:
    """Normalised log-weights ``log(ω_i / Σ_j ω_j)`` along the last axis.

    Args:
      energy: ``(..., N)`` energies ``E_i`` (integer energies are promoted to float).
      alpha: inverse temperature ``α >= 0``: a scalar, or one per leading row.
      mask: optional boolean ``(..., N)``; ``False`` excludes an agent.

    Returns ``(..., N)`` log-weights; excluded and non-finite agents get ``-inf``.
    If a row has no valid agent at all its weights are NaN (there is no consensus).
    """
    energy = _real_energy(energy)
    valid = jnp.isfinite(energy)
    if mask is not None:
        valid = valid & _bool_mask(mask, energy.shape)
    e_min = jnp.min(jnp.where(valid, energy, jnp.inf), axis=-1, keepdims=True)
    shifted = jnp.where(valid, energy - e_min, 0.0)  # >= 0 on valid agents
    logw = jnp.where(valid, gibbs_exponent(_alpha_col(alpha, energy), shifted), -jnp.inf)
    # max(logw) == 0 exactly (attained by the best agent), so logsumexp needs no shift
    # and lies in [0, log N].
    return logw - jax.nn.logsumexp(logw, axis=-1, keepdims=True)


def consensus_weights(energy: jax.Array, alpha: ArrayLike, mask: jax.Array | None = None) -> jax.Array:
    """Normalised Gibbs weights ``ω_i / Σ_j ω_j`` (see :func:`log_consensus_weights`)."""
    return jnp.exp(log_consensus_weights(energy, alpha, mask))


def _finite_population(population: PyTree, mask):
    """Zero the non-finite rows of ``population`` and drop them from ``mask``."""
    clean, ok = pop.zero_nonfinite_rows(population)
    return clean, ok if mask is None else mask & ok


def _check_energy_shape(energy, n: int) -> None:
    if jnp.ndim(energy) not in (1, 2) or jnp.shape(energy)[-1] != n:  # a length-1 energy broadcast to the mean
        raise ValueError(f"energy must be (N,) or (K, N) for the population's N = {n} agents, got shape "
                         f"{jnp.shape(energy)}")


def consensus_point(population: PyTree, energy: jax.Array, alpha: ArrayLike,
                    mask: jax.Array | None = None) -> PyTree:
    """Consensus point ``m_α`` of a population (FedCBO eq. (4), CB²O eq. (1.3)).

    Args:
      population: stacked pytree or ``(N, d)`` array.
      energy: ``(N,)`` energies, or ``(K, N)`` for K consensus points at once (for
        example one per objective of the clustered system, all over the same agents).
      alpha: scalar, or ``(K,)``.
      mask: optional boolean of the same shape as ``energy``.

    Returns a pytree without agent axis (``energy`` 1-D) or with leading axis K.
    Agents with non-finite parameters or energies get weight zero. With no agent left (every
    one masked out or non-finite) the consensus point is NaN: there is nothing to average
    (``cbo_jax.simulate`` refuses such a start).
    """
    _check_energy_shape(energy, pop.num_agents(population))
    population, mask = _finite_population(population, None if mask is None else _bool_mask(mask, jnp.shape(energy)))
    return pop.weighted_mean(population, consensus_weights(energy, alpha, mask))


def _rows(tree: PyTree, start, size: int) -> PyTree:
    return jax.tree_util.tree_map(lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, start, size, axis=0), tree)


def streaming_consensus_point(population: PyTree, energy: jax.Array, alpha, mask: jax.Array | None = None, *,
                              chunk: int) -> PyTree:
    """:func:`consensus_point` in one pass over chunks of ``chunk`` agents (large ``N``).

    The same Gibbs weights, shifted by the minimum valid energy so that every
    log-weight is ``<= 0``: ``m = Σ_i e^{-α(E_i - E_min)} θ_i / Σ_i e^{-α(E_i - E_min)}``,
    the sums accumulated chunk by chunk in a ``lax.scan`` (the best agent contributes
    ``1`` to the denominator, so it lies in ``[1, N]`` and the quotient is the normalised
    log-sum-exp form of :func:`consensus_point`, equal to rounding). No ``(N, d)``
    temporary is formed. Any ``N``: where ``chunk`` does not divide it, the last chunk is the
    last ``chunk`` agents, its rows already counted masked out. Agents with non-finite
    parameters or energies, or masked out, get weight zero, as in :func:`consensus_point`.
    """
    n = pop.num_agents(population)
    if not _checks.is_integer(chunk) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    chunk = min(int(chunk), n)
    _check_energy_shape(energy, n)
    energy = _real_energy(energy)
    ok_rows = pop.tree_isfinite_rows(population)
    valid = jnp.isfinite(energy) & ok_rows
    if mask is not None:
        valid = valid & _bool_mask(mask, energy.shape)
    e_min = jnp.min(jnp.where(valid, energy, jnp.inf), axis=-1, keepdims=True)
    a = _alpha_col(alpha, energy)
    num_chunks = -(-n // chunk)
    lead = energy.shape[:-1]  # () or (K,)

    def body(carry, c):
        den, num = carry
        start = jnp.minimum(c * chunk, n - chunk)  # the last chunk ends at N, its counted rows masked out
        e = jax.lax.dynamic_slice_in_dim(energy, start, chunk, axis=-1)
        v = jax.lax.dynamic_slice_in_dim(valid, start, chunk, axis=-1)
        if n % chunk:
            v = v & (start + jnp.arange(chunk) >= c * chunk)
        w = jnp.where(v, jnp.exp(gibbs_exponent(a, jnp.where(v, e - e_min, 0.0))), 0.0)
        rows, _ = pop.zero_nonfinite_rows(_rows(population, start, chunk))  # 0 · NaN would be NaN
        part = jax.tree_util.tree_map(  # bfloat16 / float16 rows are summed in float32
            lambda leaf: pop._rows_dot(w.astype(pop._accumulation_dtype(leaf.dtype)),
                                      leaf.astype(pop._accumulation_dtype(leaf.dtype))), rows)
        return (den + jnp.sum(w, axis=-1), jax.tree_util.tree_map(jnp.add, num, part)), None

    zero_num = jax.tree_util.tree_map(
        lambda leaf: jnp.zeros(lead + leaf.shape[1:], pop._accumulation_dtype(leaf.dtype)), population)
    (den, num), _ = jax.lax.scan(body, (jnp.zeros(lead, energy.dtype), zero_num), jnp.arange(num_chunks))
    return jax.tree_util.tree_map(
        lambda v, leaf: (v / den.astype(v.dtype).reshape(lead + (1,) * (v.ndim - len(lead)))).astype(leaf.dtype),
        num, population)


def subset_consensus(
    population: PyTree,
    idx: jax.Array,
    loss: jax.Array,
    alpha: ArrayLike,
    *,
    mask: jax.Array | None = None,
    method: str = "dense",
) -> PyTree:
    """Per-agent consensus over a selected subset of agents (FedCBO eq. (19)).

    Agent ``j`` downloaded the models ``idx[j, :]`` (``M`` of them) and measured their
    losses ``loss[j, :]`` on its own data; its consensus point is

        m_j = Σ_i θ_{idx[j,i]} μ_{j,i} / Σ_i μ_{j,i},   μ_{j,i} = exp(-α loss[j, i]).

    Args:
      population: stacked pytree with ``N`` agents.
      idx: integer ``(J, M)`` indices into the agent axis.
      loss: ``(J, M)`` losses.
      alpha: scalar or ``(J,)``.
      mask: optional boolean ``(J, M)``; ``False`` drops a download.
      method: ``"dense"`` scatters the weights into a ``(J, N)`` matrix and contracts
        it with the population (one matrix multiply; memory ``J·N + N·P``), best when
        the population is large per agent. ``"gather"`` gathers the ``J·M`` selected
        rows (memory ``J·M·P``), best for small models. Both give the same result; a
        model index repeated in a row counts once per repetition.

    Returns a population with ``J`` agents. Downloads of agents with non-finite
    parameters or losses get weight zero. ``idx`` must be integers in ``[0, N)`` of the
    shape of ``loss``; a concrete ``idx`` is checked (a traced one cannot be: there an
    index out of range is dropped by ``"dense"`` and gives NaN with ``"gather"``).
    """
    n = pop.num_agents(population)
    if not jnp.issubdtype(jnp.result_type(idx), jnp.integer) or jnp.ndim(idx) != 2 or \
            jnp.shape(idx) != jnp.shape(loss):
        raise ValueError(f"idx must be integer indices of the shape of loss {jnp.shape(loss)} (J, M); got "
                         f"{jnp.result_type(idx)} of shape {jnp.shape(idx)}")
    if not isinstance(idx, jax.core.Tracer):
        host = np.asarray(idx)
        if host.size and (host.min() < 0 or host.max() >= n):
            raise ValueError(f"idx must index the population's N = {n} agents, in [0, {n}); got values in "
                             f"[{host.min()}, {host.max()}] (negative indices do not count from the end here)")
    population, ok = pop.zero_nonfinite_rows(population)
    sel_ok = jnp.take(ok, idx)
    w = consensus_weights(loss, alpha, sel_ok if mask is None else mask & sel_ok)
    if method == "dense":
        rows = jnp.broadcast_to(jnp.arange(idx.shape[0])[:, None], idx.shape)
        dense = jnp.zeros((idx.shape[0], n), w.dtype).at[rows, idx].add(w)
        return pop.weighted_mean(population, dense)
    if method == "gather":
        selected = pop.gather(population, idx)  # leaves (J, M, ...)
        def contract(leaf):  # bfloat16 / float16 rows are summed in float32
            acc = pop._accumulation_dtype(leaf.dtype)
            return jnp.einsum("jm,jm...->j...", w.astype(acc), leaf.astype(acc)).astype(leaf.dtype)

        return jax.tree_util.tree_map(contract, selected)
    raise ValueError(f"method must be 'dense' or 'gather', got {method!r}")


def quantile_mask(energy: jax.Array, beta: ArrayLike, mask: jax.Array | None = None) -> jax.Array:
    """β-quantile sub-level set ``Q_β = {i : E_i <= q_β}`` (CB²O eq. (1.4), plain β-quantile).

    ``q_β = inf{q : β <= ρ(E <= q)}`` (eq. (1.5)) for the empirical measure ``ρ`` of the
    valid agents (finite, and ``mask`` where given) along the last axis: the ``⌈β n⌉``-th
    smallest of their ``n`` energies, so ``Q_β`` holds at least ``⌈β n⌉`` of them (more
    only on ties). ``⌈β n⌉`` allows for ``β``'s rounding (``0.3 · 10`` is 3, not 4). Where
    NumPy's default linear interpolation keeps ``⌊(n-1) β⌋ + 1``, the sets differ (never at
    ``β = 0.5``). ``β = 1`` keeps every valid agent (plain CBO). ``beta`` is one number in
    ``(0, 1]`` for every row (a concrete number is checked here; a traced one cannot be).
    Returns a boolean array of the shape of ``energy``; invalid agents are never in the set.
    """
    if jnp.ndim(beta) == 0 and not isinstance(beta, jax.core.Tracer):  # a concrete number (Python, NumPy, JAX)
        b = float(np.asarray(beta).real)
        if not 0.0 < b <= 1.0:  # a NumPy 1.5 would keep every agent, a 0.0 only the best one
            raise ValueError(f"quantile_mask: beta must lie in (0, 1], got {beta}")
    if jnp.ndim(beta) != 0:
        raise ValueError(f"quantile_mask: beta must be one number for every row, got shape {jnp.shape(beta)}")
    energy = jnp.asarray(energy)
    valid = jnp.isfinite(energy)
    if mask is not None:
        valid = valid & _bool_mask(mask, energy.shape)
    dtype = jnp.result_type(jnp.float32, beta)
    n = jnp.sum(valid, axis=-1, keepdims=True).astype(dtype)
    # ⌈β n⌉ less β's rounding (a few ulps of β n): 0.3 is 0.30000001 in float32
    bn = jnp.asarray(beta, dtype) * n
    k = jnp.ceil(bn - 4 * jnp.finfo(dtype).eps * bn).astype(jnp.int32)
    k = jnp.clip(k, 1, energy.shape[-1])
    ranked = jnp.sort(jnp.where(valid, energy, jnp.inf), axis=-1)
    q = jnp.take_along_axis(ranked, k - 1, axis=-1)
    return valid & (energy <= q)


def effective_sample_size(energy: jax.Array, alpha, mask: jax.Array | None = None) -> jax.Array:
    """Effective sample size ``J_eff(α) = (Σ ω_i)² / Σ ω_i²`` of the Gibbs weights.

    Lies in ``[1, N]``; it is ``N`` at ``α = 0`` and decreases to the number of
    minimising agents as ``α → ∞`` (Carrillo, Hoffmann, Stuart, Vaes 2022).
    Computed from normalised log-weights: ``J_eff = 1 / Σ_i w_i²``.
    """
    logw = log_consensus_weights(energy, alpha, mask)
    return jnp.exp(-jax.nn.logsumexp(2.0 * logw, axis=-1))
