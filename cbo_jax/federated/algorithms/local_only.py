"""Local training: every agent trains alone on its own data; no communication."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import (AgentData, Algorithm, BaselineConfig, diverged, participants,
                                               per_agent_fields, tree_where_rows)
from cbo_jax.federated.local import local_train, make_optimizer
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["LocalConfig", "LocalState", "LocalInfo", "local_only"]


class LocalConfig(BaselineConfig):
    """Local training: share of agents per round and local SGD."""


@per_agent_fields("params", "opt_state")
class LocalState(NamedTuple):
    params: PyTree  # (N, ...)
    opt_state: PyTree  # (N, ...)
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "train_loss", "diverged")
class LocalInfo(NamedTuple):
    active: jax.Array  # (N,)
    train_loss: jax.Array  # (N,)
    diverged: jax.Array | None = None  # (N,) real agents whose model holds a NaN or an infinity


def local_only(model: Model, cfg: LocalConfig, num_agents: int) -> Algorithm:
    """Local training only, as a pure ``(init, round)`` pair for ``num_agents`` agents."""
    n = _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return LocalState(params, jax.vmap(make_optimizer(cfg.local).init)(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: LocalState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = participants(k_part, data.agent_mask, cfg.participation)
        trained = local_train(model, cfg.local, state.params, state.opt_state, data, k_local)
        params = tree_where_rows(active, trained.params, state.params)
        opt_state = tree_where_rows(active, trained.opt_state, state.opt_state)
        info = LocalInfo(active, trained.loss, diverged(params, data.agent_mask))
        return LocalState(params, opt_state, state.round + 1, key), info

    return Algorithm("local", init, round_fn, lambda s: ("agent", s.params), cfg, model=model,
                     build=lambda c: local_only(model, c, num_agents))
