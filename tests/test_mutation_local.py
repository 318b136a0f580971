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
