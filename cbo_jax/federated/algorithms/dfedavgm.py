"""DFedAvgM: decentralised FedAvg with momentum (Sun, Li and Wang, "Decentralized federated
averaging", IEEE TPAMI 2022), the oracle baselines of the FedCB²O paper (REFERENCE_NOTES §2.2).

Per round every agent trains τ local epochs of SGD with heavy-ball momentum on its own
data, then downloads ``M`` neighbours drawn uniformly at random from its own group and
replaces its model by the average of its own and its neighbours' models, weighted by
their numbers of training samples:

    θ_j ← Σ_{i ∈ A_n(j) ∪ {j}} n_i θ_i / Σ_{i ∈ A_n(j) ∪ {j}} n_i.

The groups are given to the algorithm: it is an oracle. The paper runs it on a single
cluster without attacks: ``Oracle Min`` (attackers removed, only the benign agents of
each cluster) and ``Oracle Max`` (the attackers present but honest, with their clean
labels, in their cluster). Non-finite neighbours get weight zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, weighted_rows_mean
from cbo_jax.federated.algorithms.fedcb2o import AttackRoundInfo, train_groups
from cbo_jax.federated.local import LocalSGDConfig, make_optimizer
from cbo_jax.federated.padding import resize_rows
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["DFedAvgMConfig", "DFedAvgMState", "dfedavgm", "group_neighbours"]


@dataclasses.dataclass(frozen=True)
class DFedAvgMConfig:
    """DFedAvgM parameters.

    Attributes:
      M: neighbours per agent per round (at most the smallest group size minus one).
      local: local SGD with momentum (paper: τ = 5, batch 64, lr 0.004, momentum 0.9).
    """

    M: int = 20
    local: LocalSGDConfig = LocalSGDConfig(epochs=5, batch_size=64, lr=0.004, momentum=0.9)

    def __post_init__(self):
        _checks.positive_int("M", self.M)
        if not isinstance(self.local, LocalSGDConfig):
            raise ValueError(f"local must be a LocalSGDConfig, got {self.local!r}")


class DFedAvgMState(NamedTuple):
    params: PyTree
    opt_state: PyTree
    round: jax.Array
    key: jax.Array


def group_neighbours(key: jax.Array, groups, m: int) -> jax.Array:
    """``(N, M)``: for each agent, ``M`` distinct others of its group uniformly at random."""
    groups = jnp.asarray(groups)
    n = groups.shape[0]
    same = (groups[:, None] == groups[None, :]) & ~jnp.eye(n, dtype=bool)
    score = jnp.where(same, jax.random.uniform(key, (n, n)), -1.0)
    return jax.lax.top_k(score, m)[1].astype(jnp.int32)


def dfedavgm(model: Model, cfg: DFedAvgMConfig, groups, name: str = "dfedavgm") -> Algorithm:
    """Build DFedAvgM over agents with group ids ``groups`` (``(N,)``; the oracle's clusters).

    The round function takes a tuple of :class:`AgentData` holding consecutive agents
    (see :func:`~cbo_jax.federated.attacks.grouped_local_train`). The last group may hold
    inactive padding agents after the ``N`` real ones (sharded ``run_attack(..., mesh=)``,
    :mod:`cbo_jax.federated.padding`): they are nobody's neighbour, weigh nothing in any
    average and keep their models; random numbers are drawn for the ``N`` real agents.
    """
    groups = np.asarray(groups, np.int32)
    n = groups.shape[0]
    sizes_by_group = np.bincount(groups)
    smallest = int(sizes_by_group[sizes_by_group > 0].min())
    if not 1 <= cfg.M <= smallest - 1:
        raise ValueError(f"M (neighbours per agent) must satisfy 1 <= M <= smallest group size - 1 = {smallest - 1}, "
                         f"got M={cfg.M}")

    def init(key):
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return DFedAvgMState(params, jax.vmap(make_optimizer(cfg.local).init)(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: DFedAvgMState, data: tuple[AgentData, ...]):
        key, k_local, k_sel = jax.random.split(state.key, 3)
        trained = train_groups(model, cfg.local, state.params, state.opt_state, tuple(data), k_local, n)
        size = pop.num_agents(trained.params)  # n, or more with padding agents (sharded runs)
        idx = group_neighbours(k_sel, groups, cfg.M)
        sizes = jnp.concatenate([g.counts for g in data]).astype(jnp.float32)
        clean, ok = pop.zero_nonfinite_rows(trained.params)
        w = jnp.where(ok[idx], sizes[idx], 0.0)
        w_self = jnp.where(ok, sizes, 0.0)[:n]
        rows = jnp.arange(n)
        # (n, size): the padding agents' columns stay zero (never averaged)
        dense = jnp.zeros((n, size), jnp.float32).at[rows[:, None], idx].add(w).at[rows, rows].add(w_self)
        params = weighted_rows_mean(clean, dense)
        if size != n:  # padding agents keep their (never read) models
            params = jax.tree_util.tree_map(lambda a, t: jnp.concatenate([a, t[n:]], axis=0), params, trained.params)
        total = jnp.maximum(jnp.sum(w, axis=1) + w_self, 1e-30)
        info = AttackRoundInfo(idx=idx, weights=w / total[:, None], self_weight=w_self / total,
                               loss=jnp.full(idx.shape, jnp.nan), train_loss=trained.loss)
        return DFedAvgMState(params, trained.opt_state, state.round + 1, key), info

    def resize(state: DFedAvgMState, size: int) -> DFedAvgMState:
        return state._replace(params=resize_rows(state.params, size), opt_state=resize_rows(state.opt_state, size))

    return Algorithm(name=name, init=init, round=round_fn, eval_models=lambda s: ("agent", s.params), config=cfg,
                     resize=resize)
