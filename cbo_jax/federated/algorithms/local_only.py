"""Local training: every agent trains alone on its own data; no communication."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import (Algorithm, AgentData, BaselineConfig, RoundInfo, participants,
                                               tree_where_rows)
from cbo_jax.federated.local import local_train, make_optimizer
from cbo_jax.federated.padding import agents_in, resize_rows
from cbo_jax.models import init_population

PyTree = Any

__all__ = ["LocalConfig", "local_only"]


class LocalConfig(BaselineConfig):
    """Local training: share of agents per round and local SGD."""


class LocalState(NamedTuple):
    params: PyTree
    opt_state: PyTree
    round: jax.Array
    key: jax.Array


def local_only(model, cfg: LocalConfig, num_agents: int) -> Algorithm:
    """Local training only, as a pure ``(init, round)`` pair for ``num_agents`` agents.

    Args:
      model: the model every agent trains (:mod:`cbo_jax.models`).
      cfg: participation share and local SGD (:class:`LocalConfig`).
      num_agents: ``N``.

    Returns an :class:`~cbo_jax.federated.algorithms.base.Algorithm` whose state holds
    one model per agent; agents never communicate.
    """
    n = _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return LocalState(params, jax.vmap(make_optimizer(cfg.local).init)(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: LocalState, data: AgentData):
        size = agents_in(data, n)  # n, or more with padding agents (sharded runs)
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = resize_rows(participants(k_part, n, cfg.participation), size)  # padding never takes part
        trained = local_train(model, cfg.local, state.params, state.opt_state, data.x, data.y, data.counts, k_local,
                              num_real=n)
        params = tree_where_rows(active, trained.params, state.params)
        opt_state = tree_where_rows(active, trained.opt_state, state.opt_state)
        info = RoundInfo(active, jnp.zeros((size, 0), jnp.int32), jnp.zeros((size, 0), bool), jnp.zeros(()),
                         trained.loss, jnp.zeros((size,), jnp.int32))
        return LocalState(params, opt_state, state.round + 1, key), info

    def resize(state: LocalState, size: int) -> LocalState:
        return state._replace(params=resize_rows(state.params, size), opt_state=resize_rows(state.opt_state, size))

    return Algorithm("local", init, round_fn, lambda s: ("agent", s.params), cfg, resize)
