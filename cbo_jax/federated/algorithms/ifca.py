"""IFCA: the iterative federated clustering algorithm (Ghosh et al. 2020).

The server keeps ``k`` models. Per round, every agent of ``G_n`` estimates its cluster
as the argmin over the ``k`` server models of its local training loss, trains the
chosen model locally (τ epochs), and the server averages, for each cluster estimate,
the models of the agents that chose it (weighted by their numbers of samples, as FedAvg;
Ghosh et al.'s model averaging weighs the machines equally, which is the same wherever the
agents hold equally many samples, as in the FedCBO experiments' 200 each). A
trained model holding a NaN or an infinity gets weight zero, and a server model with no
finite model to average is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, BaselineConfig, participants, per_agent_fields
from cbo_jax.federated.local import agent_loss, local_train
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["IFCAConfig", "IFCAState", "IFCAInfo", "ifca"]


@dataclasses.dataclass(frozen=True)
class IFCAConfig(BaselineConfig):
    """IFCA: the number of server models, share of agents per round and local SGD.

    Attributes:
      k: number of server models (the paper uses the true number of clusters).
    """

    k: int = dataclasses.field(default=4, metadata={"cli_default": "--clusters"})

    def __post_init__(self):
        super().__post_init__()
        _checks.positive_int("k", self.k)


class IFCAState(NamedTuple):
    params: PyTree  # (k, ...) server models
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "assignment", "train_loss", "diverged")
class IFCAInfo(NamedTuple):
    active: jax.Array  # (N,)
    assignment: jax.Array  # (N,) each agent's cluster estimate
    train_loss: jax.Array  # (N,)
    diverged: jax.Array | None = None  # (N,) agents of G_n whose trained model held a NaN or an infinity (weight 0)


def ifca(model: Model, cfg: IFCAConfig, num_agents: int) -> Algorithm:
    """IFCA as a pure ``(init, round)`` pair for ``num_agents`` agents; the state holds
    the ``k`` server models."""
    _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)
        return IFCAState(init_population(model, k_model, cfg.k), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: IFCAState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = participants(k_part, data.agent_mask, cfg.participation)
        # (N, k) local losses of every server model; cluster estimate = argmin.
        losses = jax.vmap(
            lambda x, y, c: jax.vmap(lambda p: agent_loss(model, p, x, y, c))(state.params)
        )(data.x, data.y, data.counts)
        assignment = jnp.argmin(losses, axis=1).astype(jnp.int32)
        trained = local_train(model, cfg.local, pop.gather(state.params, assignment), None, data, k_local)
        member = (assignment[None, :] == jnp.arange(cfg.k)[:, None]) & active[None, :]
        clean, finite = pop.zero_nonfinite_rows(trained.params)  # 0 · NaN would be NaN in every server model
        weights = jnp.where(member & finite[None, :], data.counts[None, :], 0).astype(jnp.float32)
        averaged = pop.weighted_average(clean, weights)
        chosen = jnp.any(weights > 0, axis=1)
        params = jax.tree_util.tree_map(
            lambda new, old: jnp.where(jnp.reshape(chosen, (cfg.k,) + (1,) * (new.ndim - 1)), new, old), averaged,
            state.params)
        return IFCAState(params, state.round + 1, key), IFCAInfo(active, assignment, trained.loss, active & ~finite)

    return Algorithm("ifca", init, round_fn, lambda s: ("server", s.params), cfg, model=model, num_agents=num_agents,
                     build=lambda c: ifca(model, c, num_agents))
