"""Inactive padding agents: federated runs with any ``N`` on a device mesh.

A sharded run splits the agent axis evenly over the devices, so it runs
``S = padded_size(N, mesh)`` agents: the ``N`` real ones first, then ``S - N`` *padding*
agents. This module is the runner's side of it; no algorithm imports it.

* the data pads itself (``data.pad(S)``): a padding agent holds no samples and is
  marked invalid (``AgentData.valid`` False), so it is never in ``G_n``, never averaged
  and its local training leaves it untouched;
* the state is padded field by field: the fields a state NamedTuple lists in
  ``agent_fields`` get ``S - N`` zero rows (:meth:`Layout.pad_state`); everything else
  (server models, a likelihood matrix's candidate columns, counters) is unchanged, so
  only the ``N`` real agents can ever be downloaded;
* the round's info is cut back to the real agents inside the jitted round
  (:meth:`Layout.trim_info`), and so is the state before anything reaches the user
  (metrics, evaluation, checkpoints, the returned state).

The algorithms draw agent ``j``'s random numbers on row ``j`` (keys ``fold_in(key, j)``,
leading-axis draws with JAX's partitionable threefry), so a real agent sees the numbers
of the unpadded run and a padded run equals it up to float rounding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from cbo_jax.federated.algorithms.base import agent_fields
from cbo_jax.population import resize_rows

PyTree = Any

__all__ = ["Layout", "layout", "resize_fields"]


def resize_fields(tree: Any, size: int) -> Any:
    """``tree`` (a state or info NamedTuple) with its ``agent_fields`` resized to ``size`` rows."""
    fields = agent_fields(tree)
    if not fields:
        return tree
    return tree._replace(**{f: resize_rows(getattr(tree, f), size) for f in fields})


class Layout(NamedTuple):
    """How a run of ``n`` real agents is laid out: ``size`` agents in the state and data."""

    n: int
    size: int

    @property
    def padded(self) -> bool:
        return self.size != self.n

    def pad_state(self, state):
        return resize_fields(state, self.size) if self.padded else state

    def unpad_state(self, state):
        return resize_fields(state, self.n) if self.padded else state

    def pad_data(self, data):
        return data.pad(self.size) if self.padded else data

    def trim_info(self, info):
        return resize_fields(info, self.n) if self.padded else info


def layout(n: int, mesh=None) -> Layout:
    """The layout of ``n`` agents on ``mesh`` (no mesh: no padding)."""
    if mesh is None:
        return Layout(n, n)
    from cbo_jax.sharding import padded_size

    return Layout(n, padded_size(n, mesh))


def check_agents(algorithm, state_shapes, n: int) -> None:
    """Raise a clear ``ValueError`` when ``algorithm``'s state does not hold ``n`` agents (or,
    without an agent axis, its ``num_agents`` is another number)."""
    built = getattr(algorithm, "num_agents", None)
    if built is not None and built != n:
        raise ValueError(f"{algorithm.name} was built for {built} agents (num_agents) but the data holds {n}")
    for f in agent_fields(state_shapes):
        for leaf in jax.tree_util.tree_leaves(getattr(state_shapes, f)):
            if leaf.shape[:1] != (n,):
                raise ValueError(f"{algorithm.name} was built for {leaf.shape[0] if leaf.shape else 0} agents "
                                 f"(state field {f!r}) but the data holds {n}")
