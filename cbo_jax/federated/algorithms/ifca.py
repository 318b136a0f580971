"""IFCA: the iterative federated clustering algorithm (Ghosh et al. 2020).

The server keeps ``k`` models. Per round, every agent of ``G_n`` estimates its cluster
as the argmin over the ``k`` server models of its local training loss, trains the
chosen model locally (τ epochs), and the server averages, for each cluster estimate,
the models of the agents that chose it (weighted by their numbers of samples). A
server model nobody chose is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import (Algorithm, AgentData, BaselineConfig, RoundInfo, participants,
                                               weighted_rows_mean)
from cbo_jax.federated.local import agent_loss, local_train
from cbo_jax.federated.padding import agents_in, resize_rows
from cbo_jax.models import init_population

PyTree = Any

__all__ = ["IFCAConfig", "ifca"]


@dataclasses.dataclass(frozen=True)
class IFCAConfig(BaselineConfig):
    """``k``: number of server models (the paper uses the true number of clusters)."""

    k: int = 4

    def __post_init__(self):
        super().__post_init__()
        _checks.positive_int("k", self.k)


class IFCAState(NamedTuple):
    params: PyTree  # (k, ...) server models
    round: jax.Array
    key: jax.Array


def ifca(model, cfg: IFCAConfig, num_agents: int) -> Algorithm:
    """IFCA as a pure ``(init, round)`` pair for ``num_agents`` agents.

    Args:
      model: the model every agent trains (:mod:`cbo_jax.models`).
      cfg: the number of server models ``k``, participation share and local SGD
        (:class:`IFCAConfig`).
      num_agents: ``N``.

    Returns an :class:`~cbo_jax.federated.algorithms.base.Algorithm`; its state holds the
    ``k`` server models. Run it with :func:`cbo_jax.federated.run.run_federated`.
    """
    n = _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        return IFCAState(init_population(model, k_model, cfg.k), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: IFCAState, data: AgentData):
        size = agents_in(data, n)  # n, or more with padding agents (sharded runs)
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = resize_rows(participants(k_part, n, cfg.participation), size)  # padding never takes part
        # (N, k) local losses of every server model; cluster estimate = argmin.
        losses = jax.vmap(
            lambda x, y, c: jax.vmap(lambda p: agent_loss(model, p, x, y, c))(state.params)
        )(data.x, data.y, data.counts)
        assignment = jnp.argmin(losses, axis=1).astype(jnp.int32)
        start = pop.gather(state.params, assignment)
        trained = local_train(model, cfg.local, start, None, data.x, data.y, data.counts, k_local, num_real=n)
        member = (assignment[None, :] == jnp.arange(cfg.k)[:, None]) & active[None, :]
        weights = jnp.where(member, data.counts[None, :], 0).astype(jnp.float32)  # (k, N)
        averaged = weighted_rows_mean(trained.params, weights)
        chosen = jnp.any(member, axis=1)
        params = jax.tree_util.tree_map(
            lambda new, old: jnp.where(jnp.reshape(chosen, (cfg.k,) + (1,) * (new.ndim - 1)), new, old), averaged, state.params
        )
        info = RoundInfo(active, jnp.zeros((size, 0), jnp.int32), jnp.zeros((size, 0), bool), jnp.zeros(()), trained.loss,
                         assignment)
        return IFCAState(params, state.round + 1, key), info

    return Algorithm("ifca", init, round_fn, lambda s: ("server", s.params), cfg,
                     lambda state, size: state)  # no agent axis in the state
