"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: stochastic controlled
averaging for federated learning", ICML 2020, Algorithm 1): FedAvg whose local steps are corrected by
control variates, a server one ``c`` and one ``c_j`` per agent (kept by the agent between rounds).

Per round the agents ``j`` of ``G_n`` start from the server model ``x`` and take ``K_j`` local steps

    y ← y - η_l (g_j(y) - c_j + c)

(:func:`~cbo_jax.federated.local.local_train` with ``correction = c - c_j``), then update their
control variates by option II,

    c_j⁺ = c_j - c + (x - y_j) / (K_j η_l),

and the server moves, with ``S`` the ``m`` agents of ``G_n`` and ``N`` the real agents,

    x ← x + η_g · (1 / m) Σ_{j ∈ S} (y_j - x),    c ← c + (1 / N) Σ_{j ∈ S} (c_j⁺ - c_j).

The mean is the paper's plain one, not FedAvg's weighted by sample counts (equal where the agents
hold equally many samples). Agents outside ``G_n`` keep their ``c_j``; ``c`` stays the mean of the
``c_j`` over the real agents (all start at zero).

``K_j`` is the number of SGD steps agent ``j``'s local training really takes: ``epochs ·
ceil(n_j / B)`` (a batch without a real sample takes no step), so agents with unequal sample counts
divide by their own ``K_j``. With heavy-ball momentum β (``LocalSGDConfig.momentum``, fresh every
round: ``local_train`` starts it anew), ``K_j`` becomes ``W_j = Σ_{k=1..K_j} (1 - β^k) / (1 - β)``,
the total weight the optimiser puts on a constant gradient over ``K_j`` steps, so that ``c_j⁺`` is
again ``g_j`` where ``g_j`` is constant (without it, about ``g_j / (1 - β)``, ten times too large at
``LocalSGDConfig``'s default β = 0.9); ``β = 0`` is the paper's option II exactly. The paper uses plain
SGD (``momentum=0``).

An agent whose trained model holds a NaN or an infinity (or which holds no sample, and so takes no
step) is left out of ``S``: weight zero, as in FedAvg, and it keeps its ``c_j``; a round without a
finite model keeps ``x`` and ``c``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import (AgentData, Algorithm, BaselineConfig, broadcast, participants,
                                               per_agent_fields)
from cbo_jax.federated.algorithms.fedavg import FedAvgInfo
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.models import Model

PyTree = Any

__all__ = ["ScaffoldConfig", "ScaffoldState", "scaffold", "local_step_weights"]


@dataclasses.dataclass(frozen=True)
class ScaffoldConfig(BaselineConfig):
    """SCAFFOLD: FedAvg's share of agents and local SGD, and the server learning rate.

    Attributes:
      server_lr: the global step size η_g (Karimireddy et al. use 1).
    """

    server_lr: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        _checks.positive("server_lr", self.server_lr, f32=True)


@per_agent_fields("client_control")
class ScaffoldState(NamedTuple):
    params: PyTree  # the server model x (no agent axis)
    control: PyTree  # the server control variate c (no agent axis)
    client_control: PyTree  # (N, ...) the agents' control variates c_j
    round: jax.Array
    key: jax.Array


def local_step_weights(cfg: LocalSGDConfig, counts: jax.Array, n_max: int) -> jax.Array:
    """``(N,)``: the ``K_j`` of option II for agents holding ``counts`` samples (of ``n_max`` slots).

    ``K_j = epochs · ceil(n_j / B)`` SGD steps (local training skips a batch without a real sample);
    with momentum β the sum ``Σ_{k=1..K_j} (1 - β^k) / (1 - β)`` of the heavy-ball weights instead.
    """
    n = jnp.clip(jnp.asarray(counts), 0, n_max)
    k = (cfg.epochs * ((n + cfg.batch_size - 1) // cfg.batch_size)).astype(jnp.float32)
    b = jnp.asarray(cfg.momentum, jnp.float32)  # β = 0 gives k exactly (no branch: a swept β is traced)
    return (k - b * (1 - jnp.power(b, k)) / (1 - b)) / (1 - b)


def scaffold(model: Model, cfg: ScaffoldConfig, num_agents: int) -> Algorithm:
    """SCAFFOLD as a pure ``(init, round)`` pair; the state holds ``x``, ``c`` and every agent's ``c_j``."""
    _checks.positive_int("num_agents", num_agents)

    def init(key):
        k_model, k_state = jax.random.split(key)  # as FedAvg: the same initial model for a key
        params = model.init(k_model)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return ScaffoldState(params, zeros, broadcast(zeros, num_agents), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: ScaffoldState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        n = data.counts.shape[0]
        active = participants(k_part, data.agent_mask, cfg.participation)
        start = broadcast(state.params, n)
        correction = jax.tree_util.tree_map(lambda c, ci: c[None] - ci, state.control, state.client_control)
        trained = local_train(model, cfg.local, start, None, data, k_local, correction=correction)
        clean, finite = pop.zero_nonfinite_rows(trained.params)
        steps = local_step_weights(cfg.local, data.counts, data.x.shape[1])
        ok = active & finite & (steps > 0)
        rows = lambda v, leaf: jnp.reshape(v, (n,) + (1,) * (leaf.ndim - 1))  # noqa: E731
        moved = jax.tree_util.tree_map(lambda y, x: jnp.where(rows(ok, y), y - x[None], 0), clean, state.params)
        scale = cfg.local.lr * jnp.where(ok, steps, 1.0)
        new_ci = jax.tree_util.tree_map(  # option II, for the agents of S; the others keep c_j
            lambda ci, c, d: jnp.where(rows(ok, ci), ci - c[None] - d / rows(scale, d).astype(d.dtype), ci),
            state.client_control, state.control, moved)
        num_ok = jnp.sum(ok)
        real = jnp.maximum(jnp.sum(data.agent_mask), 1)
        params = jax.tree_util.tree_map(  # a round without a finite model adds 0 to x and c
            lambda x, d: x + (cfg.server_lr * jnp.sum(d, 0) / jnp.maximum(num_ok, 1)).astype(x.dtype), state.params,
            moved)
        control = jax.tree_util.tree_map(
            lambda c, new, old: c + (jnp.sum(new - old, 0) / real).astype(c.dtype), state.control, new_ci,
            state.client_control)
        return (ScaffoldState(params, control, new_ci, state.round + 1, key),
                FedAvgInfo(active, trained.loss, active & ~finite))

    return Algorithm("scaffold", init, round_fn,
                     lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.params)), cfg, model=model,
                     num_agents=num_agents, build=lambda c: scaffold(model, c, num_agents))
