"""Mutation-testing gaps in the FedCBO memory planner (cbo_jax.federated.memory)."""

import jax.numpy as jnp
import numpy as np

from cbo_jax import models
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.memory import eval_chunk_for_budget


def test_eval_chunk_for_budget_returns_the_largest_candidate_that_fits():
    """``eval_chunk_for_budget`` tries the candidates from the largest down and returns the
    first that fits: with a budget every chunk fits, that is the largest, planned alone (one
    compilation). A mutant trying them smallest first (always returning 1 here) survived the
    default suite (the planner's own test is in the slow step)."""
    rng = np.random.default_rng(0)
    n = 4
    data = AgentData(jnp.asarray(rng.normal(size=(n, 4, 2, 1)), jnp.float32),
                     jnp.asarray(rng.integers(0, 2, (n, 4)), jnp.int32), jnp.full((n,), 4, jnp.int32))
    model = models.mlp_mnist(hidden=(2,), num_classes=2, input_shape=(2, 1))
    cfg = FedCBOConfig(M=2, local=LocalSGDConfig(epochs=1, batch_size=4))
    chunk, plan = eval_chunk_for_budget(model, cfg, data, 2.0**40, candidates=(1, 4, 2))
    assert chunk == 4
    assert list(plan) == [4]
