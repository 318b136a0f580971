"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1): the corrected local step against jax.grad, one round
against a float64 NumPy reference of option II and the server update (unequal sample counts, so unequal
numbers of local steps, and partial participation), and option II's control variate recovering the
gradient exactly where it is constant (with and without momentum)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated.algorithms.base import AgentData, broadcast
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.models import masked_loss

MODEL = models.mlp_mnist(hidden=(4,), num_classes=3, input_shape=(2, 2))
COUNTS = np.array([6, 5, 3, 6, 4])


def _data(n=5, m=6, counts=COUNTS):
    rng = np.random.default_rng(0)
    return fl.FederatedData.from_arrays(rng.normal(size=(n, m, 2, 2)).astype(np.float32),
                                        rng.integers(0, 3, (n, m)).astype(np.int32), counts=counts)


def _leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(tree)]


def _random_like(tree, seed, scale=0.1):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda a: jnp.asarray(scale * rng.normal(size=a.shape), a.dtype), tree)


def _steps(epochs, batch, counts, beta):
    """Heavy-ball weight sum over K = epochs · ceil(n / B) steps, by its definition (a loop)."""
    out = []
    for n in counts:
        k = epochs * math.ceil(n / batch)
        out.append(sum(sum(beta ** s for s in range(t)) for t in range(1, k + 1)))
    return np.array(out, np.float64)


def test_correction_is_added_to_every_gradient():
    data = _data()
    params = jax.vmap(MODEL.init)(jax.random.split(jax.random.key(2), 5))
    one = LocalSGDConfig(epochs=1, batch_size=6, lr=0.1, momentum=0.0)  # one full-batch step
    train = jax.jit(lambda p, c: local_train(MODEL, one, p, None, data.train, jax.random.key(3), correction=c).params)
    plain = local_train(MODEL, one, params, None, data.train, jax.random.key(3)).params
    for a, b in zip(_leaves(plain), _leaves(train(params, jax.tree_util.tree_map(jnp.zeros_like, params)))):
        np.testing.assert_array_equal(a, b)
    corr = _random_like(params, 4)
    got = train(params, corr)
    mask = jnp.arange(6)[None] < COUNTS[:, None]
    g = jax.vmap(jax.grad(lambda q, x, y, m: masked_loss(MODEL, q, x, y, m)))(params, data.train.x, data.train.y, mask)
    want = jax.tree_util.tree_map(lambda a, b, c: a - 0.1 * (b + c), params, g, corr)
    for u, v in zip(_leaves(want), _leaves(got)):
        np.testing.assert_allclose(v, u, rtol=1e-5, atol=1e-6)


