"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated optimization in
heterogeneous networks", MLSys 2020): FedAvg whose agents minimise their local loss plus a
proximal term that keeps them near the global model ``x`` they started from,

    min_θ  F_j(θ) + (μ / 2) ‖θ - x‖²,

by the same τ epochs of local SGD (:func:`~cbo_jax.federated.local.local_train` with ``prox``);
the server then averages the agents of ``G_n`` by their numbers of samples, as FedAvg. ``μ = 0``
is FedAvg. A trained model holding a NaN or an infinity gets weight zero; a round with no finite
model keeps the global model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, BaselineConfig
from cbo_jax.federated.algorithms.fedavg import FedAvgInfo, FedAvgState, trained_average, where_any
from cbo_jax.models import Model

PyTree = Any

__all__ = ["FedProxConfig", "fedprox"]


@dataclasses.dataclass(frozen=True)
class FedProxConfig(BaselineConfig):
    """FedProx: FedAvg's share of agents and local SGD, and the proximal weight.

    Attributes:
      mu: the proximal term's weight μ (Li et al. tune it in {0.001, 0.01, 0.1, 1}).
    """

    mu: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        _checks.non_negative("mu", self.mu, f32=True)


def fedprox(model: Model, cfg: FedProxConfig, num_agents: int) -> Algorithm:
    """FedProx as a pure ``(init, round)`` pair (the state and info of FedAvg)."""
    _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        return FedAvgState(model.init(k_model), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedAvgState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        avg = trained_average(model, cfg, state.params, data, k_part, k_local, prox_mu=cfg.mu)
        return (FedAvgState(where_any(avg.any_ok, avg.average, state.params), state.round + 1, key),
                FedAvgInfo(avg.active, avg.trained.loss, avg.diverged))

    return Algorithm("fedprox", init, round_fn, lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.params)),
                     cfg, model=model, num_agents=num_agents, build=lambda c: fedprox(model, c, num_agents))
