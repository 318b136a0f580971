"""Round metrics of a federated run: ``f(info) -> dict`` inside the jitted scan, every round.

:func:`~cbo_jax.federated.metrics.round_stats`, :func:`~cbo_jax.federated.metrics.selection`
(SR_n, its oracle, the selection frequency by cluster; their formulas
:func:`~cbo_jax.federated.metrics.selection_rate`,
:func:`~cbo_jax.federated.metrics.oracle_selection_rate`,
:func:`~cbo_jax.federated.metrics.selection_frequency`),
:func:`~cbo_jax.federated.metrics.cluster_purity` and
:func:`~cbo_jax.federated.metrics.attack_selection` (with
:func:`~cbo_jax.federated.metrics.category_stats`). Public path:
:mod:`cbo_jax.federated.metrics`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks

CATEGORIES = ("same_benign", "same_malicious", "other_benign", "other_malicious")


def round_stats(info) -> dict:
    """Mean local training loss, ε of the selection, participants in ``G_n``.

    ``train_loss`` is the mean over the agents of ``G_n`` where the info has ``active``: every
    agent trains in the vmapped kernel, but only the participants' training is kept.
    """
    if isinstance(info, dict):  # an info of one's own given as a dict: its entries by name
        from types import SimpleNamespace

        info = SimpleNamespace(**info)
    out = {}
    if hasattr(info, "train_loss"):
        if hasattr(info, "active"):
            # NaN for a round without participants (there is no training loss to report); with
            # every agent in G_n the plain mean, whose reduction order a sharded run shares
            count = jnp.sum(info.active)
            over_active = jnp.sum(jnp.where(info.active, info.train_loss, 0)) / count.astype(info.train_loss.dtype)
            out["train_loss"] = jnp.where(count == info.active.shape[0], jnp.mean(info.train_loss), over_active)
        else:
            out["train_loss"] = jnp.mean(info.train_loss)
    if hasattr(info, "eps"):
        out["eps"] = info.eps
    if hasattr(info, "active"):
        out["participants"] = jnp.sum(info.active)
    return out


def selection_rate(idx: jax.Array, cluster: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """``SR_n = mean_j #{i in A_n(j) : cluster(i) = cluster(j)} / |A_n(j)|`` (the filled slots),
    over the agents ``j`` that downloaded anything (FedCBO's non-participants do not)."""
    same = cluster[idx] == cluster[:idx.shape[0], None]
    if valid is None:
        return jnp.mean(same)
    per_agent = jnp.sum(same & valid, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1)
    some = jnp.any(valid, axis=1)
    over_some = jnp.sum(jnp.where(some, per_agent, 0.0)) / jnp.maximum(jnp.sum(some), 1)
    return jnp.where(jnp.all(some), jnp.mean(per_agent), over_some)  # everyone downloaded: bitwise the pinned SR


def oracle_selection_rate(eps, cluster: jax.Array, m: int | None = None) -> jax.Array:
    """``(1 - ε) + ε · mean_j (|C(j)| - 1) / (N - 1)`` (Remark 6 / Fig. 3): the SR_n of a
    perfect ``P``, whose only misses are the random picks.

    With ``m`` (the downloads ``M``), ``ε`` is the share of random picks the ε-greedy draw
    makes, ``⌊εM⌋ / M`` (:func:`cbo_jax.federated.selection.draw_epsilon_greedy`, as the
    reference code's ``int(ε·M)``); the paper's settings (M = 200) make ``εM`` whole, where
    the two agree. Without it, ``ε`` itself.

    With ``m``, an agent ``j`` with fewer same-cluster peers than downloads (``|C(j)| - 1 < M``:
    small runs, not the paper's) cannot reach more than ``(|C(j)| - 1) / M``; its term is
    capped there (the formula alone gives 1 at ``ε = 0``). Full participation is assumed.
    """
    n = cluster.shape[0]
    sizes = jnp.sum(cluster[:, None] == cluster[None, :], axis=1)
    share = jnp.mean((sizes - 1) / max(n - 1, 1))
    if m is None:
        return (1.0 - eps) + eps * share
    eps = jnp.floor(jnp.asarray(eps, jnp.float32) * m + 1e-6) / m
    formula = (1.0 - eps) + eps * share
    per_agent = jnp.minimum((1.0 - eps) + eps * (sizes - 1) / max(n - 1, 1), (sizes - 1) / m)
    # where no cap binds, the formula itself (the mean of per_agent would round otherwise)
    return jnp.where(jnp.any(sizes - 1 < m), jnp.mean(per_agent), formula)


def selection_frequency(idx: jax.Array, cluster: jax.Array, num_clusters: int,
                        valid: jax.Array | None = None) -> jax.Array:
    """``(K, K)``: row a = share of the downloads of cluster-a agents that come from each cluster."""
    src = jnp.broadcast_to(cluster[:idx.shape[0], None], idx.shape).ravel()
    dst = cluster[idx].ravel()
    ones = jnp.ones(src.shape) if valid is None else valid.ravel().astype(jnp.float32)
    counts = jnp.zeros((num_clusters, num_clusters)).at[src, dst].add(ones)
    return counts / jnp.maximum(counts.sum(axis=1, keepdims=True), 1.0)


@dataclasses.dataclass(frozen=True)
class _ClusterMetric:
    """A round metric that closes over true cluster ids (and attacker flags), hashed by value,
    so runs with the same clusters share one compiled scan."""

    cluster: tuple
    malicious: tuple = ()

    @classmethod
    def of(cls, cluster, malicious=None):
        return cls(tuple(int(c) for c in _checks.cluster_ids("cluster", cluster)),
                   () if malicious is None else tuple(bool(m) for m in np.asarray(malicious).ravel()))

    @property
    def ids(self) -> jax.Array:
        return jnp.asarray(self.cluster, jnp.int32)

    @property
    def num_clusters(self) -> int:
        return max(self.cluster) + 1

    def check_agents(self, name: str, n: int) -> None:
        """One id per agent of the run (``n`` rows of the info; named at trace time, before
        compilation): a longer list would give a silently wrong SR_n and oracle, a shorter one
        would fail in JAX's broadcasting."""
        if len(self.cluster) != n:
            raise ValueError(f"{name}(cluster): cluster holds {len(self.cluster)} ids but the run has {n} agents; "
                             f"give one cluster id per agent")


class _Selection(_ClusterMetric):
    def __call__(self, info) -> dict:
        if not (hasattr(info, "idx") and hasattr(info, "eps")):
            return {}
        self.check_agents("selection", info.idx.shape[0])
        c = self.ids
        valid = getattr(info, "valid", None)
        return {"sr": selection_rate(info.idx, c, valid),
                "sr_oracle": oracle_selection_rate(info.eps, c, info.idx.shape[1]),
                "selection_frequency": selection_frequency(info.idx, c, self.num_clusters, valid)}


class _Purity(_ClusterMetric):
    def __call__(self, info) -> dict:
        if not hasattr(info, "assignment"):
            return {}
        self.check_agents("cluster_purity", info.assignment.shape[0])
        c, k = self.ids, self.num_clusters
        # The estimates renumbered 0, 1, ... in increasing order (the same ties, the same purity):
        # IFCA's estimates run to its k - 1, which may exceed the agents, and the (k, N) table
        # below would otherwise drop the votes for estimates >= N.
        n = info.assignment.shape[0]
        _, a = jnp.unique(info.assignment, return_inverse=True, size=n, fill_value=0)
        a = a.reshape(n)
        votes = jnp.zeros((k, len(self.cluster)), jnp.int32).at[c, a].add(1)  # (true cluster, estimate)
        majority = jnp.argmax(votes, axis=1)
        # Only the ids that occur: an absent id (a gap, {0, 2}) has no agents and no majority.
        absent = jnp.asarray(np.bincount(self.cluster, minlength=k) == 0)
        distinct = jnp.all((majority[:, None] != majority[None, :]) | jnp.eye(k, dtype=bool) | absent[:, None]
                           | absent[None, :])
        return {"cluster_purity": jnp.where(distinct, jnp.mean(a == majority[c]), 0.0)}


def selection(cluster) -> Callable:
    """SR_n, its ε-greedy oracle and the selection frequency by cluster (infos with ``idx`` and ``eps``).

    ``cluster``: integer ids ``>= 0`` (integral floats accepted). The frequency matrix is
    ``(max id + 1)`` square; the row and column of an id no agent has are zeros."""
    return _Selection.of(cluster)


def cluster_purity(cluster) -> Callable:
    """IFCA: share of agents whose estimate is the majority estimate of their true cluster,
    0 when two true clusters share a majority (1.0: clusters recovered up to relabelling).
    Ids no agent has (gaps such as ``{0, 2}``) are not clusters and do not count."""
    return _Purity.of(cluster)


def category_stats(idx: jax.Array, weights: jax.Array, cluster: jax.Array, malicious: jax.Array,
                   valid: jax.Array | None = None):
    """FedCB²O Fig. 5 for one round: ``(frequency (4,), weight (4,))`` in :data:`CATEGORIES` order.

    ``idx``/``weights`` are ``(R, M)`` downloads and their normalised consensus weights of
    the first ``R`` agents (the benign ones). ``frequency[c]`` is the mean over those
    agents of the share of their ``M`` downloads in category ``c``; ``weight[c]`` the mean
    of the total weight those downloads got (the rest, if any, is the agent's own model).
    """
    r = idx.shape[0]
    same = cluster[idx] == cluster[:r, None]
    mal = malicious[idx]
    cats = jnp.stack([same & ~mal, same & mal, ~same & ~mal, ~same & mal])  # (4, R, M)
    if valid is None:
        freq = jnp.mean(jnp.mean(cats, axis=2), axis=1)
    else:  # shares of the filled slots
        freq = jnp.mean(jnp.sum(cats & valid[None], axis=2) / jnp.maximum(jnp.sum(valid, axis=1), 1), axis=1)
    weight = jnp.mean(jnp.sum(jnp.where(cats, weights[None], 0.0), axis=2), axis=1)
    return freq, weight


class _AttackSelection(_ClusterMetric):
    def __call__(self, info) -> dict:
        if not (hasattr(info, "idx") and hasattr(info, "weights")):
            return {}
        nb = len(self.malicious) - sum(self.malicious)
        valid = getattr(info, "valid", None)
        freq, weight = category_stats(info.idx[:nb], info.weights[:nb], self.ids, jnp.asarray(self.malicious, bool),
                                      None if valid is None else valid[:nb])
        return {"benign_train_loss": jnp.mean(info.train_loss[:nb]), "frequency": dict(zip(CATEGORIES, freq)),
                "weight": dict(zip(CATEGORIES, weight)), "self_weight": jnp.mean(info.self_weight[:nb])}


class _AttackLosses(_ClusterMetric):
    def __call__(self, info) -> dict:
        if not (hasattr(info, "idx") and hasattr(info, "loss")):
            return {}
        nb = len(self.malicious) - sum(self.malicious)
        idx, loss = info.idx[:nb], info.loss[:nb]
        valid = getattr(info, "valid", None)
        ok = jnp.isfinite(loss) & (True if valid is None else valid[:nb])
        cluster, mal = self.ids, jnp.asarray(self.malicious, bool)
        same = cluster[idx] == cluster[:nb, None]
        out = {}
        for name, cat in (("benign", same & ~mal[idx]), ("malicious", same & mal[idx])):
            w = cat & ok
            out[name] = jnp.sum(jnp.where(w, loss, 0.0)) / jnp.maximum(jnp.sum(w), 1)  # 0 where none was downloaded
        return {"val_loss_same_cluster": out}


def attack_losses(cluster, malicious) -> Callable:
    """The mean validation loss (``info.loss``: the mean over an agent's validation samples, as
    FedCBO weighs by it) of the benign agents' downloads from their own cluster, by who made
    the download: ``val_loss_same_cluster`` ``{"benign", "malicious"}`` (0 for a group none
    downloaded). Their relative gap is how visible the attack is to the mean loss."""
    return _AttackLosses.of(cluster, malicious)


def attack_selection(cluster, malicious) -> Callable:
    """FedCB²O Fig. 5 per round for the benign agents (infos with ``idx``, ``weights``):
    ``frequency`` and ``weight`` by category, the own model's weight (``self_weight``), and
    their mean local loss (``benign_train_loss``; :func:`round_stats`' ``train_loss`` is
    every agent's)."""
    return _AttackSelection.of(cluster, malicious)
