"""FedProx (Li et al. 2020): μ = 0 is FedAvg, and one full-batch local step is the gradient
step on loss + (μ/2)|θ - x|² (against jax.grad of that objective written out)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.models import masked_loss

MODEL = models.mlp_mnist(hidden=(4,), num_classes=3, input_shape=(2, 2))


def _data(n=4, m=6):
    rng = np.random.default_rng(0)
    return fl.FederatedData.from_arrays(rng.normal(size=(n, m, 2, 2)).astype(np.float32),
                                        rng.integers(0, 3, (n, m)).astype(np.int32))


def _leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(tree)]


def test_mu_zero_is_fedavg():
    data, local = _data(), LocalSGDConfig(epochs=2, batch_size=4, lr=0.1, momentum=0.9)
    a, b = fl.fedprox(MODEL, fl.FedProxConfig(mu=0.0, local=local), 4), fl.fedavg(MODEL, fl.FedAvgConfig(local=local), 4)
    sa, sb = a.init(jax.random.key(1)), b.init(jax.random.key(1))
    for _ in range(2):
        sa, _ = jax.jit(a.round)(sa, data.train)
        sb, _ = jax.jit(b.round)(sb, data.train)
    for x, y in zip(_leaves(sa.params), _leaves(sb.params)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mu", [0.0, 0.5, 5.0])
def test_local_step_minimises_loss_plus_proximal_term(mu):
    data = _data()
    cfg = LocalSGDConfig(epochs=1, batch_size=6, lr=0.1, momentum=0.0)  # one full-batch step
    params = jax.vmap(MODEL.init)(jax.random.split(jax.random.key(2), 4))
    anchor = jax.tree_util.tree_map(lambda a: a + 0.3, params)
    got = local_train(MODEL, cfg, params, None, data.train, jax.random.key(3), prox=(mu, anchor)).params
    for j in range(4):
        p = jax.tree_util.tree_map(lambda a: a[j], params)
        x = jax.tree_util.tree_map(lambda a: a[j], anchor)

        def objective(q):
            sq = sum(jnp.sum((u - v) ** 2) for u, v in zip(jax.tree_util.tree_leaves(q), jax.tree_util.tree_leaves(x)))
            return masked_loss(MODEL, q, data.train.x[j], data.train.y[j]) + 0.5 * mu * sq

        g = jax.grad(objective)(p)
        want = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)
        for u, v in zip(_leaves(want), _leaves(jax.tree_util.tree_map(lambda a: a[j], got))):
            np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-6)


def test_engine_and_bad_config():
    data = _data()
    res = fl.run(fl.fedprox(MODEL, fl.FedProxConfig(mu=0.1, local=LocalSGDConfig(epochs=1, batch_size=4)), 4), data, 2,
                 jax.random.key(0), progress=False)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(res.state.params))
    with pytest.raises(ValueError, match="mu"):
        fl.FedProxConfig(mu=-1.0)
