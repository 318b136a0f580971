"""Mutation-testing gaps in FedSGLD / FedPD (cbo_jax.federated.algorithms.fedsgld)."""

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import models
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.fedsgld import FedSGLDConfig, fedsgld
from cbo_jax.federated.langevin import SGLDConfig
from cbo_jax.federated.padding import Layout


def test_server_average_is_over_the_real_nodes_only():
    """FedSGLD Algorithm 1: x0^new = (1/N) Σ_i x0_i^+ over the N real nodes. Inactive
    padding agents (AgentData.valid False, as a sharded run appends) send a zero message and
    must not enter the mean: the padded round's server model equals the unpadded one. A
    mutant dividing by all rows survived the default suite (the padded-vs-unpadded contract
    test of FedSGLD runs only in the slow step)."""
    model = models.logistic_regression(3, 2)
    rng = np.random.default_rng(0)
    n = 3
    data = AgentData(jnp.asarray(rng.normal(size=(n, 5, 3)), jnp.float32),
                     jnp.asarray(rng.integers(0, 2, (n, 5)), jnp.int32), jnp.asarray([5, 4, 3], jnp.int32))
    oracle = SGLDConfig(steps=2, burn_in=1, lr=0.1, noise=0.0, clip_norm=None, sampling_rate=1.0)
    alg = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=2.0), n)
    state = alg.init(jax.random.key(0))
    round_fn = jax.jit(alg.round)
    plain, _ = round_fn(state, data)
    lay = Layout(n, n + 2)
    padded, _ = round_fn(lay.pad_state(state), lay.pad_data(data))
    for a, b in zip(jax.tree_util.tree_leaves(plain.server), jax.tree_util.tree_leaves(padded.server)):
        assert np.max(np.abs(np.asarray(a))) > 1e-3
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
