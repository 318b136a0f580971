"""Fetch selected agents' models across devices without copying the whole population.

On a sharded run each device holds ``n_loc = N / D`` agents. In FedCBO, agent ``j``
downloads ``M`` models ``θ_{idx[j, :]}`` that may live on any device. Gathering them
with an index into the sharded population lets XLA copy all ``N`` models to every
device. :func:`fetch_rows` instead moves only the requested rows, with two
``all_to_all`` collectives per exchange round:

1. every device sends each owner the list of rows it wants from it (``(D, B)``
   local row numbers, ``-1`` for an empty slot);
2. every owner gathers those rows and sends them back (``(D, B, ...)``).

The buffers have a fixed capacity of ``B`` rows per (requester, owner) pair, so shapes
stay static. Requests beyond ``B`` to one owner go in later rounds, and the round
count is the same on every device (a ``pmax``). With requests spread over the
owners, one round with ``B ≈ 2 R / D`` suffices. Skewed requests, such as every
agent of a cluster downloading from the two devices that hold that cluster, take a
few more rounds, not more memory. Memory per device: ``2 D B`` rows of buffers plus
the ``R`` fetched rows, where ``R`` is the number of requests. A full all-gather
would take ``N`` rows.

:func:`fetch_rows` must be called inside :func:`jax.shard_map` over the agent axis.
:func:`exchange_downloads` wraps it as a download map for
:func:`cbo_jax.federated.aggregation.consensus_downloads`: FedCBO built with
``fedcbo(..., downloads=exchange_downloads(mesh))`` never gathers the population.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from cbo_jax import _checks

PyTree = Any

__all__ = ["fetch_rows", "default_capacity", "exchange_downloads"]


def default_capacity(num_requests: int, num_devices: int, slack: float = 2.0) -> int:
    """Rows per (requester, owner) buffer: ``slack`` times the even share, at least 1."""
    return max(1, min(num_requests, int(-(-slack * num_requests // num_devices))))


def fetch_rows(local: PyTree, idx: jax.Array, *, axis_name: str, num_devices: int, capacity: int) -> PyTree:
    """Rows ``idx`` (global agent indices) of the agent-sharded population ``local``.

    Args:
      local: this device's shard, every leaf ``(n_loc, ...)``; agent ``g`` lives on
        device ``g // n_loc`` at row ``g % n_loc``.
      idx: integer array of global indices (any shape ``S``), in ``[0, N)``.
      axis_name: the mesh axis the agents are sharded over.
      num_devices: its size ``D``.
      capacity: ``B``, rows per (requester, owner) pair per exchange round.

    Returns a pytree with leaves ``S + leaf.shape[1:]``: exactly ``global[idx]``.
    """
    _checks.positive_int("capacity", capacity)
    _checks.positive_int("num_devices", num_devices)
    leaves = jax.tree_util.tree_leaves(local)
    n_loc = leaves[0].shape[0]
    shape = idx.shape
    flat = idx.reshape(-1).astype(jnp.int32)
    owner = flat // n_loc
    row = flat % n_loc
    onehot = owner[:, None] == jnp.arange(num_devices, dtype=jnp.int32)[None, :]  # (R, D)
    rank = jnp.take_along_axis(jnp.cumsum(onehot, axis=0), owner[:, None], axis=1)[:, 0] - 1  # per-owner order
    rounds = jax.lax.pmax(jnp.max(rank) // capacity + 1, axis_name)

    def one_round(k, out):
        slot = rank - k * capacity
        active = (slot >= 0) & (slot < capacity)
        send = jnp.full((num_devices, capacity), -1, jnp.int32)
        send = send.at[jnp.where(active, owner, num_devices), jnp.clip(slot, 0, capacity - 1)].set(row, mode="drop")
        wanted = jax.lax.all_to_all(send, axis_name, 0, 0)  # [s, b]: row device s wants from me
        ok = wanted >= 0

        def serve(leaf):
            rows = jnp.take(leaf, jnp.clip(wanted, 0, n_loc - 1), axis=0)  # (D, B, ...)
            return jnp.where(ok.reshape(ok.shape + (1,) * (leaf.ndim - 1)), rows, jnp.zeros((), leaf.dtype))

        reply = jax.tree_util.tree_map(serve, local)
        back = jax.tree_util.tree_map(lambda r: jax.lax.all_to_all(r, axis_name, 0, 0), reply)

        def place(acc, got):
            picked = got[owner, jnp.clip(slot, 0, capacity - 1)]  # (R, ...)
            return jnp.where(active.reshape(active.shape + (1,) * (acc.ndim - 1)), picked, acc)

        return jax.tree_util.tree_map(place, out, back)

    out0 = jax.tree_util.tree_map(lambda leaf: jnp.zeros((flat.shape[0],) + leaf.shape[1:], leaf.dtype), local)
    out = jax.lax.fori_loop(0, rounds, one_round, out0)
    return jax.tree_util.tree_map(lambda leaf: leaf.reshape(shape + leaf.shape[1:]), out)


def _largest_divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, min(n, k) + 1) if n % d == 0)


def exchange_downloads(mesh, capacity: int | None = None):
    """A download map (:mod:`cbo_jax.federated.aggregation`) over the agent-sharded ``mesh``.

    Each device evaluates the downloads of its own agents (the rows of ``idx`` it
    holds; the number of rows must be a multiple of the device count, which the
    runner's padding guarantees). The downloaded models are fetched with
    :func:`fetch_rows`, ``chunk`` agents at a time, in buffers of ``capacity`` rows per
    device pair (default: twice the even share): no device ever holds more than its
    own shard plus one chunk's downloads. Same results as the local gather.
    ``capacity``: ``None`` (the default) or an integer >= 1.
    """
    from jax.sharding import PartitionSpec

    from cbo_jax import population as pop
    from cbo_jax.sharding import AGENT_AXIS

    if capacity is not None:
        _checks.positive_int("capacity", capacity)

    d = mesh.size
    spec = PartitionSpec(AGENT_AXIS)

    def downloads(fn, params, idx, per_agent, chunk):
        n, m = idx.shape
        if n % d:
            raise ValueError(f"{n} agents cannot be split evenly over {d} devices")
        n_loc = n // d
        c = _largest_divisor_at_most(n_loc, chunk)
        cap = capacity or default_capacity(c * m, d)

        def local(params_l, idx_l, *per_l):
            table = pop.zero_nonfinite_rows(params_l)  # (clean rows, finite flags), once per round

            def one_chunk(args):
                idx_c, *rest = args
                clean, finite = fetch_rows(table, idx_c, axis_name=AGENT_AXIS, num_devices=d, capacity=cap)
                return jax.vmap(fn)(clean, finite, *rest)

            split = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((n_loc // c, c) + a.shape[1:]), t)  # noqa: E731
            out = jax.lax.map(one_chunk, split((idx_l, *per_l)))
            return jax.tree_util.tree_map(lambda a: a.reshape((n_loc,) + a.shape[2:]), out)

        return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * (2 + len(per_agent)), out_specs=spec,
                             check_vma=False)(params, idx, *per_agent)

    return downloads
