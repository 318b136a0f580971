"""Inactive padding agents: federated runs with any ``N`` on a device mesh.

A sharded run (``run_federated(..., mesh=mesh)``) splits the agent axis evenly over
the devices, so it runs ``S = padded_size(N, mesh)`` agents: the ``N`` real ones
first, then ``S - N`` *padding* agents. A padding agent holds no data (count 0, so
local training leaves it untouched and its losses are 0), never takes part in a
round (it is outside ``G_n``), and is never downloaded: FedCBO selects among the
first ``N`` columns of its likelihood matrix only, and averages (FedAvg, IFCA)
weight agents by participation. :func:`cbo_jax.federated.run.run_federated` drops
the padding again before anything reaches the user (metrics, evaluation,
checkpoints, the returned state).

Random numbers are drawn for the ``N`` real agents and then padded, never drawn at
the padded shape: the real agents see exactly the numbers of the unsharded run
(:func:`agent_keys`), so a padded run equals it up to float rounding.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

__all__ = ["resize_rows", "pad_agent_data", "agent_keys", "padding_downloads", "agents_in", "pad_attack_data",
           "PaddedRun", "padded_run"]


def _resize(leaf, size: int, fill):
    leaf = jnp.asarray(leaf) if not isinstance(leaf, jax.Array) else leaf
    n = leaf.shape[0]
    if size == n:
        return leaf
    if size < n:
        return leaf[:size]
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return leaf[jnp.minimum(jnp.arange(size), n - 1)]  # keys: repeat the last one
    if leaf.dtype == jnp.bool_:
        value = False
    elif jnp.issubdtype(leaf.dtype, jnp.floating) or jnp.issubdtype(leaf.dtype, jnp.complexfloating):
        value = fill
    else:
        value = 0
    return jnp.concatenate([leaf, jnp.full((size - n,) + leaf.shape[1:], value, leaf.dtype)], axis=0)


def resize_rows(tree: PyTree, size: int, fill: float = 0.0) -> PyTree:
    """Every leaf with its leading (agent) axis padded to ``size`` rows, or cut to them.

    New rows hold ``fill`` (float leaves), ``False`` (bool) or ``0`` (integer); PRNG
    key leaves repeat their last key. Works inside and outside ``jit``.
    """
    return jax.tree_util.tree_map(lambda leaf: _resize(leaf, size, fill), tree)


def pad_agent_data(data, size: int):
    """An :class:`~cbo_jax.federated.algorithms.base.AgentData` with ``size - N``
    padding agents appended: no samples (count 0), inputs and labels 0."""
    return resize_rows(data, size, fill=0.0)


def agent_keys(key: jax.Array, num_real: int, size: int) -> jax.Array:
    """``(size,)`` per-agent keys: ``jax.random.split(key, num_real)`` for the real agents
    (independent of ``size``), the last of them repeated for the padding agents."""
    return _resize(jax.random.split(key, num_real), size, None)


def padding_downloads(num_real: int, size: int, m: int) -> jax.Array:
    """``(size - num_real, m)`` download indices of the padding agents (whose results
    are discarded): distinct real agents, spread evenly so that they cost every device
    the same in FedCBO's exchange."""
    rows = jnp.arange(size - num_real, dtype=jnp.int32)[:, None]
    return ((rows * m + jnp.arange(m, dtype=jnp.int32)[None, :]) % num_real).astype(jnp.int32)


def agents_in(data, num_real: int) -> int:
    """Agents in ``data`` (``AgentData``): ``num_real``, or more with padding agents."""
    size = int(data.counts.shape[0])
    if size < num_real:
        raise ValueError(f"the data holds {size} agents but the algorithm was built for {num_real}")
    return size


def pad_attack_data(data, size: int, num_real: int):
    """The attack experiments' data (:func:`cbo_jax.federated.attack_run.run_attack`)
    with ``size - num_real`` padding agents appended to its last training group.

    ``data`` is an :class:`~cbo_jax.federated.attacks.AttackData` (benign training
    splits, their validation splits, the attackers; the agents are benign first, then
    the attackers, so the padding goes after the attackers, or after the benign agents
    when there are none; the validation splits belong to the benign agents and stay
    as they are) or a tuple of ``AgentData`` groups of consecutive agents (DFedAvgM:
    the padding goes into the last group). Padding agents have no samples (count 0).
    """
    extra = size - num_real
    if extra < 0:
        raise ValueError(f"cannot pad {num_real} agents down to {size}")
    if extra == 0:
        return data
    fields = getattr(data, "_fields", ())
    if "malicious" in fields and "benign" in fields:
        group = "malicious" if data.malicious.counts.shape[0] > 0 else "benign"
        g = getattr(data, group)
        return data._replace(**{group: resize_rows(g, g.counts.shape[0] + extra)})
    groups = tuple(data)
    last = groups[-1]
    return groups[:-1] + (resize_rows(last, last.counts.shape[0] + extra),)


class PaddedRun(NamedTuple):
    """How a run of ``n`` real agents is laid out on a mesh (see :func:`padded_run`).

    Attributes:
      n: real agents.
      size: agents in the run's state and data (``n`` without a mesh or padding).
      to_padded: state of ``n`` agents -> state of ``size`` agents.
      to_user: state of ``size`` agents -> state of the ``n`` real agents (what is
        evaluated, checkpointed and returned).
    """

    n: int
    size: int
    to_padded: Callable
    to_user: Callable


def padded_run(algorithm, n: int, mesh=None) -> PaddedRun:
    """The padding of a federated run of ``algorithm`` with ``n`` agents on ``mesh``.

    Raises ``ValueError`` when padding is needed and ``algorithm`` has no ``resize``.
    """
    from cbo_jax.sharding import padded_size

    size = n if mesh is None else padded_size(n, mesh)
    if size == n:
        return PaddedRun(n, size, lambda s: s, lambda s: s)
    if algorithm.resize is None:
        raise ValueError(f"{algorithm.name} cannot run with padding agents: choose N (now {n}) a multiple of the "
                         f"{mesh.size} devices")
    pad = jax.jit(algorithm.resize, static_argnums=1)
    return PaddedRun(n, size, lambda s: pad(s, size), lambda s: algorithm.resize(s, n))
