"""Decentralised FedAvg with a robust aggregation rule: the robust baselines beside FedCB²O.

Per round every agent trains τ local epochs of SGD on its own data. Each benign agent then
downloads ``M`` others drawn uniformly at random from its own cluster (the clusters are given,
as to the DFedAvgM oracles; who is an attacker is not) and replaces its model by a robust
aggregate of its own model and the downloads (:mod:`cbo_jax.federated.robust`):

* ``"median"`` -- the coordinate-wise median (Yin et al. 2018);
* ``"trimmed_mean"`` -- the coordinate-wise β-trimmed mean (Yin et al. 2018);
* ``"krum"`` -- Krum / Multi-Krum tolerating ``f`` attackers (Blanchard et al. 2017);
* ``"mean"`` -- the plain mean (no defence, for comparison).

The attackers act as in :func:`~cbo_jax.federated.algorithms.fedcb2o.fedcb2o`: each downloads
the other attackers of its cluster first, then benign agents, and averages by data size
(:func:`~cbo_jax.federated.attacks.attacker_selection`, :func:`~cbo_jax.federated.attacks.attacker_average`).
A model holding a NaN or an infinity is left out of every aggregate; a benign agent with no
finite model keeps its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.federated import robust
from cbo_jax.federated.algorithms.base import Algorithm, diverged, per_agent_fields
from cbo_jax.federated.algorithms.dfedavgm import group_neighbours
from cbo_jax.federated.attacks import (AttackData, agent_roles, attacker_average, attacker_selection, check_split,
                                      grouped_local_train)
from cbo_jax.federated.local import LocalSGDConfig, make_optimizer
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["RobustConfig", "RobustState", "RobustInfo", "robust_dfedavg"]


@dataclasses.dataclass(frozen=True)
class RobustConfig:
    """A robust decentralised baseline.

    Attributes:
      rule: the aggregation rule: median, trimmed_mean, krum or mean.
      M: downloads per agent per round (at most the smallest cluster's size minus one).
      beta: the trimmed mean's share dropped at each end, in [0, 0.5).
      f: the attackers Krum tolerates among an agent's M + 1 models.
      m_select: Multi-Krum: the mean of this many best-scoring models (1: Krum).
      agent_chunk: benign agents aggregated at once (bounds the (chunk, M + 1, ...) gather).
      local: local SGD (as the FedCB²O experiment's).
    """

    rule: str = "median"
    M: int = 20
    beta: float = 0.1
    f: int = 6
    m_select: int = 1
    agent_chunk: int = 8
    local: LocalSGDConfig = LocalSGDConfig(epochs=5, batch_size=64, lr=0.004, momentum=0.9)

    def __post_init__(self):
        check_types(self)
        _checks.one_of("rule", self.rule, robust.RULES)
        _checks.positive_int("M", self.M)
        if not 0 <= _checks.non_negative("beta", self.beta) < 0.5:
            raise ValueError(f"beta must lie in [0, 0.5), got {self.beta!r}")
        if self.f < 0:
            raise ValueError(f"f must be >= 0, got {self.f!r}")
        _checks.positive_int("m_select", self.m_select)
        _checks.positive_int("agent_chunk", self.agent_chunk)


@per_agent_fields("params", "opt_state")
class RobustState(NamedTuple):
    params: PyTree  # (N, ...) benign agents first, then attackers
    opt_state: PyTree
    round: jax.Array
    key: jax.Array


@per_agent_fields("train_loss", "diverged")
class RobustInfo(NamedTuple):
    idx: jax.Array  # (N_b, M) the benign agents' downloads
    fallback: jax.Array  # (N_b,) no finite model: the agent kept its own
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    diverged: jax.Array | None = None  # (N,) agents whose model holds a NaN or an infinity


def robust_dfedavg(model: Model, cfg: RobustConfig, cluster: ArrayLike, malicious: ArrayLike,
                   name: str | None = None) -> Algorithm:
    """Build the robust baseline over agents with cluster ids ``cluster`` and attacker flags
    ``malicious`` (benign agents first; the round takes an :class:`~cbo_jax.federated.attacks.AttackData`)."""
    cluster, malicious, nb = agent_roles(cluster, malicious)
    n = cluster.shape[0]
    sizes = np.bincount(cluster)
    _checks.downloads(cfg.M, int(sizes[sizes > 0].min()), what="downloads per agent", among="smallest cluster size")
    attackers = jnp.asarray(np.flatnonzero(malicious), jnp.int32)
    label = name or f"dfedavg_{cfg.rule}"

    def combine(rows, valid):
        return robust.aggregate(cfg.rule, rows, valid, beta=cfg.beta, f=cfg.f, m_select=cfg.m_select)

    def init(key):
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return RobustState(params, jax.vmap(make_optimizer(cfg.local).init)(params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: RobustState, data: AttackData):
        check_split(data, nb, n - nb, label)
        key, k_local, k_sel, k_att = jax.random.split(state.key, 4)
        trained = grouped_local_train(model, cfg.local, state.params, state.opt_state, data.groups, k_local)
        params = trained.params
        idx = group_neighbours(k_sel, cluster, cfg.M)[:nb]  # (N_b, M), attackers of the cluster included
        mine = jnp.concatenate([jnp.arange(nb)[:, None], idx], axis=1)  # own model first

        def one(rows_idx):
            rows = jax.tree_util.tree_map(lambda a: a[rows_idx], params)
            out, ok = combine(rows, None)
            own = jax.tree_util.tree_map(lambda a: a[rows_idx[0]], params)
            return jax.tree_util.tree_map(lambda o, s: jnp.where(ok, o, s), out, own), ~ok

        benign, fallback = jax.lax.map(one, mine, batch_size=cfg.agent_chunk)
        parts = [benign]
        if n > nb:
            a_idx, a_valid = attacker_selection(k_att, cluster, malicious, cfg.M)
            counts = jnp.concatenate([g.counts for g in data.groups]).astype(jnp.float32)
            parts.append(attacker_average(params, attackers, a_idx, a_valid, counts))
        new = jax.tree_util.tree_map(lambda t, *ps: jnp.concatenate(ps + (t[n:],), axis=0), params, *parts)
        info = RobustInfo(idx, fallback, trained.loss, diverged(new, n))
        return RobustState(new, trained.opt_state, state.round + 1, key), info

    return Algorithm(label, init, round_fn, lambda s: ("agent", s.params), cfg, model=model, takes=AttackData,
                     build=lambda c: robust_dfedavg(model, c, cluster, malicious, name))
