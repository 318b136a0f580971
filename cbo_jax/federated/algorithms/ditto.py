"""Ditto (Li, Hu, Beirami and Smith, "Ditto: fair and robust federated learning through
personalization", ICML 2021, Algorithm 1): a global model trained by FedAvg and, on every agent,
a personal model ``v_j`` trained on its own data with a proximal pull towards the global model,

    min_v  F_j(v) + (λ / 2) ‖v - w‖²,

by the same τ epochs of local SGD (:func:`~cbo_jax.federated.local.local_train` with ``prox``),
starting from the agent's previous personal model. Agents are measured on their personal
models. λ = 0 is local training beside FedAvg; a large λ pins the personal models to the global
one. Non-finite trained models get weight zero in the global average.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, BaselineConfig, broadcast, per_agent_fields
from cbo_jax.federated.algorithms.fedavg import trained_average, where_any
from cbo_jax.federated.local import local_train
from cbo_jax.models import Model

PyTree = Any

__all__ = ["DittoConfig", "DittoState", "DittoInfo", "ditto"]


@dataclasses.dataclass(frozen=True)
class DittoConfig(BaselineConfig):
    """Ditto: FedAvg's share of agents and local SGD (both models), and the personal pull λ.

    Attributes:
      lam: the weight λ of the personal models' proximal term (Li et al. tune it in
        {0.01, 0.1, 1, 2}).
    """

    lam: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        _checks.non_negative("lam", self.lam, f32=True)


@per_agent_fields("personal")
class DittoState(NamedTuple):
    params: PyTree  # the global model w (no agent axis)
    personal: PyTree  # (N, ...) the personal models v_j
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "train_loss", "personal_loss", "diverged")
class DittoInfo(NamedTuple):
    active: jax.Array  # (N,) agents in G_n
    train_loss: jax.Array  # (N,) global model's local training loss (last epoch)
    personal_loss: jax.Array  # (N,) personal model's local training loss (last epoch)
    diverged: jax.Array | None = None  # (N,) agents of G_n whose trained global model held a NaN or an infinity


def ditto(model: Model, cfg: DittoConfig, num_agents: int) -> Algorithm:
    """Ditto as a pure ``(init, round)`` pair; ``eval_models`` gives the personal models."""
    _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)  # the personal models start at the global one
        params = model.init(k_model)
        return DittoState(params, broadcast(params, num_agents), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: DittoState, data: AgentData):
        key, k_part, k_local, k_pers = jax.random.split(state.key, 4)
        n = data.counts.shape[0]
        avg = trained_average(model, cfg, state.params, data, k_part, k_local)  # the global model: FedAvg's
        personal = local_train(model, cfg.local, state.personal, None, data, k_pers,
                               prox=(cfg.lam, broadcast(state.params, n)))
        keep_personal = jax.tree_util.tree_map(  # agents outside G_n keep their personal models
            lambda new, old: jnp.where(avg.active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), personal.params,
            state.personal)
        return (DittoState(where_any(avg.any_ok, avg.average, state.params), keep_personal, state.round + 1, key),
                DittoInfo(avg.active, avg.trained.loss, personal.loss, avg.diverged))

    return Algorithm("ditto", init, round_fn, lambda s: ("agent", s.personal), cfg, model=model, num_agents=num_agents,
                     build=lambda c: ditto(model, c, num_agents))
