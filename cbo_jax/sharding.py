"""The agent axis over devices: a one-axis mesh, padding, and sharded placement.

A particle system shards over devices along its agent axis: every per-agent kernel
(objective, noise, Euler–Maruyama update) runs where its rows live, and the only
cross-device step is the consensus reduction ``Σ_i w_i θ_i`` (an all-reduce of a
``(K, d)`` array), which XLA inserts from the shardings. Nothing is hand-written: the
population is placed with a :class:`jax.sharding.NamedSharding` and the jitted scan
propagates it.

``N`` must be a multiple of the device count; otherwise the population is padded
with *inactive* agents whose positions are NaN. The consensus kernels already give
zero weight to agents with non-finite parameters or energies
(:mod:`cbo_jax.consensus`), the best-so-far tracker skips NaN energies, the quantile
mask ignores them, and every per-agent update is row-wise, so padding agents never
influence real ones. With ``rng="per-particle"`` a real agent's noise does not depend
on ``N`` either, so a padded, sharded run equals the unpadded single-device run up to
float rounding (other RNG layouts draw different, equally distributed noise once
padding changes the array shape).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any

__all__ = ["AGENT_AXIS", "agent_mesh", "padded_size", "pad_rows", "agent_sharding", "shard_agents",
           "prepare_population", "shard_leading", "shard_fields", "shard_state"]

AGENT_AXIS = "agents"


def agent_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-dimensional mesh named ``"agents"`` over ``devices`` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("agent_mesh needs at least one device")
    return Mesh(np.asarray(devices), (AGENT_AXIS,))


def padded_size(n: int, mesh: Mesh) -> int:
    """Smallest multiple of the mesh size that is ``>= n``."""
    k = mesh.size
    return -(-n // k) * k


def pad_rows(tree: PyTree, n_total: int, *, axis: int = 0, fill=np.nan) -> PyTree:
    """Pad every leaf along ``axis`` to ``n_total`` rows with ``fill`` (NaN: inactive agents).

    Integer and boolean leaves are padded with ``0`` / ``False`` unless they are ids
    (use :func:`numpy.arange` continuation yourself when ids matter).
    """

    def pad(leaf):
        leaf = np.asarray(leaf)
        extra = n_total - leaf.shape[axis]
        if extra < 0:
            raise ValueError(f"cannot pad {leaf.shape[axis]} rows down to {n_total}")
        if extra == 0:
            return leaf
        shape = list(leaf.shape)
        shape[axis] = extra
        # jnp.issubdtype: NumPy does not count bfloat16 as floating, and padded it with 0 (active agents)
        value = fill if jnp.issubdtype(leaf.dtype, jnp.inexact) else 0
        return np.concatenate([leaf, np.full(shape, value, leaf.dtype)], axis=axis)

    return jax.tree_util.tree_map(pad, tree)


def agent_sharding(mesh: Mesh, ndim: int, axis: int = 0) -> NamedSharding:
    """Shard dimension ``axis`` of an ``ndim``-dimensional array over the mesh; replicate the rest."""
    spec: list[str | None] = [None] * ndim
    spec[axis] = AGENT_AXIS
    return NamedSharding(mesh, PartitionSpec(*spec))


def shard_agents(tree: PyTree, mesh: Mesh, *, axis: int = 0) -> PyTree:
    """Place every leaf with its ``axis`` dimension split over the mesh (must divide evenly)."""

    def put(leaf):
        leaf = jnp.asarray(leaf)
        if leaf.ndim <= axis or leaf.shape[axis] % mesh.size:
            raise ValueError(
                f"a leaf of shape {leaf.shape} cannot be split over {mesh.size} devices along axis {axis}"
            )
        return jax.device_put(leaf, agent_sharding(mesh, leaf.ndim, axis))

    return jax.tree_util.tree_map(put, tree)


def shard_leading(tree: PyTree, mesh: Mesh, n: int) -> PyTree:
    """Split every array leaf whose leading axis has length ``n`` over the mesh; replicate the rest.

    For states that mix per-agent arrays with shared ones (a federated algorithm's
    models and optimiser states next to its round counter and key).
    """
    if n % mesh.size:
        raise ValueError(f"N={n} agents cannot be split evenly over {mesh.size} devices; choose N a multiple of it")
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x):
        if not isinstance(x, (jax.Array, np.ndarray)):
            return x
        if x.ndim >= 1 and x.shape[0] == n:
            return jax.device_put(x, agent_sharding(mesh, x.ndim, 0))
        return jax.device_put(x, replicated)

    return jax.tree_util.tree_map(put, tree)


def shard_fields(tree: PyTree, mesh: Mesh) -> PyTree:
    """Place a federated state or data pytree on ``mesh``.

    A NamedTuple that lists its per-agent fields in ``agent_fields`` (an algorithm's
    state) has those fields split over the devices along their leading axis and the
    rest replicated. Any other pytree (the round's data) has every leaf whose leading
    axis divides evenly over the devices split, and the rest replicated (for example
    the attack experiments' benign group when its size does not divide).
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def split(x):
        return jax.device_put(x, agent_sharding(mesh, x.ndim, 0))

    def maybe(x):
        if not isinstance(x, (jax.Array, np.ndarray)):
            return x
        even = x.ndim >= 1 and x.shape[0] > 0 and x.shape[0] % mesh.size == 0
        return split(x) if even else jax.device_put(x, replicated)

    fields = getattr(type(tree), "agent_fields", None)
    if fields is None:
        return jax.tree_util.tree_map(maybe, tree)
    return tree._replace(**{f: jax.tree_util.tree_map(split if f in fields else
                                                      lambda x: jax.device_put(x, replicated), getattr(tree, f))
                            for f in tree._fields})


def prepare_population(x0: PyTree, mesh: Mesh, *, axis: int = 0, forbid_padding: str | None = None) -> tuple[PyTree, int]:
    """Pad ``x0`` (an array, a stacked pytree or a clustered ``Particles``) to a multiple
    of the mesh size along the agent ``axis`` and shard it. Returns ``(x0, N_real)``.

    ``Particles`` are padded field by field: positions with NaN, labels with ``0``,
    the malicious flag with ``False`` and ids continuing ``N, N+1, ...`` (so every id
    stays unique). ``forbid_padding``: a reason padding is unsafe (raised as a
    ``ValueError`` when padding would be needed).
    """
    from cbo_jax.dynamics.clustered import Particles

    positions = x0.x if isinstance(x0, Particles) else x0
    leaves = jax.tree_util.tree_leaves(positions)
    if not leaves or any(np.ndim(leaf) <= axis for leaf in leaves):  # else IndexError: tuple index out of range
        raise ValueError(f"a population needs an agent axis {axis}: every leaf must have at least {axis + 1} "
                         f"dimension(s), got shapes {[np.shape(leaf) for leaf in leaves]}")
    n = int(np.shape(leaves[0])[axis])
    if any(np.shape(leaf)[axis] != n for leaf in leaves):  # else padded leaf by leaf, rows out of step
        raise ValueError(f"every leaf of a population must hold the same number of agents along axis {axis}, got "
                         f"shapes {[np.shape(leaf) for leaf in leaves]}")
    n_total = padded_size(n, mesh)
    if n_total != n and forbid_padding:
        raise ValueError(f"N={n} is not a multiple of the {mesh.size} devices and padding is unsafe here: "
                         f"{forbid_padding}")
    if isinstance(x0, Particles):
        pid = np.asarray(x0.pid)
        extra = n_total - n
        if extra:
            new_ids = np.broadcast_to(np.arange(n, n_total, dtype=pid.dtype) + max(int(pid.max()) + 1 - n, 0),
                                      pid.shape[:axis] + (extra,))
            pid = np.concatenate([pid, new_ids], axis=axis)
        x0 = Particles(x=pad_rows(x0.x, n_total, axis=axis), label=pad_rows(x0.label, n_total, axis=axis),
                       malicious=pad_rows(x0.malicious, n_total, axis=axis), pid=pid)
    else:
        x0 = pad_rows(x0, n_total, axis=axis)
    return shard_agents(x0, mesh, axis=axis), n


def shard_state(state, mesh, levels: int):
    """``state`` with its agent axis (the first axis from ``levels`` on of the particles' length
    ``N``) split over ``mesh`` and every other leaf replicated: a placement, not a change."""
    x = getattr(state, "x", None)
    leaves = jax.tree_util.tree_leaves(x)
    if not leaves or np.ndim(leaves[0]) <= levels:
        raise ValueError("mesh with initial_state needs a state with particles x (an agent axis to shard)")
    n = int(np.shape(leaves[0])[levels])
    if n % mesh.size:
        raise ValueError(f"initial_state has N={n} agents, not a multiple of the mesh's {mesh.size} devices: continue "
                         "it without mesh, or continue a state of a sharded run (its N includes the padding)")
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(v):
        if not isinstance(v, (jax.Array, np.ndarray)):
            return v
        axis = next((a for a in range(levels, v.ndim) if v.shape[a] == n), None)
        return jax.device_put(v, replicated if axis is None else agent_sharding(mesh, v.ndim, axis))

    return jax.tree_util.tree_map(put, state)
