"""What every federated algorithm is: a pure ``(init, round)`` pair.

``init(key) -> state`` and ``round(state, data) -> (state, info)`` are pure and
jittable; ``data`` is an :class:`AgentData` (the agents' stacked training sets, never
their cluster ids). ``eval_models(state)`` says which models are tested and how:
``("agent", params)`` -- agent ``j`` is tested with its own model ``params[j]`` on its
cluster's test set (FedCBO, Local); ``("server", params)`` -- the server models, each
test distribution picking the one with the smallest loss (FedAvg, IFCA; as the paper).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.population import tree_where_rows
from cbo_jax.federated.local import LocalSGDConfig

PyTree = Any

__all__ = ["AgentData", "RoundInfo", "Algorithm", "BaselineConfig", "participants", "tree_where_rows",
           "weighted_rows_mean"]


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """What every baseline needs: the share of agents per round and the local SGD."""

    participation: float = 1.0
    local: LocalSGDConfig = LocalSGDConfig()

    def __post_init__(self):
        _checks.fraction("participation", self.participation)


class AgentData(NamedTuple):
    """The agents' training data as the algorithms see it: ``(N, n_max, ...)`` arrays."""

    x: jax.Array
    y: jax.Array
    counts: jax.Array

    @classmethod
    def from_federated(cls, data) -> "AgentData":
        return cls(jnp.asarray(data.x), jnp.asarray(data.y), jnp.asarray(data.counts))


class RoundInfo(NamedTuple):
    """Per-round by-products (fixed shapes, so they stack under ``lax.scan``).

    Attributes:
      active: ``(N,)`` agents in ``G_n``.
      idx: ``(N, M)`` downloaded agents (FedCBO); ``(N, 0)`` when there are none.
      is_random: ``(N, M)`` the downloads picked uniformly at random.
      eps: ε of the round (0 when unused).
      train_loss: ``(N,)`` mean mini-batch loss of the last local epoch.
      assignment: ``(N,)`` IFCA's cluster estimates (zeros otherwise).
    """

    active: jax.Array
    idx: jax.Array
    is_random: jax.Array
    eps: jax.Array
    train_loss: jax.Array
    assignment: jax.Array


class Algorithm(NamedTuple):
    """``resize(state, size)``: the state with its agent axis padded to ``size`` agents
    (inactive padding agents appended, :mod:`cbo_jax.federated.padding`) or cut back to
    the real ones; ``None`` when the algorithm cannot run padded. ``round`` accepts
    data with padding agents after the ``N`` real ones when ``resize`` is given."""

    name: str
    init: Callable[[jax.Array], Any]
    round: Callable[[Any, AgentData], tuple[Any, RoundInfo]]
    eval_models: Callable[[Any], tuple[str, PyTree]]
    config: Any
    resize: Callable[[Any, int], Any] | None = None


def participants(key: jax.Array, n: int, participation: float) -> jax.Array:
    """``(N,)`` mask of ``G_n``: ``max(1, round(participation·N))`` agents at random."""
    size = max(1, int(round(participation * n)))
    if size >= n:
        return jnp.ones((n,), bool)
    order = jnp.argsort(jax.random.uniform(key, (n,)))
    return jnp.zeros((n,), bool).at[order[:size]].set(True)


def weighted_rows_mean(params: PyTree, weights: jax.Array) -> PyTree:
    """``Σ_i w_i θ_i / Σ_i w_i`` over the agent axis (``weights >= 0``, ``(N,)`` or ``(K, N)``)."""
    w = weights / jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), 1e-30)
    return jax.tree_util.tree_map(lambda leaf: jnp.tensordot(w.astype(leaf.dtype), leaf, axes=([w.ndim - 1], [0])), params)
