"""Local training and the MLP over stacked parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cbo_jax import models
from cbo_jax.federated import local
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import LocalSGDConfig, local_train, make_optimizer


def _data(n_agents=3, n_max=20, counts=(20, 13, 5), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n_agents, n_max, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, (n_agents, n_max)).astype(np.int32)
    return jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts, jnp.int32)


def test_mlp_shapes_and_independent_init():
    model = models.mlp_mnist()
    params = models.init_population(model, jax.random.key(0), 4)
    assert params["params"]["Dense_0"]["kernel"].shape == (4, 784, 200)
    assert params["params"]["Dense_1"]["bias"].shape == (4, 10)
    n_params = sum(leaf[0].size for leaf in jax.tree_util.tree_leaves(params))
    assert n_params == 784 * 200 + 200 + 200 * 10 + 10
    k = params["params"]["Dense_0"]["kernel"]
    assert not np.allclose(k[0], k[1])
    logits = jax.vmap(model.apply, in_axes=(0, None))(params, jnp.zeros((5, 28, 28), jnp.uint8))
    assert logits.shape == (4, 5, 10)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_vmapped_training_equals_each_agent_alone():
    model = models.mlp_mnist(hidden=(16,))
    cfg = local.LocalSGDConfig(epochs=2, batch_size=8, lr=0.05, momentum=0.9)
    x, y, counts = _data()
    params = models.init_population(model, jax.random.key(1), 3)
    out = local.local_train(model, cfg, params, None, AgentData(x, y, counts), jax.random.key(2))
    keys = jax.random.split(jax.random.key(2), 3)
    opt = local.make_optimizer(cfg)
    # One agent alone, compiled once for the three agents (same shapes) instead of traced anew for each.
    train_one = jax.jit(lambda p, s, xj, yj, cj, kj: local._train_one(model, cfg, opt, p, s, xj, yj, cj, kj))
    for j in range(3):
        pj = jax.tree_util.tree_map(lambda a: a[j], params)
        ref, _, loss = train_one(pj, opt.init(pj), x[j], y[j], counts[j], keys[j])
        for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(out.params)):
            np.testing.assert_allclose(np.asarray(b[j]), np.asarray(a), rtol=2e-5, atol=2e-6)
        assert float(out.loss[j]) == pytest.approx(float(loss), rel=1e-5)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_matches_plain_optax_loop_on_known_batches():
    """One agent, one epoch, full-size batches: the scan must equal a hand-written optax
    loop over the same permutation (drawn the same way)."""
    model = models.mlp_mnist(hidden=(8,))
    cfg = local.LocalSGDConfig(epochs=1, batch_size=5, lr=0.1, momentum=0.5)
    x, y, counts = _data(1, 12, (12,))
    p0 = jax.tree_util.tree_map(lambda a: a[0], models.init_population(model, jax.random.key(3), 1))
    key = jax.random.key(4)
    opt = local.make_optimizer(cfg)
    got, _, _ = local._train_one(model, cfg, opt, p0, opt.init(p0), x[0], y[0], counts[0], key)
    ekey = jax.random.split(key, 1)[0]
    perm = np.asarray(jnp.argsort(jax.random.uniform(ekey, (12,))))
    p, s = p0, opt.init(p0)
    for start in range(0, 12, 5):
        idx = perm[start : start + 5]
        g = jax.grad(lambda q: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model.apply(q, x[0][idx]), y[0][idx])))(p)
        u, s = opt.update(g, s, p)
        p = optax.apply_updates(p, u)
    for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_padding_rows_never_influence_training():
    model = models.mlp_mnist(hidden=(16,))
    cfg = local.LocalSGDConfig(epochs=3, batch_size=4, lr=0.05)
    x, y, counts = _data()
    params = models.init_population(model, jax.random.key(5), 3)
    a = local.local_train(model, cfg, params, None, AgentData(x, y, counts), jax.random.key(6))
    mask = np.arange(20)[None, :] < np.asarray(counts)[:, None]
    x2 = jnp.where(mask[:, :, None, None], x, 255)
    y2 = jnp.where(mask, y, 9)
    b = local.local_train(model, cfg, params, None, AgentData(x2, y2, counts), jax.random.key(6))
    for la, lb in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_training_reduces_loss_and_optimizer_reset_option():
    model = models.mlp_mnist(hidden=(32,))
    x, y, counts = _data(2, 16, (16, 16))
    params = models.init_population(model, jax.random.key(7), 2)
    before = jax.vmap(lambda p, xi, yi, c: local.agent_loss(model, p, xi, yi, c))(params, x, y, counts)
    cfg = local.LocalSGDConfig(epochs=20, batch_size=8, lr=0.05, momentum=0.9, reset_optimizer=False)
    # Compiled once per opt_state kind (None: a fresh optimizer; a state: the kept one) and reused.
    train = jax.jit(lambda p, s, k: local.local_train(model, cfg, p, s, AgentData(x, y, counts), k))
    out = train(params, None, jax.random.key(8))
    after = jax.vmap(lambda p, xi, yi, c: local.agent_loss(model, p, xi, yi, c))(out.params, x, y, counts)
    assert np.all(np.asarray(after) < 0.5 * np.asarray(before))
    # Kept momentum is carried into the next round; a reset one is not.
    kept = train(out.params, out.opt_state, jax.random.key(9))
    fresh = train(out.params, None, jax.random.key(9))
    assert not np.allclose(np.asarray(jax.tree_util.tree_leaves(kept.params)[0]), np.asarray(jax.tree_util.tree_leaves(fresh.params)[0]))


def test_agent_loss_reductions():
    model = models.mlp_mnist(hidden=(8,))
    x, y, counts = _data(1, 200, (200,))
    p = jax.tree_util.tree_map(lambda a: a[0], models.init_population(model, jax.random.key(0), 1))
    per = np.asarray(optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x[0]), y[0]))
    mean = float(local.agent_loss(model, p, x[0], y[0], 200))
    sobm = float(local.agent_loss(model, p, x[0], y[0], 200, batch_size=128, reduction="sum_of_batch_means"))
    assert mean == pytest.approx(per.mean(), rel=1e-5)
    assert sobm == pytest.approx(per[:128].mean() + per[128:].mean(), rel=1e-5)


def test_agent_chunk_walks_the_agents_with_the_same_training():
    """``agent_chunk=k`` trains k agents at a time (lax.map) instead of all at once (vmap):
    the same random streams and updates, equal up to float32 rounding; an agent without
    samples stays untouched either way."""
    model = models.mlp_mnist(hidden=(6,), num_classes=3, input_shape=(5,))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, 20, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, (4, 20)), jnp.int32)
    counts = jnp.asarray([20, 13, 5, 0], jnp.int32)
    params = models.init_population(model, jax.random.key(1), 4)
    base = local.LocalSGDConfig(epochs=2, batch_size=8, lr=0.05, momentum=0.9)
    ref = local.local_train(model, base, params, None, AgentData(x, y, counts), jax.random.key(2))
    for k in (1, 3):
        cfg = local.LocalSGDConfig(epochs=2, batch_size=8, lr=0.05, momentum=0.9, agent_chunk=k)
        out = local.local_train(model, cfg, params, None, AgentData(x, y, counts), jax.random.key(2))
        for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(out)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(out.params)):
            np.testing.assert_array_equal(np.asarray(b[3]), np.asarray(a[3]))
    with pytest.raises(ValueError, match="agent_chunk"):
        local.LocalSGDConfig(agent_chunk=0)


@pytest.mark.parametrize("kw,match", [({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr"), ({"momentum": 1.0}, "momentum")])
def test_bad_local_config(kw, match):
    with pytest.raises(ValueError, match=match):
        local.LocalSGDConfig(**kw)


@pytest.mark.parametrize("count", [-3, 0, 1, 7, 11, 40])
def test_reduce_sample_losses_mean_over_the_real_samples(count):
    """The mean over the first ``count`` samples (none: 0), against NumPy, for counts below
    0, inside and above the array; padded entries (here inf and NaN) never enter it."""
    per = np.linspace(0.5, 3.0, 11).astype(np.float32)
    real = np.arange(11) < count
    padded = np.where(real, per, np.where(np.arange(11) % 2, np.inf, np.nan)).astype(np.float32)
    got = float(jax.jit(local.reduce_sample_losses)(jnp.asarray(padded), count))
    want = float(per[real].mean()) if real.any() else 0.0
    assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("batch_size", [0, -2, 2.5, None])
def test_sum_of_batch_means_refuses_a_bad_batch_size(batch_size):
    """``batch_size=0`` was a ZeroDivisionError, ``-2`` "num_segments must be non-negative",
    ``2.5`` a TypeError; each is now a ValueError naming ``batch_size``."""
    with pytest.raises(ValueError, match="batch_size"):
        local.reduce_sample_losses(jnp.ones(5), 3, batch_size, "sum_of_batch_means")


def test_local_train_names_params_and_data_of_different_agent_counts():
    """Parameters of 5 agents with data of 4 failed inside vmap ("inconsistent sizes for array
    axes"); the error now names both counts before anything is traced."""
    model = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2,))
    params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 5))
    data = AgentData(jnp.zeros((4, 3, 2)), jnp.zeros((4, 3), jnp.int32), jnp.full((4,), 3, jnp.int32))
    with pytest.raises(ValueError, match="params holds 5 agents but the data 4"):
        local.local_train(model, local.LocalSGDConfig(epochs=1, batch_size=2), params, None, data, jax.random.key(0))


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in local training (cbo_jax.federated.local).

