"""Populations as stacked pytrees.

A *population* of ``N`` agents (particles) is any pytree whose leaves all carry a
leading axis of size ``N``: row ``i`` of every leaf belongs to agent ``i``. A plain
``(N, d)`` array is the simplest population; a stacked Flax parameter dict of ``N``
networks is another. Every helper here is one vectorised kernel over that axis.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from cbo_jax import _checks

PyTree = Any

__all__ = [
    "num_agents",
    "weighted_mean",
    "weighted_average",
    "mean",
    "gather",
    "sq_norms",
    "norms",
    "tree_sub",
    "tree_add",
    "tree_scale_rows",
    "tree_where_rows",
    "ravel",
    "unravel_fn",
    "pad_agents",
    "resize_rows",
    "per_agent",
    "tree_isfinite_rows",
    "zero_nonfinite_rows",
    "slice_rows",
    "update_rows",
    "over_blocks",
]


def num_agents(population: PyTree) -> int:
    """Return ``N``, the shared leading-axis size of every leaf.

    Raises ``ValueError`` if the population has no leaves, a scalar leaf, or leaves
    that disagree on ``N``.
    """
    leaves = jax.tree_util.tree_leaves(population)
    if not leaves:
        raise ValueError("population has no array leaves")
    sizes = set()
    for leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError("population leaves need a leading agent axis; got a scalar leaf")
        sizes.add(shape[0])
    if len(sizes) != 1:
        raise ValueError(f"population leaves disagree on the agent axis size: {sorted(sizes)}")
    return sizes.pop()


def _accumulation_dtype(dtype) -> Any:
    """The dtype a weighted sum over agents of ``dtype`` rows is formed in: ``float32`` for a
    low-precision float (bfloat16, float16: their weights, rounded to 8 or 11 bits, would
    not sum to one), else ``dtype`` itself. Integer (and boolean) rows are refused: their
    weighted mean, cast back to the rows' dtype, would be truncated (the weights to 0) without a word."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(f"a weighted mean over agents needs floating rows, got a population leaf of dtype {dtype}: "
                         f"cast the population first (e.g. x.astype(jnp.float32))")
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


# Above this many agents, one combination of the rows (weights ``(N,)``) is summed in blocks.
# XLA:CPU's matrix-vector kernel accumulates along the agent axis with an error that grows
# with N (as a running float32 sum's does): at N = 1e7, d = 20, one dot puts a consensus point
# near (1, ..., 1) off by 1.1e-2, six times the Monte Carlo spread of the consensus itself at
# that N (1.7e-3). Summed in blocks of at most 8192 rows, the blocks' sums then added, it is
# off by 7e-7, and the sum takes 0.6-0.8 of the dot's time (benchmarks/RESULTS_particles.md,
# "The consensus sum over 1e7 agents in float32"). A multiply and a reduction, as accurate,
# take 6-10x the dot's time at d = 10 (XLA fuses exp(-αE) into it and evaluates it d times per
# agent). Several combinations at once (``(K, N)`` weights, K >= 2) are a matrix product,
# whose kernel already sums in blocks: they stay one dot.
_ROWS_SUMMED_IN_BLOCKS = 1 << 16
_BLOCK_ROWS = (256, 8192)  # a block's rows: the largest divisor in this range, else a loop over blocks of 8192
# The agent axis is first split into gcd(N, _GROUPS) groups, so that an axis sharded over D
# devices (D divides N and this number: every D <= 16, and many more) splits along its shards
# and each device sums its own rows; blocks that straddle two devices make XLA gather the rows.
_GROUPS = 720720  # lcm(1, ..., 16)


