"""The metrics of a federated run (cbo_jax.federated.metrics)."""

import collections
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated import metrics


TINY = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))


def test_selection_metrics():
    cluster = jnp.asarray([0, 0, 0, 1, 1, 1])
    idx = jnp.asarray([[1, 3], [0, 2], [1, 0], [4, 5], [3, 0], [3, 4]])
    assert float(metrics.selection_rate(idx, cluster)) == pytest.approx(10 / 12)
    assert float(metrics.oracle_selection_rate(0.5, cluster)) == pytest.approx(0.5 + 0.5 * 2 / 5)
    # The ε-greedy draw makes ⌊εM⌋ random picks: the oracle of the draw used (M = 3: 1 of 3, then 0 of 3)
    # (M = 3 against 2 same-cluster peers: capped at 2/3, which a perfect P reaches; the formula gave
    # 2/3 + 1/3 · 2/5 and 1)
    assert float(metrics.oracle_selection_rate(0.5, cluster, 3)) == pytest.approx(2 / 3)
    assert float(metrics.oracle_selection_rate(0.25, cluster, 3)) == pytest.approx(2 / 3)
    assert float(metrics.oracle_selection_rate(0.5, cluster, 2)) == pytest.approx(1 / 2 + 1 / 2 * 2 / 5)
    big = jnp.repeat(jnp.arange(2), 11)  # 10 same-cluster peers of 21 others, M = 10
    assert float(metrics.oracle_selection_rate(0.7, big, 10)) == pytest.approx(0.3 + 0.7 * 10 / 21)  # 0.7 in f32
    # fewer same-cluster peers than downloads: a perfect P reaches (|C(j)| - 1) / M at most (it said 1)
    pairs = jnp.repeat(jnp.arange(4), 2)  # one peer each, M = 3
    assert float(metrics.oracle_selection_rate(0.0, pairs, 3)) == pytest.approx(1 / 3)
    mixed = jnp.asarray([0, 0, 0, 0, 1, 1])  # 3 peers (uncapped at M = 2) and 1 peer (capped at 1/2)
    assert float(metrics.oracle_selection_rate(0.0, mixed, 2)) == pytest.approx((4 * 1.0 + 2 * 0.5) / 6)
    # in the round metric, with the info's M
    Info = collections.namedtuple("Info", "idx eps valid")
    got = metrics.selection(np.asarray(cluster))(Info(idx, jnp.float32(0.5), None))
    assert float(got["sr_oracle"]) == pytest.approx(1 / 2 + 1 / 2 * 2 / 5)  # M = 2: ⌊0.5 · 2⌋ = 1 of 2
    got = metrics.selection(np.asarray(cluster))(Info(idx, jnp.float32(0.4), None))
    assert float(got["sr_oracle"]) == pytest.approx(1.0)  # ⌊0.4 · 2⌋ = 0 random picks (ε itself: 0.76)
    f = np.asarray(metrics.selection_frequency(idx, cluster, 2))
    np.testing.assert_allclose(f, [[5 / 6, 1 / 6], [1 / 6, 5 / 6]])


def test_grouped_test_evaluation_equals_the_per_agent_one():
    """Agents sharing a test set are evaluated together (one product over the shared
    inputs per chunk): the same accuracies as each agent on its own copy of the test set,
    and losses up to float32 summation order; uneven groups, an empty group, test counts."""
    rng = np.random.default_rng(0)
    n, t, size = 9, 4, 12
    params = models.init_population(TINY, jax.random.key(1), n)
    x = jnp.asarray(rng.normal(size=(t, size, 2, 2)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, (t, size)), jnp.int32)
    counts = jnp.asarray([12, 7, 12, 5], jnp.int32)
    test_of = np.asarray([2, 0, 0, 1, 2, 2, 0, 1, 2], np.int32)  # test set 3 has no agent
    groups = tuple(tuple(int(j) for j in np.flatnonzero(test_of == k)) for k in range(t))
    for c in (None, counts):
        acc, loss = metrics._grouped_eval(TINY, 2, groups, params, x, y, c)
        acc_ref, loss_ref = metrics._agent_eval(TINY, 2, params, x, y, c, jnp.asarray(test_of))
        np.testing.assert_array_equal(np.asarray(acc), np.asarray(acc_ref))
        np.testing.assert_allclose(np.asarray(loss), np.asarray(loss_ref), rtol=1e-6)
        # and against NumPy: agent j's accuracy on its own test set
        for j in range(n):
            k = test_of[j]
            m = size if c is None else int(counts[k])
            out = np.asarray(TINY.apply(jax.tree_util.tree_map(lambda a: a[j], params), x[k]))[:m]
            assert abs(float(acc[j]) - np.mean(out.argmax(-1) == np.asarray(y[k])[:m])) < 1e-6