TINY = models.mlp_mnist(hidden=(3,), num_classes=3, input_shape=(2, 2))


@pytest.mark.reference
def test_reset_optimizer_discards_a_given_momentum_state():
    """LocalSGDConfig.reset_optimizer (the FedCBO authors' reference script): every
    round's local SGD starts from a fresh optimizer state, so a carried-over momentum trace
    must not matter: training with a stale state equals training with none. With
    ``reset_optimizer=False`` the stale state is used (the results differ). A mutant that
    ignored the flag whenever a state was passed survived the fast tests (only the pinned
    FedCBO run noticed)."""
    rng = np.random.default_rng(0)
    n = 2
    data = AgentData(jnp.asarray(rng.normal(size=(n, 6, 2, 2)), jnp.float32),
                     jnp.asarray(rng.integers(0, 3, (n, 6)), jnp.int32), jnp.asarray([6, 4], jnp.int32))
    params = models.init_population(TINY, jax.random.key(0), n)
    key = jax.random.key(1)

    def run(reset, stale):
        cfg = LocalSGDConfig(epochs=1, batch_size=3, lr=0.1, momentum=0.9, reset_optimizer=reset)
        state = jax.vmap(make_optimizer(cfg).init)(params)
        if stale:  # a large momentum trace, as left by an earlier round
            state = jax.tree_util.tree_map(lambda a: jnp.full_like(a, 5.0) if jnp.issubdtype(a.dtype, jnp.floating)
                                           else a, state)
        return local_train(TINY, cfg, params, state, data, key).params

    fresh, stale_reset, stale_kept = run(True, False), run(True, True), run(False, True)
    for a, b, c in zip(*(jax.tree_util.tree_leaves(t) for t in (fresh, stale_reset, stale_kept))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
        assert np.max(np.abs(np.asarray(c) - np.asarray(a))) > 1e-2


@pytest.mark.reference
def test_agents_shuffle_with_keys_of_their_own():
    """Agent ``j`` shuffles its mini-batches with its own key ``fold_in(key, j)``
    (:func:`~cbo_jax.federated.local.agent_keys`). Three agents holding the same data and the
    same model (6 samples, batches of 2: the order of the batches matters to SGD with momentum)
    end with three different models, and agent ``j``'s training is the same in a population of
    two as of three. A mutant that gave every agent one key survived the default run (the
    test comparing each agent with its training alone is a slow one)."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(np.broadcast_to(rng.normal(size=(6, 2, 2)), (3, 6, 2, 2)), jnp.float32)
    y = jnp.asarray(np.broadcast_to(rng.integers(0, 3, 6), (3, 6)), jnp.int32)
    one = models.init_population(TINY, jax.random.key(0), 1)
    params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (3,) + a.shape[1:]), one)
    cfg = LocalSGDConfig(epochs=1, batch_size=2, lr=0.5, momentum=0.9)
    train = jax.jit(lambda p, data: local_train(TINY, cfg, p, None, data, jax.random.key(1)).params)
    three = train(params, AgentData(x, y, jnp.full((3,), 6, jnp.int32)))
    two = train(jax.tree_util.tree_map(lambda a: a[:2], params), AgentData(x[:2], y[:2], jnp.full((2,), 6, jnp.int32)))
    flat = np.concatenate([np.asarray(leaf).reshape(3, -1) for leaf in jax.tree_util.tree_leaves(three)], axis=1)
    for i in range(3):
        for j in range(i):
            assert np.max(np.abs(flat[i] - flat[j])) > 1e-3, (i, j)
    for a, b in zip(jax.tree_util.tree_leaves(two), jax.tree_util.tree_leaves(three)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b)[:2], rtol=1e-6, atol=1e-7)
