"""CFL: clustered federated learning (Sattler, Müller and Samek, "Clustered federated learning:
model-agnostic distributed multitask optimization under privacy constraints", IEEE TNNLS 2021,
Algorithm 1).

The agents start in one cluster. Per round every agent of ``G_n`` starts from its cluster's model
``θ_c``, trains locally (τ epochs) and reports its update ``Δθ_j = trained - θ_c``. A cluster ``c``
whose FedAvg has reached a stationary point of its joint objective while its agents still pull apart,

    ‖Σ_{j ∈ c} w_j Δθ_j‖ < ε1   and   max_{j ∈ c} ‖Δθ_j‖ > ε2      (w_j = n_j / Σ_{i ∈ c} n_i),

is split in two by the cosine similarities ``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖ ‖Δθ_j‖)`` of its updates:
agglomerative clustering into two groups (:func:`bipartition`), with complete linkage as the authors'
code (``linkage="single"`` gives the paper's optimal bipartition ``argmin max_{i ∈ c1, j ∈ c2} α_ij``
exactly: it cuts the maximum spanning tree of ``α`` at its weakest edge; complete linkage need not). Then each
cluster, split or not, adds the average of its agents' updates weighted by their sample counts
(FedAvg in every cluster). The split is not checked further against the paper's bound γ_max.

A split also needs the round to be past ``warmup``, two or more agents of ``G_n`` in the cluster
with a finite update, and fewer than ``max_clusters`` clusters. Fixed shapes (one jitted round):
the state holds ``max_clusters`` model slots, the agents' cluster ids and the number of clusters;
at most one cluster is split per round (among the candidates, the one with the largest max update
norm), its second group (the one without its lowest-index agent) taking the next free slot, which
starts from the split cluster's model. Agents outside ``G_n``, or whose update is not finite, keep
their cluster id and get weight zero; a cluster without a finite update keeps its model.

``eval_models`` gives the server models as IFCA's (each test set picks the model with the smallest
loss); the slots not yet in use are given cluster 0's model, so that they never win a test set.
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
from cbo_jax.federated.local import local_train
from cbo_jax.models import Model

PyTree = Any

__all__ = ["CFLConfig", "CFLState", "CFLInfo", "cfl", "bipartition", "cosine_similarities", "LINKAGES"]

LINKAGES = ("complete", "single")


@dataclasses.dataclass(frozen=True)
class CFLConfig(BaselineConfig):
    """CFL: FedAvg's share of agents and local SGD, and when and how a cluster splits.

    The defaults are the authors' code's (MNIST experiment; the norms are those of whole
    parameter updates, so they depend on the model and the local SGD: tune them).

    Attributes:
      eps1: a cluster splits only if its mean update's norm is below ε1.
      eps2: and the largest update norm of its agents above ε2.
      max_clusters: the most clusters (model slots in the state).
      warmup: rounds before the first split (the round counter starts at 0).
      linkage: agglomerative bipartition, complete (the authors' code) or single (the optimum).
    """

    eps1: float = 0.4
    eps2: float = 1.6
    max_clusters: int = 8
    warmup: int = 20
    linkage: str = "complete"

    def __post_init__(self):
        super().__post_init__()
        _checks.non_negative("eps1", self.eps1, f32=True)
        _checks.non_negative("eps2", self.eps2, f32=True)
        _checks.positive_int("max_clusters", self.max_clusters)
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        _checks.one_of("linkage", self.linkage, LINKAGES)


@per_agent_fields("cluster")
class CFLState(NamedTuple):
    params: PyTree  # (max_clusters, ...) the cluster models; slots >= num_clusters unused
    cluster: jax.Array  # (N,) int32 each agent's cluster
    num_clusters: jax.Array  # () int32 clusters in use
    round: jax.Array
    key: jax.Array


@per_agent_fields("active", "train_loss", "cluster", "diverged")
class CFLInfo(NamedTuple):
    active: jax.Array  # (N,) agents in G_n
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    cluster: jax.Array  # (N,) each agent's cluster after the round
    split: jax.Array  # () bool: a cluster was split this round
    mean_norm: jax.Array  # (max_clusters,) ‖weighted mean update‖ of each cluster before the split (0: none)
    max_norm: jax.Array  # (max_clusters,) its largest update norm (0: none)
    diverged: jax.Array | None = None  # (N,) agents of G_n whose trained model held a NaN or an infinity (weight 0)


def cosine_similarities(updates: PyTree) -> tuple[jax.Array, jax.Array]:
    """``(α, norms)``: the ``(N, N)`` cosine similarities of stacked updates and their ``(N,)`` norms,
    from one Gram matrix summed over the leaves (no flattened copy); a zero update's similarities are 0."""
    gram = sum(jnp.einsum("ip,jp->ij", a, a, precision=jax.lax.Precision.HIGHEST)
               for a in (jnp.reshape(leaf, (leaf.shape[0], -1)).astype(jnp.float32)
                         for leaf in jax.tree_util.tree_leaves(updates)))
    norms = jnp.sqrt(jnp.maximum(jnp.diagonal(gram), 0))
    outer = norms[:, None] * norms[None, :]
    return jnp.where(outer > 0, gram / jnp.where(outer > 0, outer, 1), 0.0), norms


def bipartition(sim: jax.Array, members: jax.Array, linkage: str = "complete") -> jax.Array:
    """``(N,)`` bool: the second of two groups of ``members`` by agglomerative clustering on ``sim``.

    Every member starts as a group of its own; ``Σ members - 2`` times the two groups of the
    highest linkage merge (complete: the smallest similarity between them; single: the largest;
    ties: the first pair in row-major order). The group holding the lowest-index member is the
    first (False); non-members are False. Jittable: a loop over an ``(N, N)`` masked matrix.
    """
    _checks.one_of("linkage", linkage, LINKAGES)
    n = sim.shape[0]
    idx = jnp.arange(n)
    link = jnp.where(members[:, None] & members[None, :] & (idx[:, None] != idx[None, :]), sim, -jnp.inf)
    combine = jnp.minimum if linkage == "complete" else jnp.maximum

    def merge(_, carry):
        link, label = carry
        a, b = jnp.divmod(jnp.argmax(link), n)
        a, b = jnp.minimum(a, b), jnp.maximum(a, b)  # b joins a
        row = combine(link[a], link[b]).at[a].set(-jnp.inf).at[b].set(-jnp.inf)
        link = link.at[a, :].set(row).at[:, a].set(row).at[b, :].set(-jnp.inf).at[:, b].set(-jnp.inf)
        return link, jnp.where(label == b, a, label)

    _, label = jax.lax.fori_loop(0, jnp.sum(members) - 2, merge, (link, idx))
    first = label[jnp.argmax(members)]
    return members & (label != first)


def cfl(model: Model, cfg: CFLConfig, num_agents: int) -> Algorithm:
    """CFL as a pure ``(init, round)`` pair; the state holds ``max_clusters`` model slots."""
    _checks.positive_int("num_agents", num_agents)
    k = cfg.max_clusters
    slots = jnp.arange(k)

    def init(key):
        k_model, k_state = jax.random.split(key)  # as FedAvg: the same initial model for a key
        return CFLState(broadcast(model.init(k_model), k), jnp.zeros(num_agents, jnp.int32), jnp.ones((), jnp.int32),
                        jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: CFLState, data: AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = participants(k_part, data.agent_mask, cfg.participation)
        start = pop.gather(state.params, state.cluster)
        trained = local_train(model, cfg.local, start, None, data, k_local)
        clean, finite = pop.zero_nonfinite_rows(trained.params)
        ok = active & finite
        delta = pop.tree_where_rows(ok, pop.tree_sub(clean, start), jax.tree_util.tree_map(jnp.zeros_like, start))
        sim, norms = cosine_similarities(delta)
        member = (state.cluster[None, :] == slots[:, None]) & ok[None, :]  # (k, N)
        counts = data.counts.astype(jnp.float32)
        mean_norm = pop.norms(pop.weighted_average(delta, jnp.where(member, counts, 0)))
        max_norm = jnp.max(jnp.where(member, norms[None, :], 0), axis=1)
        candidate = ((mean_norm < cfg.eps1) & (max_norm > cfg.eps2) & (jnp.sum(member, axis=1) >= 2)
                     & (state.num_clusters < k) & (state.round >= cfg.warmup))  # an unused slot has no member
        split = jnp.any(candidate)
        c = jnp.argmax(jnp.where(candidate, max_norm, -1.0))
        new = jnp.minimum(state.num_clusters, k - 1)  # the next free slot (only written by a split)
        second = bipartition(sim, member[c], cfg.linkage) & split
        cluster = jnp.where(second, new, state.cluster).astype(jnp.int32)
        params = jax.tree_util.tree_map(lambda p: p.at[new].set(jnp.where(split, p[c], p[new])), state.params)
        member = (cluster[None, :] == slots[:, None]) & ok[None, :]
        weights = jnp.where(member, counts, 0)
        step = pop.weighted_average(delta, weights)  # zeros for a cluster without weight
        params = pop.tree_add(params, step)
        info = CFLInfo(active, trained.loss, cluster, split, mean_norm, max_norm, active & ~finite)
        return CFLState(params, cluster, state.num_clusters + split.astype(jnp.int32), state.round + 1, key), info

    def eval_models(state: CFLState):
        used = slots < state.num_clusters
        return "server", jax.tree_util.tree_map(
            lambda p: jnp.where(jnp.reshape(used, (k,) + (1,) * (p.ndim - 1)), p, p[:1]), state.params)

    return Algorithm("cfl", init, round_fn, eval_models, cfg, model=model, num_agents=num_agents,
                     build=lambda c: cfl(model, c, num_agents))
