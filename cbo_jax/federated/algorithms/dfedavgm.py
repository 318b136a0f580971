"""DFedAvgM: decentralised FedAvg with momentum (Sun, Li and Wang, "Decentralized federated
averaging", IEEE TPAMI 2022), the oracle baselines of the FedCB²O paper (§3.5).

Per round every agent trains τ local epochs of SGD with heavy-ball momentum on its own
data, then downloads ``M`` neighbours drawn uniformly at random from its own group and
replaces its model by the average of its own and its neighbours' models, weighted by
their numbers of training samples:

    θ_j ← Σ_{i ∈ A_n(j) ∪ {j}} n_i θ_i / Σ_{i ∈ A_n(j) ∪ {j}} n_i.

The groups are given to the algorithm: it is an oracle. The paper runs it on a single
cluster without attacks: ``Oracle Min`` (attackers removed, only the benign agents of
each cluster: ``attack_data(attackers=False)``) and ``Oracle Max`` (the attackers
present but honest, with their clean labels, in their cluster:
``attack_data(honest=True)``). Non-finite neighbours get weight zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax import population as pop
from cbo_jax.federated.algorithms.base import Algorithm, per_agent_fields
from cbo_jax.federated.attacks import AttackData, grouped_local_train
from cbo_jax.federated.local import LocalSGDConfig, make_optimizer
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["DFedAvgMConfig", "DFedAvgMState", "DFedAvgMInfo", "dfedavgm", "group_neighbours"]


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
        check_types(self)
        _checks.positive_int("M", self.M)
        if not isinstance(self.local, LocalSGDConfig):
            raise ValueError(f"local must be a LocalSGDConfig, got {self.local!r}")


@per_agent_fields("params", "opt_state")
class DFedAvgMState(NamedTuple):
    params: PyTree
    opt_state: PyTree
    round: jax.Array
    key: jax.Array


@per_agent_fields("train_loss", "diverged")
class DFedAvgMInfo(NamedTuple):
    idx: jax.Array  # (N, M) neighbours
    weights: jax.Array  # (N, M) their normalised weights
    self_weight: jax.Array  # (N,) the agent's own weight
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    diverged: jax.Array | None = None  # (N,) agents whose trained model held a NaN or an infinity (weight 0)


def group_neighbours(key: jax.Array, groups, m: int) -> jax.Array:
    """``(N, M)``: for each agent, ``M`` distinct others of its group uniformly at random."""
    groups = jnp.asarray(groups)
    n = groups.shape[0]
    same = (groups[:, None] == groups[None, :]) & ~jnp.eye(n, dtype=bool)
    score = jnp.where(same, jax.random.uniform(key, (n, n)), -1.0)
    return jax.lax.top_k(score, m)[1].astype(jnp.int32)


def dfedavgm(model: Model, cfg: DFedAvgMConfig, groups: ArrayLike, name: str = "dfedavgm") -> Algorithm:
    """Build DFedAvgM over agents with group ids ``groups`` (``(N,)``; the oracle's clusters).

    The round function takes :class:`~cbo_jax.federated.attacks.AttackData` (its
    training groups; the validation splits are not used) of the ``N`` agents of
    ``groups`` (fewer are refused with a ``ValueError`` when the round is traced). Agents
    after the ``N`` it was built for (inactive padding agents of a sharded run) are
    nobody's neighbour and keep their models.
    """
    groups = _checks.cluster_ids("groups", groups)
    n = groups.shape[0]
    sizes_by_group = np.bincount(groups)
    smallest = int(sizes_by_group[sizes_by_group > 0].min())
    _checks.downloads(cfg.M, smallest, what="neighbours per agent", among="smallest group size")

    def init(key):
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return DFedAvgMState(params, jax.vmap(make_optimizer(cfg.local).init)(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: DFedAvgMState, data: AttackData):
        if not isinstance(data, AttackData):  # else an AttributeError ('AgentData' object has no attribute 'groups')
            raise ValueError(f"{name} takes an AttackData (the agents' groups), got {type(data).__name__}: "
                             f"fl.AttackData.from_lists(...) builds one from per-agent arrays, "
                             f"AttackDataset.attack_data() from the benchmark")
        if data.num_agents < n:  # static shapes: named at trace time (Oracle Min's data needs its benign groups)
            raise ValueError(f"the data holds {data.num_agents} agents ({data.benign.num_agents} benign, "
                             f"{data.malicious.num_agents} attackers), but {name} was built for groups of {n} agents")
        key, k_local, k_sel = jax.random.split(state.key, 3)
        trained = grouped_local_train(model, cfg.local, state.params, state.opt_state, data.groups, k_local)
        size = pop.num_agents(trained.params)
        idx = group_neighbours(k_sel, groups, cfg.M)
        sizes = jnp.concatenate([g.counts for g in data.groups]).astype(jnp.float32)
        clean, ok = pop.zero_nonfinite_rows(trained.params)
        w = jnp.where(ok[idx], sizes[idx], 0.0)
        w_self = jnp.where(ok, sizes, 0.0)[:n]
        rows = jnp.arange(n)
        # (n, size): agents after the n real ones (padding) are never averaged and keep their models
        dense = jnp.zeros((n, size), jnp.float32).at[rows[:, None], idx].add(w).at[rows, rows].add(w_self)
        params = jax.tree_util.tree_map(lambda a, t: jnp.concatenate([a, t[n:]], axis=0),
                                        pop.weighted_average(clean, dense), trained.params)
        total = jnp.maximum(jnp.sum(w, axis=1) + w_self, 1e-30)
        info = DFedAvgMInfo(idx, w / total[:, None], w_self / total, trained.loss, (jnp.arange(size) < n) & ~ok)
        return DFedAvgMState(params, trained.opt_state, state.round + 1, key), info

    return Algorithm(name, init, round_fn, lambda s: ("agent", s.params), cfg, model=model, takes=AttackData,
                     build=lambda c: dfedavgm(model, c, groups, name))
