"""Metrics of a federated run. These may read the true cluster ids; algorithms may not.

* :func:`evaluate` -- mean test accuracy over agents, as the FedCBO paper reports it:
  for per-agent models (FedCBO, Local), agent ``j``'s own model on its cluster's test
  set; for server models (FedAvg, IFCA), each test distribution uses the server model
  with the smallest loss on it, and agents inherit the accuracy of their cluster's
  distribution.
* :func:`selection_rate` -- SR_n of Remark 6: the mean over agents of the share of
  downloaded agents that belong to the agent's own cluster, and
  :func:`oracle_selection_rate`, its expectation under ε-greedy sampling if every
  greedy pick were right: ``(1 - ε) + ε · (same-cluster share among the others)``.
* :func:`selection_frequency` -- ``(K, K)`` share of downloads from cluster ``b`` by
  agents of cluster ``a``.
* :func:`attack_metrics` -- FedCB²O §4 metrics over the benign agents, each with its own
  model on its cluster's test set: overall accuracy, source-class accuracy and attack
  success rate (share of source-class test images predicted as the target class).
* :func:`category_stats` -- FedCB²O Fig. 5: per round, the share of a benign agent's
  downloads and the total consensus weight they get, by category (same/other cluster ×
  benign/malicious), averaged over benign agents.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax.models import Model, cross_entropy

PyTree = Any

__all__ = ["selection_rate", "oracle_selection_rate", "selection_frequency", "evaluate", "cluster_purity",
           "attack_metrics", "category_stats", "CATEGORIES"]


def selection_rate(idx: jax.Array, cluster: jax.Array) -> jax.Array:
    """SR_n = mean_j #{i in A_n(j) : cluster(i) = cluster(j)} / M."""
    return jnp.mean(cluster[idx] == cluster[:, None])


def oracle_selection_rate(eps, cluster: jax.Array) -> jax.Array:
    """``(1 - ε) + ε · mean_j (|C(j)| - 1) / (N - 1)`` (Remark 6 / Fig. 3)."""
    n = cluster.shape[0]
    sizes = jnp.sum(cluster[:, None] == cluster[None, :], axis=1)
    share = jnp.mean((sizes - 1) / max(n - 1, 1))
    return (1.0 - eps) + eps * share


def selection_frequency(idx: jax.Array, cluster: jax.Array, num_clusters: int) -> jax.Array:
    """``(K, K)``: row a = share of the downloads of cluster-a agents that come from each cluster."""
    src = jnp.broadcast_to(cluster[:, None], idx.shape).ravel()
    dst = cluster[idx].ravel()
    counts = jnp.zeros((num_clusters, num_clusters)).at[src, dst].add(1.0)
    return counts / jnp.maximum(counts.sum(axis=1, keepdims=True), 1.0)


def cluster_purity(assignment: np.ndarray, cluster: np.ndarray) -> float:
    """Share of agents whose estimated cluster is the majority estimate of their true cluster
    and no two true clusters share a majority (1.0: clusters recovered up to relabelling)."""
    assignment, cluster = np.asarray(assignment), np.asarray(cluster)
    majority = {}
    for c in np.unique(cluster):
        vals, cnt = np.unique(assignment[cluster == c], return_counts=True)
        majority[c] = vals[np.argmax(cnt)]
    if len(set(majority.values())) < len(majority):
        return 0.0
    return float(np.mean([assignment[j] == majority[cluster[j]] for j in range(len(cluster))]))


def _acc_loss(model: Model, params, x, y):
    logits = model.apply(params, x)
    return jnp.mean(jnp.argmax(logits, -1) == y), jnp.mean(cross_entropy(logits, y))


def evaluate(model: Model, kind: str, params: PyTree, test_x, test_y, cluster, chunk: int = 8) -> dict:
    """Test accuracy (%) in the paper's convention (see module docstring).

    Args:
      kind, params: from ``algorithm.eval_models(state)``.
      test_x, test_y: ``(K, n_test, ...)`` per-cluster test sets.
      cluster: ``(N,)`` true cluster ids.
      chunk: models evaluated at once (bounds memory).
    """
    test_x, test_y, cluster = jnp.asarray(test_x), jnp.asarray(test_y), jnp.asarray(cluster)
    k = test_x.shape[0]
    if kind == "agent":
        acc, loss = _agent_eval(model, chunk, params, test_x, test_y, cluster)
        per_cluster = [float(jnp.mean(acc[cluster == c])) * 100 for c in range(k)]
        return {"test_acc": float(jnp.mean(acc)) * 100, "test_loss": float(jnp.mean(loss)), "test_acc_per_cluster": per_cluster}
    if kind == "server":
        acc, loss = _server_eval(model, chunk, params, test_x, test_y)  # (R, K)
        best = jnp.argmin(loss, axis=0)
        acc_k = acc[best, jnp.arange(k)]
        loss_k = loss[best, jnp.arange(k)]
        agents = jnp.bincount(cluster, length=k).astype(jnp.float32)
        return {
            "test_acc": float(jnp.sum(acc_k * agents) / jnp.sum(agents)) * 100,
            "test_loss": float(jnp.sum(loss_k * agents) / jnp.sum(agents)),
            "test_acc_per_cluster": [float(a) * 100 for a in acc_k],
            "server_model_per_cluster": [int(b) for b in best],
        }
    raise ValueError(f"kind must be 'agent' or 'server', got {kind!r}")


