"""FedAdam and FedYogi (Reddi et al. 2021): one round against a float64 NumPy reference of
optax's update on FedAvg's pseudo-gradient, and FedOpt with server SGD at lr 1 is FedAvg."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated.local import LocalSGDConfig

MODEL = models.mlp_mnist(hidden=(4,), num_classes=3, input_shape=(2, 2))
LOCAL = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0)


def _data(n=5, m=6):
    rng = np.random.default_rng(0)
    return fl.FederatedData.from_arrays(rng.normal(size=(n, m, 2, 2)).astype(np.float32),
                                        rng.integers(0, 3, (n, m)).astype(np.int32), counts=np.arange(2, 2 + n))


def _leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(tree)]


def _numpy_step(server, x0, avg, lr, b1, b2, eps, rounds_g):
    """optax's adam / yogi for one step from the initial state, in float64."""
    out = []
    for x, a in zip(x0, avg):
        g = x - a
        if server == "adam":
            m, v = (1 - b1) * g, (1 - b2) * g * g
        else:
            m0 = v0 = np.full_like(g, 1e-6)
            m = b1 * m0 + (1 - b1) * g
            v = v0 - (1 - b2) * np.sign(v0 - g * g) * g * g
        mhat, vhat = m / (1 - b1), v / (1 - b2)
        out.append(x - lr * mhat / (np.sqrt(vhat) + eps))
    return out


@pytest.mark.parametrize("server", ["adam", "yogi"])
def test_one_round_is_optax_on_fedavgs_pseudo_gradient(server):
    data = _data()
    cfg = fl.FedOptConfig(server_lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, local=LOCAL)
    alg = (fl.fedadam if server == "adam" else fl.fedyogi)(MODEL, cfg, data.num_agents)
    avg_alg = fl.fedavg(MODEL, fl.FedAvgConfig(local=LOCAL), data.num_agents)
    key = jax.random.key(3)
    s0, a0 = alg.init(key), avg_alg.init(key)
    for x, y in zip(_leaves(s0.params), _leaves(a0.params)):
        np.testing.assert_array_equal(x, y)  # the same initial model for a key
    s1, _ = jax.jit(alg.round)(s0, data.train)
    a1, _ = jax.jit(avg_alg.round)(a0, data.train)  # FedAvg's new model is the weighted average
    want = _numpy_step(server, _leaves(s0.params), _leaves(a1.params), 0.05, 0.9, 0.99, 1e-3, 1)
    for got, w in zip(_leaves(s1.params), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    assert alg.name == f"fed{server}"


def test_server_sgd_at_lr_one_is_fedavg():
    data = _data()
    alg = fl.fedopt(MODEL, fl.FedOptConfig(server="sgd", server_lr=1.0, local=LOCAL), data.num_agents)
    avg_alg = fl.fedavg(MODEL, fl.FedAvgConfig(local=LOCAL), data.num_agents)
    key = jax.random.key(0)
    s, a = alg.init(key), avg_alg.init(key)
    for _ in range(2):
        s, _ = alg.round(s, data.train)
        a, _ = avg_alg.round(a, data.train)
    for x, y in zip(_leaves(s.params), _leaves(a.params)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_runs_in_the_engine():
    data = _data()
    res = fl.run(fl.fedyogi(MODEL, fl.FedOptConfig(local=LOCAL), data.num_agents), data, 3, jax.random.key(0),
                 progress=False)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(res.state.params))


@pytest.mark.parametrize("kw, match", [({"server": "adagrad"}, "server"), ({"beta1": 1.0}, "beta1"),
                                       ({"tau": 0.0}, "tau"), ({"server_lr": -1.0}, "server_lr")])
def test_bad_config_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        fl.FedOptConfig(**kw)
