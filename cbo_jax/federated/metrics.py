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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax.models import Model, cross_entropy

PyTree = Any

__all__ = ["selection_rate", "oracle_selection_rate", "selection_frequency", "evaluate", "cluster_purity"]


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