class _Info(NamedTuple):
    active: jax.Array
    train_loss: jax.Array


def test_round_stats_train_loss_is_the_mean_over_the_participants():
    """Every agent trains in the vmapped kernel, but only G_n's training is kept: the
    reported training loss is theirs (it was the mean over every agent)."""
    info = metrics.round_stats(_Info(jnp.asarray([True, False, True, False]), jnp.asarray([1.0, 9.0, 3.0, 9.0])))
    assert float(info["train_loss"]) == 2.0 and int(info["participants"]) == 2
    none = metrics.round_stats(_Info(jnp.zeros(2, bool), jnp.asarray([1.0, 2.0])))
    assert np.isnan(float(none["train_loss"]))  # no participant, no training loss


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in the federated metrics (cbo_jax.federated.metrics).

@pytest.mark.reference
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
    assert float(metrics.selection_rate(idx, cluster, valid)) == pytest.approx(np.mean(per))  # (1 + 1/3 + 1/2) / 3
    all_valid = valid.at[3].set(True)
    per = [np.sum((c[ix[j]] == c[j]) & np.asarray(all_valid)[j]) / np.asarray(all_valid)[j].sum() for j in range(4)]
    assert float(metrics.selection_rate(idx, cluster, all_valid)) == pytest.approx(np.mean(per))


@pytest.mark.reference
def test_pooled_objective_is_the_mean_of_the_devices_mean_losses():
    """FedSGLD's consensus objective (1/N) Σ_i F_i (FedSGLD paper §3, ``F_i`` the mean loss of
    node i): with unequal device sizes it differs from the pooled mean over every training
    sample (``train_loss``). Float64 NumPy reference for a logistic-regression server model;
    a mutant reporting the pooled loss as the objective survived the default suite."""
    from cbo_jax.federated.algorithms.base import AgentData

    model = models.logistic_regression(2, 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 2)).astype(np.float32)
    y = rng.integers(0, 2, (2, 6)).astype(np.int32)
    counts = np.array([6, 1], np.int32)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
                                    model.init(jax.random.key(0)))
    metric = metrics.pooled(model, AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts)), x[:1], y[:1], None)
    out = metric(metrics.Evaluation(1, True, None, "server", jax.tree_util.tree_map(lambda a: a[None], params)))
    logits = np.asarray(jax.vmap(lambda xi: model.apply(params, xi))(jnp.asarray(x)), np.float64)
    per = np.log(np.exp(logits).sum(-1)) - np.take_along_axis(logits, y[..., None], -1)[..., 0]
    real = np.arange(6)[None, :] < counts[:, None]
    device_means = [per[i][real[i]].mean() for i in range(2)]
    assert out["objective"] == pytest.approx(np.mean(device_means), rel=1e-5)
    assert out["train_loss"] == pytest.approx(per[real].mean(), rel=1e-5)
    assert abs(np.mean(device_means) - per[real].mean()) > 1e-3  # the case tells them apart


@pytest.mark.reference
def test_cluster_purity_is_zero_when_two_true_clusters_share_one_estimate():
    """IFCA's cluster purity (metrics.cluster_purity): the share of agents whose estimate is
    their true cluster's majority estimate, but 0 when two true clusters have the same
    majority (one server model for both: nothing was recovered). A mutant dropping that
    rule reported purity 1.0 for a collapsed assignment and survived."""
    class Info(NamedTuple):
        assignment: jnp.ndarray

    purity = metrics.cluster_purity([0, 0, 1, 1])
    collapsed = purity(Info(jnp.asarray([0, 0, 0, 0], jnp.int32)))["cluster_purity"]
    assert float(collapsed) == 0.0
    assert float(purity(Info(jnp.asarray([1, 1, 0, 0], jnp.int32)))["cluster_purity"]) == 1.0
    assert float(purity(Info(jnp.asarray([1, 1, 0, 1], jnp.int32)))["cluster_purity"]) == 0.75