def test_one_round_against_numpy(momentum=0.9):  # momentum: W_j, not K_j (the constant-gradient test has both)
    data = _data()
    local = LocalSGDConfig(epochs=2, batch_size=4, lr=0.05, momentum=momentum)
    alg = fl.scaffold(MODEL, fl.ScaffoldConfig(server_lr=0.7, participation=0.6, local=local), 5)
    s0 = alg.init(jax.random.key(7))
    s0 = s0._replace(control=_random_like(s0.control, 1), client_control=_random_like(s0.client_control, 2))
    s1, info = jax.jit(alg.round)(s0, data.train)
    active = np.asarray(info.active)
    assert 0 < active.sum() < 5 and not np.asarray(info.diverged).any()
    _, _, k_local = jax.random.split(s0.key, 3)
    corr = jax.tree_util.tree_map(lambda c, ci: c[None] - ci, s0.control, s0.client_control)
    y = _leaves(local_train(MODEL, local, broadcast(s0.params, 5), None, data.train, k_local, correction=corr).params)
    k = _steps(2, 4, COUNTS, momentum)
    for x0, c0, ci0, yl, x1, c1, ci1 in zip(_leaves(s0.params), _leaves(s0.control), _leaves(s0.client_control), y,
                                            _leaves(s1.params), _leaves(s1.control), _leaves(s1.client_control)):
        shape = (-1,) + (1,) * x0.ndim
        ci_new = np.where(active.reshape(shape), ci0 - c0 + (x0 - yl) / (k.reshape(shape) * 0.05), ci0)
        np.testing.assert_allclose(ci1, ci_new, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(x1, x0 + 0.7 * (yl[active] - x0).mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c1, c0 + (ci_new - ci0).sum(0) / 5, rtol=1e-4, atol=1e-5)
    assert alg.name == "scaffold" and alg.eval_models(s1)[0] == "server"


def _linear_model():
    """Loss x·w · y per sample: its gradient x·y does not depend on w, nor on the batch where an agent's
    samples are all equal."""
    return models.Model(lambda key: {"w": jnp.zeros(3)}, lambda p, x: x @ p["w"], "linear", None,
                        loss=lambda out, y: out * y)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_option_two_recovers_a_constant_gradient(momentum):
    counts = np.array([6, 5, 3, 1])  # B = 2: 3, 3, 2 and 1 steps per epoch
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(4, 1, 3)).astype(np.float32)
    ys = rng.normal(size=(4, 1)).astype(np.float32)
    data = AgentData(jnp.asarray(np.repeat(xs, 6, 1)), jnp.asarray(np.repeat(ys, 6, 1)), jnp.asarray(counts))
    local = LocalSGDConfig(epochs=2, batch_size=2, lr=0.1, momentum=momentum)
    alg = fl.scaffold(_linear_model(), fl.ScaffoldConfig(local=local), 4)
    s0 = alg.init(jax.random.key(0))
    s0 = s0._replace(control=_random_like(s0.control, 5, 1.0), client_control=_random_like(s0.client_control, 6, 1.0))
    s1, _ = jax.jit(alg.round)(s0, data)
    grad = xs[:, 0, :] * ys  # (4, 3): each agent's constant gradient
    np.testing.assert_allclose(np.asarray(s1.client_control["w"]), grad, rtol=1e-4, atol=1e-5)
    c_want = np.asarray(s0.control["w"], np.float64) + (grad - np.asarray(s0.client_control["w"])).mean(0)
    np.testing.assert_allclose(np.asarray(s1.control["w"]), c_want, rtol=1e-5, atol=1e-5)
    x = np.asarray(s0.params["w"], np.float64)  # every agent moved by lr · S_j · (g_j - c_j + c)
    drift = (grad - np.asarray(s0.client_control["w"]) + np.asarray(s0.control["w"])[None])
    moved = -0.1 * _steps(2, 2, counts, momentum)[:, None] * drift
    np.testing.assert_allclose(np.asarray(s1.params["w"]), x + moved.mean(0), rtol=1e-4, atol=1e-4)


def test_first_round_with_equal_counts_is_fedavg_and_c_stays_the_mean():
    data = _data(counts=None)
    local = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0)
    alg, avg = fl.scaffold(MODEL, fl.ScaffoldConfig(local=local), 5), fl.fedavg(MODEL, fl.FedAvgConfig(local=local), 5)
    s, a = alg.init(jax.random.key(1)), avg.init(jax.random.key(1))
    s, _ = jax.jit(alg.round)(s, data.train)  # zero control variates: FedAvg's local training and mean
    a, _ = jax.jit(avg.round)(a, data.train)
    for x, y in zip(_leaves(s.params), _leaves(a.params)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    s, _ = jax.jit(alg.round)(s, data.train)
    for c, ci in zip(_leaves(s.control), _leaves(s.client_control)):
        np.testing.assert_allclose(c, ci.mean(0), rtol=1e-5, atol=1e-6)


def test_diverged_agent_gets_weight_zero_and_keeps_its_control():
    data = _data()
    x = np.array(data.train.x)
    x[1, 0] = np.nan
    train = data.train._replace(x=jnp.asarray(x))
    alg = fl.scaffold(MODEL, fl.ScaffoldConfig(local=LocalSGDConfig(epochs=1, batch_size=4, momentum=0.0)), 5)
    s1, info = jax.jit(alg.round)(alg.init(jax.random.key(0)), train)
    assert np.asarray(info.diverged).tolist() == [False, True, False, False, False]
    for leaf in _leaves(s1.params) + _leaves(s1.control) + _leaves(s1.client_control):
        assert np.isfinite(leaf).all()
    for ci in _leaves(s1.client_control):
        assert (ci[1] == 0).all() and (ci[0] != 0).any()


def test_engine_and_bad_config():
    data = _data()
    res = fl.run(fl.scaffold(MODEL, fl.ScaffoldConfig(local=LocalSGDConfig(epochs=1, batch_size=4)), 5), data, 2,
                 jax.random.key(0), progress=False)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(res.state.params))
    with pytest.raises(ValueError, match="server_lr"):
        fl.ScaffoldConfig(server_lr=0.0)
