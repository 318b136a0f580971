"""FedAvg (McMahan et al. 2017): one global model, averaged by data size.

Per round: the agents of ``G_n`` start from the global model, train locally (τ
epochs), and the server replaces the global model by the average of their models
weighted by their numbers of samples,

    θ ← Σ_{j ∈ G_n} n_j θ_j / Σ_{j ∈ G_n} n_j.

A trained model holding a NaN or an infinity (diverged local training) gets weight zero,
as in the consensus kernels; a round with no finite model of ``G_n`` keeps the global model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import (AgentData, Algorithm, BaselineConfig, broadcast, participants,
                                               per_agent_fields)
from cbo_jax.federated.local import local_train
from cbo_jax.models import Model

PyTree = Any

__all__ = ["FedAvgConfig", "FedAvgState", "FedAvgInfo", "Averaged", "fedavg", "trained_average", "where_any"]


class FedAvgConfig(BaselineConfig):
    """FedAvg: share of agents per round and local SGD."""


class FedAvgState(NamedTuple):
    params: PyTree  # the global model (no agent axis)
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "train_loss", "diverged")
class FedAvgInfo(NamedTuple):
    active: jax.Array  # (N,) agents in G_n
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    diverged: jax.Array | None = None  # (N,) agents of G_n whose trained model held a NaN or an infinity (weight 0)


class Averaged(NamedTuple):
    """What the server of FedAvg and its variants (FedProx, FedOpt, Ditto's global model) gets
    from one round of local training (:func:`trained_average`)."""

    active: jax.Array  # (N,) agents in G_n
    trained: Any  # the local training's LocalResult (params, opt_state, loss)
    diverged: jax.Array  # (N,) agents of G_n whose trained model holds a NaN or an infinity (weight 0)
    any_ok: jax.Array  # some agent of G_n has a finite trained model
    average: PyTree  # Σ n_j θ_j / Σ n_j over the finite trained models of G_n (zeros with none)


def trained_average(model: Model, cfg: BaselineConfig, params: PyTree, data: AgentData, k_part: jax.Array,
                    k_local: jax.Array, prox_mu: Any = None) -> Averaged:
    """``G_n`` drawn with ``k_part``; every agent trains from the global model ``params`` (with
    ``prox_mu``, FedProx's proximal term towards it) with ``k_local``; the average of the finite
    trained models of ``G_n`` weighted by the agents' numbers of samples."""
    active = participants(k_part, data.agent_mask, cfg.participation)
    start = broadcast(params, data.counts.shape[0])
    prox = None if prox_mu is None else (prox_mu, start)
    trained = local_train(model, cfg.local, start, None, data, k_local, prox=prox)
    clean, finite = pop.zero_nonfinite_rows(trained.params)  # 0 · NaN would be NaN
    weights = jnp.where(active & finite, data.counts, 0).astype(jnp.float32)
    return Averaged(active, trained, active & ~finite, jnp.sum(weights) > 0, pop.weighted_average(clean, weights))


def where_any(ok: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """``new`` where ``ok`` (a scalar), else ``old``: a round with no finite model keeps the old one."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)


def fedavg(model: Model, cfg: FedAvgConfig, num_agents: int) -> Algorithm:
    """FedAvg as a pure ``(init, round)`` pair for ``num_agents`` agents; the state holds
    the one global model."""
    _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        return FedAvgState(model.init(k_model), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedAvgState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        avg = trained_average(model, cfg, state.params, data, k_part, k_local)
        return (FedAvgState(where_any(avg.any_ok, avg.average, state.params), state.round + 1, key),
                FedAvgInfo(avg.active, avg.trained.loss, avg.diverged))

    return Algorithm("fedavg", init, round_fn, lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.params)),
                     cfg, model=model, num_agents=num_agents, build=lambda c: fedavg(model, c, num_agents))