@functools.lru_cache(maxsize=None)
def _blocks(n: int) -> tuple[int, int | None]:
    """``(g, b)``: ``n`` rows as ``g`` groups of ``n / g``, each summed in blocks of ``b`` rows,
    the largest divisor of ``n / g`` in ``_BLOCK_ROWS`` (``None``: there is none, and ``n / g``
    is larger than a block: a loop over blocks of the largest size and the rows left).
    ``g = gcd(n, _GROUPS)``, or its largest divisor that leaves groups of at least a block's
    least rows (``n = 720720``: 2772 groups of 260 rows, not 720720 of one)."""
    lo, hi = _BLOCK_ROWS
    g = math.gcd(n, _GROUPS)
    if n // g < lo:
        g = max(d for d in range(1, n // lo + 1) if g % d == 0)
    return g, next((b for b in range(min(hi, n // g), lo - 1, -1) if (n // g) % b == 0), None)


def _rows_dot(w: jax.Array, x: jax.Array) -> jax.Array:
    """``Σ_i w[..., i] x[i, ...]`` over the agent axis, in ``x``'s dtype (``w`` and ``x`` of one
    dtype): one dot, except for a single combination of more than ``_ROWS_SUMMED_IN_BLOCKS``
    rows, which is summed in blocks of at most 8192 rows (the same value, rounded less; no copy
    of the rows, and no data moved between devices when the agent axis is sharded, see
    ``_blocks``)."""
    n = x.shape[0]
    if n <= _ROWS_SUMMED_IN_BLOCKS or math.prod(w.shape[:-1]) != 1:
        return jnp.tensordot(w, x, axes=([w.ndim - 1], [0]))
    shape, tail = w.shape[:-1] + x.shape[1:], x.shape[1:]
    g, b = _blocks(n)
    if b is not None:
        q = n // b
        return jnp.einsum("qb,qb...->q...", w.reshape(q, b), x.reshape((q, b) + tail)).sum(0).reshape(shape)
    wg, xg = w.reshape(g, n // g), x.reshape((g, n // g) + tail)
    b = _BLOCK_ROWS[1]
    m = n // g - (n // g) % b

    def block(total, start):
        rows = jax.lax.dynamic_slice_in_dim(xg, start, b, axis=1)
        return total + jnp.einsum("gb,gb...->g...", jax.lax.dynamic_slice_in_dim(wg, start, b, axis=1), rows), None

    total, _ = jax.lax.scan(block, jnp.zeros((g,) + tail, x.dtype), jnp.arange(0, m, b))
    total = total + jnp.einsum("gb,gb...->g...", wg[:, m:], xg[:, m:])
    return total.sum(0).reshape(shape)


def _contract_rows(w: jax.Array, leaf: jax.Array) -> jax.Array:
    # sum_i w[..., i] * leaf[i, ...] over the agent axis (_rows_dot).
    acc = _accumulation_dtype(leaf.dtype)
    if acc != leaf.dtype:  # bfloat16 / float16 rows: weights and sums in float32, one rounding at the end
        return _rows_dot(w.astype(acc), leaf.astype(acc)).astype(leaf.dtype)
    return _rows_dot(w.astype(leaf.dtype), leaf)


def weighted_mean(population: PyTree, weights: jax.Array) -> PyTree:
    """Weighted combination ``sum_i weights[..., i] * x_i`` over the agent axis.

    ``weights`` has shape ``(N,)`` (one combination, result has no agent axis) or
    ``(K, N)`` (K combinations at once, e.g. one consensus point per agent or per
    class; the result carries a leading axis K). Weights are used as given: pass
    normalised weights (see :func:`cbo_jax.consensus.consensus_weights`) for a mean.
    """
    return jax.tree_util.tree_map(lambda leaf: _contract_rows(weights, leaf), population)


def weighted_average(population: PyTree, weights: jax.Array) -> PyTree:
    """``Σ_i w_i x_i / Σ_i w_i`` over the agent axis for weights ``>= 0`` (``(N,)`` or ``(K, N)``).

    All-zero weights give zeros (no division by zero); any positive total, however small, is
    normalised exactly. The weights are normalised in the rows' accumulation dtype or their
    own, whichever is wider: float32 sample counts average float64 rows in float64.
    """
    acc = [_accumulation_dtype(leaf.dtype) for leaf in jax.tree_util.tree_leaves(population)]
    weights = jnp.asarray(weights)
    weights = weights.astype(jnp.result_type(weights.dtype, *acc))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    w = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1), 0)
    return weighted_mean(population, w)


def mean(population: PyTree) -> PyTree:
    """Plain (unweighted) mean over the agent axis."""
    return jax.tree_util.tree_map(lambda leaf: jnp.mean(leaf, axis=0), population)


def gather(population: PyTree, idx: jax.Array) -> PyTree:
    """Rows ``idx`` of every leaf. ``idx`` of shape ``S`` gives leaves ``S + leaf.shape[1:]``."""
    return jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, idx, axis=0), population)


def sq_norms(population: PyTree) -> jax.Array:
    """Per-agent squared Euclidean norm over all leaves: shape ``(N,)``."""
    leaves = jax.tree_util.tree_leaves(population)
    return jnp.asarray(sum(jnp.sum(jnp.reshape(leaf, (leaf.shape[0], -1)) ** 2, axis=1) for leaf in leaves))


def norms(population: PyTree) -> jax.Array:
    """Per-agent Euclidean norm ``|x_i|`` over all leaves (the whole parameter vector)."""
    return jnp.sqrt(sq_norms(population))


def _same_rank(x, like):
    """``x`` with leading unit axes up to ``like``'s rank: explicit broadcasting, so the step runs
    under ``jax_numpy_rank_promotion="raise"`` (the same program)."""
    x = jnp.asarray(x)
    missing = jnp.ndim(like) - x.ndim
    return jnp.reshape(x, (1,) * missing + x.shape) if missing > 0 else x


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
    """Leafwise ``a - b`` with broadcasting (e.g. population minus a consensus point)."""
    return jax.tree_util.tree_map(lambda x, y: jnp.subtract(x, _same_rank(y, x)), a, b)


def tree_add(a: PyTree, b: PyTree) -> PyTree:
    """Leafwise ``a + b``."""
    return jax.tree_util.tree_map(jnp.add, a, b)


def tree_scale_rows(population: PyTree, s: jax.Array) -> PyTree:
    """Multiply row ``i`` of every leaf by the scalar ``s[i]``."""

    def scale(leaf):
        return leaf * jnp.reshape(s, s.shape + (1,) * (leaf.ndim - s.ndim)).astype(leaf.dtype)

    return jax.tree_util.tree_map(scale, population)


def tree_where_rows(mask: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """Row ``i`` from ``new`` where ``mask[i]``, else from ``old`` (stacked pytrees)."""
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(jnp.reshape(mask, mask.shape + (1,) * (a.ndim - 1)), a, b), new, old
    )


def tree_isfinite_rows(population: PyTree) -> jax.Array:
    """Boolean ``(N,)``: agent ``i`` has only finite entries in every leaf."""
    leaves = jax.tree_util.tree_leaves(population)
    out: jax.Array | None = None
    for leaf in leaves:
        ok = jnp.all(jnp.isfinite(jnp.reshape(leaf, (leaf.shape[0], -1))), axis=1)
        out = ok if out is None else out & ok
    return cast(jax.Array, out)  # None only for a population without leaves, which has no agents


def zero_nonfinite_rows(population: PyTree) -> tuple[PyTree, jax.Array]:
    """Zero every agent that holds a NaN or an infinity; return ``(clean, ok)``.

    ``ok`` is the ``(N,)`` mask of agents that were finite. Weighting a zeroed row by
    ``0`` gives ``0`` where ``0 · NaN`` would give NaN.
    """
    ok = tree_isfinite_rows(population)
    clean = jax.tree_util.tree_map(
        lambda leaf: jnp.where(jnp.reshape(ok, ok.shape + (1,) * (leaf.ndim - 1)), leaf, 0), population
    )
    return clean, ok


def slice_rows(tree: PyTree, start, size: int, axis: int = 0) -> PyTree:
    """The ``size`` rows from row ``start`` (along ``axis``) of every leaf; ``start`` may be traced
    (a chunk of a population, :func:`update_rows` writes it back)."""
    return jax.tree_util.tree_map(lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, start, size, axis=axis), tree)


def update_rows(tree: PyTree, rows: PyTree, start, axis: int = 0) -> PyTree:
    """``tree`` with ``rows`` written from row ``start`` (along ``axis``): in place in a loop's carry."""
    return jax.tree_util.tree_map(lambda leaf, r: jax.lax.dynamic_update_slice_in_dim(leaf, r, start, axis=axis),
                                  tree, rows)


def over_blocks(n: int, size: int, body: Callable[[Any, Any, Any, int], Any], carry: Any) -> Any:
    """``body(carry, c, start, rows) -> carry`` over the blocks ``c`` of ``size`` rows of ``0..n-1``:
    a ``fori_loop`` over the full blocks, then the last ``n mod size`` rows as a block of their
    own (a static size: no padding, no row done twice)."""
    full, tail = divmod(n, size)
    if full:
        carry = jax.lax.fori_loop(0, full, lambda c, carry: body(carry, c, c * size, size), carry)
    if tail:
        carry = body(carry, full, full * size, tail)
    return carry


def ravel(population: PyTree) -> tuple[jax.Array, Callable[[jax.Array], PyTree]]:
    """Flatten a population to an ``(N, D)`` matrix.

    Returns the matrix and ``unravel`` mapping an ``(N', D)`` matrix back to a
    population of the same structure with ``N'`` agents.
    """
    n = num_agents(population)
    first = jax.tree_util.tree_map(lambda leaf: leaf[0], population)
    _, unravel_one = ravel_pytree(first)
    flat = jnp.concatenate(
        [jnp.reshape(leaf, (n, -1)) for leaf in jax.tree_util.tree_leaves(population)], axis=1
    )
    return flat, unravel_fn(unravel_one)


def unravel_fn(unravel_one: Callable[[jax.Array], PyTree]) -> Callable[[jax.Array], PyTree]:
    """Lift a single-agent ``unravel`` (from ``ravel_pytree``) to ``(N, D)`` matrices."""
    return jax.vmap(unravel_one)


def pad_agents(population: PyTree, multiple: int) -> tuple[PyTree, jax.Array]:
    """Pad the agent axis with zero rows up to a multiple of ``multiple``.

    Returns the padded population and a boolean ``(N_padded,)`` mask that is
    ``True`` on the real agents (used to keep padding agents inert, e.g. when
    sharding the agent axis over devices).
    """
    multiple = _checks.positive_int("pad_agents: multiple", multiple)
    n = num_agents(population)
    n_pad = (-n) % multiple
    padded = jax.tree_util.tree_map(
        lambda leaf: jnp.concatenate([leaf, jnp.zeros((n_pad,) + leaf.shape[1:], leaf.dtype)]), population
    )
    mask = jnp.arange(n + n_pad) < n
    return padded, mask


def _resize_leaf(leaf, size: int, fill):
    leaf = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    n = leaf.shape[0]
    if size == n:
        return leaf
    if size < n:
        return leaf[:size]
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return leaf[jnp.minimum(jnp.arange(size), n - 1)]  # keys: repeat the last one
    value: bool | float
    if leaf.dtype == jnp.bool_:
        value = False
    elif jnp.issubdtype(leaf.dtype, jnp.inexact):
        value = fill
    else:
        value = 0
    return jnp.concatenate([leaf, jnp.full((size - n,) + leaf.shape[1:], value, leaf.dtype)], axis=0)


def resize_rows(tree: PyTree, size: int, fill: float = 0.0) -> PyTree:
    """Every leaf with its leading (agent) axis extended to ``size`` rows, or cut to them.

    New rows hold ``fill`` (floating leaves), ``False`` (bool) or ``0`` (integer); PRNG
    key leaves repeat their last key. Works inside and outside ``jit``.
    """
    if not _checks.is_integer(size) or size < 0:
        # a negative size would cut rows from the end (leaf[:-1]) instead of failing
        raise ValueError(f"resize_rows: size must be an integer >= 0, got {size!r}")
    size = int(size)
    return jax.tree_util.tree_map(lambda leaf: _resize_leaf(leaf, size, fill), tree)


def per_agent(f: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], jax.Array]:
    """Turn a single-agent objective ``f(params) -> scalar`` into a population one.

    ``per_agent(f)(population)`` returns the ``(N,)`` vector ``f(x_i)``.
    """
    return jax.vmap(f)
