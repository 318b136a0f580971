"""Mutation-testing gaps in the federated metrics (cbo_jax.federated.metrics)."""

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated import metrics as fm


def test_selection_rate_divides_by_the_filled_slots_of_each_agent():
    """FedCBO Remark 6: SR_n = mean_j #{i ∈ A_n(j) : cluster(i) = cluster(j)} / |A_n(j)|, with
    |A_n(j)| the downloads agent j actually made (ProbSampling or a small G_n leaves slots
    empty). A row with one filled slot that hits its cluster scores 1, not 1/M; a mutant
    dividing by M survived (the existing case's partial row scored 0 either way)."""
    cluster = jnp.asarray([0, 0, 1, 1])
    idx = jnp.asarray([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 0, 1]])
    valid = jnp.asarray([[True, False, False], [True, True, True], [True, True, False], [False, False, False]])
    c, v, ix = np.asarray(cluster), np.asarray(valid), np.asarray(idx)
    per = [np.sum((c[ix[j]] == c[j]) & v[j]) / v[j].sum() for j in range(4) if v[j].any()]
    assert float(fm.selection_rate(idx, cluster, valid)) == pytest.approx(np.mean(per))  # (1 + 1/3 + 1/2) / 3
    all_valid = valid.at[3].set(True)
    per = [np.sum((c[ix[j]] == c[j]) & np.asarray(all_valid)[j]) / np.asarray(all_valid)[j].sum() for j in range(4)]
    assert float(fm.selection_rate(idx, cluster, all_valid)) == pytest.approx(np.mean(per))


def test_pooled_objective_is_the_mean_of_the_devices_mean_losses():
    """FedSGLD's consensus objective (1/N) Σ_i F_i (FedSGLD paper §3, ``F_i`` the mean loss of
    node i): with unequal device sizes it differs from the pooled mean over every training
    sample (``train_loss``). Float64 NumPy reference for a logistic-regression server model;
    a mutant reporting the pooled loss as the objective survived the default suite."""
    import jax

    from cbo_jax import models
    from cbo_jax.federated.algorithms.base import AgentData

    model = models.logistic_regression(2, 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 2)).astype(np.float32)
    y = rng.integers(0, 2, (2, 6)).astype(np.int32)
    counts = np.array([6, 1], np.int32)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
                                    model.init(jax.random.key(0)))
    metric = fm.pooled(model, AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts)), x[:1], y[:1], None)
    out = metric(fm.Evaluation(1, True, None, "server", jax.tree_util.tree_map(lambda a: a[None], params)))
    logits = np.asarray(jax.vmap(lambda xi: model.apply(params, xi))(jnp.asarray(x)), np.float64)
    per = np.log(np.exp(logits).sum(-1)) - np.take_along_axis(logits, y[..., None], -1)[..., 0]
    real = np.arange(6)[None, :] < counts[:, None]
    device_means = [per[i][real[i]].mean() for i in range(2)]
    assert out["objective"] == pytest.approx(np.mean(device_means), rel=1e-5)
    assert out["train_loss"] == pytest.approx(per[real].mean(), rel=1e-5)
    assert abs(np.mean(device_means) - per[real].mean()) > 1e-3  # the case tells them apart


def test_cluster_purity_is_zero_when_two_true_clusters_share_one_estimate():
    """IFCA's cluster purity (metrics.cluster_purity): the share of agents whose estimate is
    their true cluster's majority estimate, but 0 when two true clusters have the same
    majority (one server model for both: nothing was recovered). A mutant dropping that
    rule reported purity 1.0 for a collapsed assignment and survived."""
    from typing import NamedTuple

    class Info(NamedTuple):
        assignment: jnp.ndarray

    purity = fm.cluster_purity([0, 0, 1, 1])
    collapsed = purity(Info(jnp.asarray([0, 0, 0, 0], jnp.int32)))["cluster_purity"]
    assert float(collapsed) == 0.0
    assert float(purity(Info(jnp.asarray([1, 1, 0, 0], jnp.int32)))["cluster_purity"]) == 1.0
    assert float(purity(Info(jnp.asarray([1, 1, 0, 1], jnp.int32)))["cluster_purity"]) == 0.75
