"""Per-client accuracy distributions in the test-accuracy metric (issue 62): percentiles and
the worst decile, for agents' own models and for server models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated._eval_metrics import distribution


def test_distribution_against_numpy():
    acc = np.array([50.0, 90, 70, 100, 80, 60, 95, 85, 75, 65, 55])
    d = distribution(acc)
    assert d["test_acc_p10"] == pytest.approx(np.percentile(acc, 10))
    assert d["test_acc_median"] == pytest.approx(75.0) and d["test_acc_p90"] == pytest.approx(np.percentile(acc, 90))
    assert d["test_acc_worst10"] == pytest.approx((50 + 55) / 2)  # ceil(11 / 10) = 2 worst agents


def test_metric_rows_carry_the_distribution():
    """Agents whose constant model is right on a known share of their test set: the metric's
    percentiles are those of the known per-agent accuracies."""
    def apply(p, x):
        return jax.nn.one_hot(jnp.broadcast_to(p["pred"], x.shape[:1]), 3) * 10.0

    model = models.Model(init=lambda k: {"pred": jnp.int32(0)}, apply=apply, name="constant", num_classes=3)
    n, n_test = 10, 20
    test_y = np.zeros((n, n_test), np.int32)
    for j in range(n):
        test_y[j, : 2 * j] = 1  # agent j (always says 0) is right on 20 - 2j of 20
    x = np.zeros((n, 4, 2), np.float32)
    data = fl.FederatedData.from_arrays(x, np.zeros((n, 4), np.int32), test_x=np.zeros((n, n_test, 2), np.float32),
                                        test_y=test_y, test_of=np.arange(n))
    metric = fl.metrics.test_accuracy(model, data)
    out = metric(fl.metrics.Evaluation(1, True, None, "agent", {"pred": jnp.zeros((n,), jnp.int32)}))
    want = 100.0 * (n_test - 2 * np.arange(n)) / n_test
    assert out["test_acc"] == pytest.approx(want.mean())
    assert out["test_acc_p10"] == pytest.approx(np.percentile(want, 10))
    assert out["test_acc_worst10"] == pytest.approx(want.min())
