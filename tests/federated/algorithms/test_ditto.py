"""Ditto (Li et al. 2021): one round is FedAvg's global update and, per agent, local SGD of the
personal model with the proximal pull to the round's global model."""

import jax
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated.algorithms.base import broadcast
from cbo_jax.federated.local import LocalSGDConfig, local_train

MODEL = models.mlp_mnist(hidden=(4,), num_classes=3, input_shape=(2, 2))
LOCAL = LocalSGDConfig(epochs=2, batch_size=4, lr=0.1, momentum=0.9)


def _data(n=4, m=6):
    rng = np.random.default_rng(0)
    return fl.FederatedData.from_arrays(rng.normal(size=(n, m, 2, 2)).astype(np.float32),
                                        rng.integers(0, 3, (n, m)).astype(np.int32), counts=np.array([6, 5, 3, 6]))


def _leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_one_round(lam):
    data = _data()
    alg = fl.ditto(MODEL, fl.DittoConfig(lam=lam, local=LOCAL), 4)
    s0 = alg.init(jax.random.key(5))
    s1, info = jax.jit(alg.round)(s0, data.train)
    _, _, k_local, k_pers = jax.random.split(s0.key, 4)
    start = broadcast(s0.params, 4)
    trained = local_train(MODEL, LOCAL, start, None, data.train, k_local).params
    w = np.asarray(data.counts, np.float64) / data.counts.sum()
    for got, t in zip(_leaves(s1.params), _leaves(trained)):
        np.testing.assert_allclose(got, np.tensordot(w, t, axes=1), rtol=1e-5, atol=1e-6)
    personal = local_train(MODEL, LOCAL, s0.personal, None, data.train, k_pers, prox=(lam, start)).params
    for got, want in zip(_leaves(s1.personal), _leaves(personal)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert alg.eval_models(s1)[0] == "agent"


def test_engine_and_bad_config():
    data = _data()
    res = fl.run(fl.ditto(MODEL, fl.DittoConfig(local=LOCAL), 4), data, 2, jax.random.key(0), progress=False,
                 metrics=[fl.metrics.test_accuracy(MODEL, data.__class__.from_arrays(
                     np.asarray(data.x), np.asarray(data.y), test_x=np.asarray(data.x[0]), test_y=np.asarray(data.y[0])))])
    assert "test_acc_worst10" in res.history[-1]
    with pytest.raises(ValueError, match="lam"):
        fl.DittoConfig(lam=-1.0)
