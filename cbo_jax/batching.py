"""The random batch method: the consensus of each step from a random mini-batch of particles.

Jin, Li and Liu (*Random batch methods for interacting particle systems*, 2020) replace
an interaction over all ``N`` particles by one over a random batch; Carrillo, Jin, Li
and Zhu (*A consensus-based global optimization method for high dimensional machine
learning problems*, 2021) use it for CBO. Here, as with CBXpy's ``batch_args``, one batch
of ``batch_size`` particles is drawn per step, and the consensus point (FedCBO eq. (4):
``m_α = Σ θ_i e^{-α L(θ_i)} / Σ e^{-α L(θ_i)}``) runs over that batch only. Then either
every particle moves toward it (``batch_partial=False``, "full" update) or only the
batch's particles do (``batch_partial=True``, "partial" update, CBXpy's default).

Batches walk through a random permutation of the particles (an epoch), ``batch_size``
at a time, and a new permutation is drawn once fewer than ``batch_size`` unused
particles remain (the rest are skipped, as in CBXpy). The permutation's key is
``fold_in(step_key, BATCH_STREAM)``, apart from the noise keys, so the particles' noise
is the same with and without batches.

The batch is a boolean mask over all ``N`` particles and the consensus a masked
reduction, so ``batch_size = N`` gives exactly the full system (the masked and unmasked
sums add the same numbers in the same order). The cost per step stays ``O(N)``: the
method changes the dynamics (mini-batch consensus noise), not the kernel's size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks

__all__ = ["BatchState", "BATCH_STREAM", "init", "next_batch"]

BATCH_STREAM = 0x62617463  # "batc": the fold_in constant of the batch permutation's key


class BatchState(NamedTuple):
    """Where a run stands in its current epoch.

    Attributes:
      perm: ``(N,)`` int32, the current epoch's permutation of the particles.
      pos: int32, the position in ``perm`` of the next batch (``N`` at the start:
        the first step draws a permutation).
    """

    perm: jax.Array
    pos: jax.Array


def init(n: int) -> BatchState:
    """The state before the first step (no permutation drawn yet)."""
    return BatchState(perm=jnp.arange(n, dtype=jnp.int32), pos=jnp.asarray(n, jnp.int32))


def next_batch(state: BatchState, step_key: jax.Array, batch_size: int) -> tuple[jax.Array, BatchState]:
    """``(mask, state)``: the ``(N,)`` boolean mask of this step's batch and the advanced state.

    ``step_key`` is the step's PRNG key (the state's key before it is split for noise).
    """
    n = state.perm.shape[0]
    if not _checks.is_integer(batch_size):
        raise ValueError(f"batch_size must be an integer, got {batch_size!r}")
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must lie in [1, N={n}], got {batch_size}")
    fresh = state.pos + batch_size > n
    key = jax.random.fold_in(step_key, BATCH_STREAM)
    perm = jax.lax.cond(fresh, lambda: jax.random.permutation(key, n).astype(jnp.int32), lambda: state.perm)
    pos = jnp.where(fresh, 0, state.pos)
    idx = jax.lax.dynamic_slice(perm, (pos,), (batch_size,))
    mask = jnp.zeros((n,), bool).at[idx].set(True)
    return mask, BatchState(perm=perm, pos=pos + batch_size)
