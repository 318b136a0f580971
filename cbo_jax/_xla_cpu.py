"""XLA:CPU workarounds: how the noise draws are laid out and where their kernels end.

Not mathematics: the same numbers, drawn in an order and split into kernels that XLA:CPU
runs faster (measured in benchmarks/RESULTS.md and RESULTS_cbx.md). On other backends
:func:`written_out` is the identity.

* :func:`normal_agent_axis_last` draws an ``(N, ...)`` block of normals with the agent axis
  last and moves it to the front: the same distribution; XLA:CPU otherwise fuses the normal
  transform into the row-broadcast update, where it runs 1.9x slower (a full CBO step).
* :func:`computed_together` makes every leaf of a tree computed before any is used (the
  blocked step's in-place writes).
* :func:`written_out` computes an array in a kernel of its own (a conditional whose predicate
  is always true but not a compile-time constant: a boundary XLA keeps, where it drops
  ``optimization_barrier`` on the CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import custom_batching

__all__ = ["written_out", "computed_together", "normal_agent_axis_last"]

_WRITE_OUT_ON_CPU = True  # read at trace time; benchmarks and tests switch it off to compare


@custom_batching.custom_vmap
def _kernel_boundary(bits: jax.Array, z):
    first = jnp.ravel(bits)[0]
    zeros = lambda t: jax.tree_util.tree_map(jnp.zeros_like, t)  # noqa: E731
    return jax.lax.cond((first | jnp.ones_like(first)) != 0, lambda a: a, zeros, z)


@_kernel_boundary.def_vmap
def _kernel_boundary_vmap(axis_size, in_batched, bits, z):
    # One predicate for the whole batch (from its first key), so the conditional stays a
    # conditional instead of becoming a select that XLA fuses away.
    z = jax.tree_util.tree_map(lambda leaf, b: leaf if b else jnp.broadcast_to(leaf, (axis_size,) + leaf.shape),
                               z, in_batched[1])
    return _kernel_boundary(bits, z), jax.tree_util.tree_map(lambda _: True, z)


@jax.custom_jvp
def _differentiable_boundary(bits: jax.Array, z: jax.Array) -> jax.Array:
    return _kernel_boundary(bits, z)


@_differentiable_boundary.defjvp
def _differentiable_boundary_jvp(primals, tangents):
    # The identity, so its derivative is the identity (custom_vmap alone has no JVP rule).
    bits, z = primals
    return _differentiable_boundary(bits, z), tangents[1]


def written_out(z: jax.Array, key: jax.Array) -> jax.Array:
    """``z``, computed in a kernel of its own on XLA:CPU (elsewhere: ``z`` unchanged).

    ``key`` is any PRNG key (or raw key data) of the step: only its bits are read. For
    example, XLA:CPU fuses the normal transform (``erf_inv`` of the threefry bits) into the
    kernel that reads the draw with the agent axis moved to the front, where it runs about
    1.5x slower than over the contiguous ``(d, N)`` array (benchmarks/RESULTS_cbx.md). Its
    predicate, ``key_bits | 1 != 0``, stays one predicate under ``vmap`` (runs, sweeps). Not
    used on GPUs, where a conditional waits on its predicate.
    """
    if not _WRITE_OUT_ON_CPU or jax.default_backend() != "cpu":
        return z
    bits = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return _differentiable_boundary(bits, z)


def computed_together(tree, key: jax.Array):
    """``tree``, every leaf computed before any is used: one boundary that each output depends
    on, on every backend (on XLA:CPU a conditional as in :func:`written_out`, which keeps its
    operands apart from its users' kernels; elsewhere ``optimization_barrier``).

    A blocked step writes each buffer's new rows back in place. XLA may recompute one buffer's
    new rows inside another's update kernel (fusion duplicates producers), reading old rows of a
    third buffer after that one is overwritten; it then copies the third buffer whole.
    Routing every new row through one boundary orders all reads of the old rows before every
    write.
    """
    if jax.default_backend() != "cpu":
        return jax.lax.optimization_barrier(tree)
    bits = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return _differentiable_boundary(bits, tree)


def normal_agent_axis_last(key: jax.Array, shape, dtype) -> jax.Array:
    """Standard normals of ``shape`` (agent axis first), drawn with the agent axis last and
    written out (:func:`written_out`) before the axis moves to the front."""
    if len(shape) < 2:
        return jax.random.normal(key, shape, dtype)
    z = written_out(jax.random.normal(key, tuple(shape[1:]) + (shape[0],), dtype), key)
    return jnp.moveaxis(z, -1, 0)
