"""Adaptive server optimisers: FedAdam and FedYogi (Reddi, Charles, Zaheer, Garrett, Rush,
Konečný, Kumar and McMahan, "Adaptive federated optimization", ICLR 2021, Algorithm 2).

Per round the agents of ``G_n`` start from the global model ``x``, train locally (τ epochs), and
the server forms the pseudo-gradient from their average weighted by their numbers of samples,

    Δ = Σ_{j ∈ G_n} n_j θ_j / Σ_{j ∈ G_n} n_j - x,

and takes one step of an optax optimiser on the gradient ``-Δ``: ``optax.adam`` (FedAdam) or
``optax.yogi`` (FedYogi), with the server learning rate η, β1, β2 and the adaptivity τ as
``eps``. optax's Adam and Yogi correct their moments' bias (Yogi's accumulators start at
1e-6), which Reddi et al.'s Algorithm 2 does not. ``server="sgd"`` with ``server_lr=1`` is FedAvg. A trained model holding a NaN or
an infinity gets weight zero; a round with no finite model keeps the global model and the
optimiser's state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, BaselineConfig, per_agent_fields
from cbo_jax.federated.algorithms.fedavg import trained_average, where_any
from cbo_jax.models import Model

PyTree = Any

__all__ = ["FedOptConfig", "FedOptState", "FedOptInfo", "fedopt", "fedadam", "fedyogi", "SERVERS"]

SERVERS = ("adam", "yogi", "sgd")


@dataclasses.dataclass(frozen=True)
class FedOptConfig(BaselineConfig):
    """A server optimiser on FedAvg's pseudo-gradient (defaults: Reddi et al.'s FedAdam grid centre).

    Attributes:
      server: the optax optimiser: adam (FedAdam), yogi (FedYogi) or sgd.
      server_lr: the server learning rate η.
      beta1, beta2: the moments' decay rates.
      tau: the adaptivity τ (optax's ``eps``).
    """

    server: str = "adam"
    server_lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self):
        super().__post_init__()
        _checks.one_of("server", self.server, SERVERS)
        _checks.positive("server_lr", self.server_lr, f32=True)
        for name in ("beta1", "beta2"):
            v = _checks.non_negative(name, getattr(self, name))
            if v >= 1:
                raise ValueError(f"{name} must lie in [0, 1), got {v}")
        _checks.positive("tau", self.tau, f32=True)


def server_optimizer(cfg: FedOptConfig) -> optax.GradientTransformation:
    if cfg.server == "adam":
        return optax.adam(cfg.server_lr, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.tau)
    if cfg.server == "yogi":
        return optax.yogi(cfg.server_lr, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.tau)
    return optax.sgd(cfg.server_lr)


class FedOptState(NamedTuple):
    params: PyTree  # the global model (no agent axis)
    opt_state: PyTree  # the server optimiser's state
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "train_loss", "diverged")
class FedOptInfo(NamedTuple):
    active: jax.Array  # (N,) agents in G_n
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    diverged: jax.Array | None = None  # (N,) agents of G_n whose trained model held a NaN or an infinity (weight 0)


def fedopt(model: Model, cfg: FedOptConfig, num_agents: int, name: str | None = None) -> Algorithm:
    """FedOpt with the server optimiser ``cfg.server`` as a pure ``(init, round)`` pair."""
    _checks.positive_int("num_agents", num_agents)
    opt = server_optimizer(cfg)

    def init(key):
        k_model, k_state = jax.random.split(key)  # as FedAvg: the same initial model for a key
        params = model.init(k_model)
        return FedOptState(params, opt.init(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedOptState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)  # as FedAvg: the same local training
        avg = trained_average(model, cfg, state.params, data, k_part, k_local)
        grad = jax.tree_util.tree_map(lambda x, a: (x - a).astype(x.dtype), state.params, avg.average)  # -Δ
        updates, new_opt = opt.update(grad, state.opt_state, state.params)
        stepped = optax.apply_updates(state.params, updates)
        return (FedOptState(where_any(avg.any_ok, stepped, state.params), where_any(avg.any_ok, new_opt, state.opt_state),
                            state.round + 1, key), FedOptInfo(avg.active, avg.trained.loss, avg.diverged))

    return Algorithm(name or f"fed{cfg.server}", init, round_fn,
                     lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.params)), cfg, model=model,
                     num_agents=num_agents, build=lambda c: fedopt(model, c, num_agents, name))


def fedadam(model: Model, cfg: FedOptConfig, num_agents: int) -> Algorithm:
    """FedAdam: :func:`fedopt` with ``optax.adam`` on the server (``cfg.server`` is set to it)."""
    return fedopt(model, dataclasses.replace(cfg, server="adam"), num_agents, "fedadam")


def fedyogi(model: Model, cfg: FedOptConfig, num_agents: int) -> Algorithm:
    """FedYogi: :func:`fedopt` with ``optax.yogi`` on the server (``cfg.server`` is set to it)."""
    return fedopt(model, dataclasses.replace(cfg, server="yogi"), num_agents, "fedyogi")
