"""FedAvg (McMahan et al. 2017): one global model, averaged by data size.

Per round: the agents of ``G_n`` start from the global model, train locally (τ
epochs), and the server replaces the global model by the average of their models
weighted by their numbers of samples.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import (Algorithm, AgentData, BaselineConfig, RoundInfo, participants,
                                               weighted_rows_mean)
from cbo_jax.federated.local import local_train
from cbo_jax.federated.padding import agents_in, resize_rows

PyTree = Any

__all__ = ["FedAvgConfig", "fedavg"]


class FedAvgConfig(BaselineConfig):
    """FedAvg: share of agents per round and local SGD."""


class FedAvgState(NamedTuple):
    params: PyTree  # the global model (no agent axis)
    round: jax.Array
    key: jax.Array


def broadcast(params: PyTree, n: int) -> PyTree:
    return jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (n,) + leaf.shape), params)


def fedavg(model, cfg: FedAvgConfig, num_agents: int) -> Algorithm:
    """FedAvg as a pure ``(init, round)`` pair for ``num_agents`` agents.

    Args:
      model: the model every agent trains (:mod:`cbo_jax.models`).
      cfg: participation share and local SGD (:class:`FedAvgConfig`).
      num_agents: ``N``.

    Returns an :class:`~cbo_jax.federated.algorithms.base.Algorithm`; its state holds the
    one global model. Run it with :func:`cbo_jax.federated.run.run_federated`.
    """
    n = _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        return FedAvgState(model.init(k_model), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedAvgState, data: AgentData):
        size = agents_in(data, n)  # n, or more with padding agents (sharded runs)
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = resize_rows(participants(k_part, n, cfg.participation), size)  # padding never takes part
        trained = local_train(model, cfg.local, broadcast(state.params, size), None, data.x, data.y, data.counts, k_local,
                              num_real=n)
        weights = jnp.where(active, data.counts, 0).astype(jnp.float32)
        params = weighted_rows_mean(trained.params, weights)
        info = RoundInfo(active, jnp.zeros((size, 0), jnp.int32), jnp.zeros((size, 0), bool), jnp.zeros(()),
                         trained.loss, jnp.zeros((size,), jnp.int32))
        return FedAvgState(params, state.round + 1, key), info

    def eval_models(state):
        return "server", jax.tree_util.tree_map(lambda leaf: leaf[None], state.params)

    return Algorithm("fedavg", init, round_fn, eval_models, cfg, lambda state, size: state)  # no agent axis
