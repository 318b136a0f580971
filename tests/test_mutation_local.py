"""Mutation-testing gaps in local training (cbo_jax.federated.local)."""

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import models
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.local import LocalSGDConfig, local_train, make_optimizer

TINY = models.mlp_mnist(hidden=(3,), num_classes=3, input_shape=(2, 2))


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