def _agent_eval_impl(model, chunk, params, test_x, test_y, cluster):
    def one(args):
        p, c = args
        return _acc_loss(model, p, test_x[c], test_y[c])

    return jax.lax.map(one, (params, cluster), batch_size=chunk)


def _server_eval_impl(model, chunk, params, test_x, test_y):
    def one(p):
        return jax.vmap(lambda x, y: _acc_loss(model, p, x, y))(test_x, test_y)

    return jax.lax.map(one, params, batch_size=chunk)


_agent_eval = jax.jit(_agent_eval_impl, static_argnums=(0, 1))
_server_eval = jax.jit(_server_eval_impl, static_argnums=(0, 1))


# --- attacks (FedCB²O) -----------------------------------------------------------------------

CATEGORIES = ("same_benign", "same_malicious", "other_benign", "other_malicious")


def category_stats(idx: jax.Array, weights: jax.Array, cluster: jax.Array, malicious: jax.Array):
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
    freq = jnp.mean(jnp.mean(cats, axis=2), axis=1)
    weight = jnp.mean(jnp.sum(jnp.where(cats, weights[None], 0.0), axis=2), axis=1)
    return freq, weight


def _attack_eval_impl(model, chunk, test_batch, params, test_x, test_y, cluster, source, target):
    n_test = test_x.shape[1]
    nbat = -(-n_test // test_batch)
    pad = nbat * test_batch - n_test
    xs = jnp.pad(test_x, [(0, 0), (0, pad)] + [(0, 0)] * (test_x.ndim - 2))
    real = jnp.arange(nbat * test_batch) < n_test
    ys = jnp.pad(test_y, [(0, 0), (0, pad)])

    def one(args):
        p, c = args
        x = xs[c].reshape((nbat, test_batch) + xs.shape[2:])
        pred = jax.lax.map(lambda xb: jnp.argmax(model.apply(p, xb), axis=-1), x).reshape(-1)
        y = ys[c]
        src = (y == source) & real
        n_src = jnp.maximum(jnp.sum(src), 1)
        return (jnp.sum((pred == y) & real) / n_test, jnp.sum((pred == y) & src) / n_src,
                jnp.sum((pred == target) & src) / n_src)

    return jax.lax.map(one, (params, cluster), batch_size=chunk)


_attack_eval = jax.jit(_attack_eval_impl, static_argnums=(0, 1, 2))


def attack_metrics(model: Model, params: PyTree, test_x, test_y, cluster, source: int, target: int, chunk: int = 8,
                   test_batch: int = 2000) -> dict:
    """Overall accuracy, source-class accuracy and attack success rate (%), means over agents.

    Args:
      params: the benign agents' models ``(N_b, ...)``.
      test_x, test_y: ``(K, n_test, ...)`` per-cluster test sets.
      cluster: ``(N_b,)`` the benign agents' clusters.
      source, target: the attack's classes.
      chunk, test_batch: agents evaluated at once, test images per forward pass.
    """
    test_x, test_y, cluster = jnp.asarray(test_x), jnp.asarray(test_y), jnp.asarray(cluster)
    tb = int(min(test_batch, test_x.shape[1]))
    acc, src, asr = _attack_eval(model, chunk, tb, params, test_x, test_y, cluster, jnp.int32(source), jnp.int32(target))
    k = test_x.shape[0]
    out = {"overall_acc": float(jnp.mean(acc)) * 100, "source_acc": float(jnp.mean(src)) * 100,
           "asr": float(jnp.mean(asr)) * 100}
    for name, v in (("overall_acc", acc), ("source_acc", src), ("asr", asr)):
        out[f"{name}_per_cluster"] = [float(jnp.mean(v[cluster == c])) * 100 if bool(jnp.any(cluster == c)) else None
                                      for c in range(k)]
    return out
