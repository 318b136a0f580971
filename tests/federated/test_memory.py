"""Memory planning for FedCBO rounds (cbo_jax.federated.memory)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.data import FederatedData
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.memory import eval_chunk_for_budget


@pytest.mark.parametrize("size", [4, 0, 8.0])
def test_planned_round_bytes_refuses_a_size_below_n(size):
    """``size`` below N cut the planned state and data to that many agents (a plan for half
    the run at size=N/2), and ``size=0`` was silently taken as N."""
    from cbo_jax.federated.memory import planned_round_bytes

    data = AgentData(jnp.zeros((8, 3, 2)), jnp.zeros((8, 3), jnp.int32), jnp.full((8,), 3, jnp.int32))
    alg = fedcbo(models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2,)), FedCBOConfig(M=2), 8)
    with pytest.raises(ValueError, match="size must be an integer >= N=8"):
        planned_round_bytes(alg, data, size=size)


def _two_cluster_data(n_per=6, n=40, seed=0):
    """Two clusters with opposite labelling rules on 2-D inputs: trivially separable."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2 * n_per, n, 2, 1)).astype(np.float32)
    cluster = np.repeat([0, 1], n_per)
    y = (x[:, :, 0, 0] > 0).astype(np.int32)
    y[cluster == 1] = 1 - y[cluster == 1]
    tx = rng.normal(size=(2, 200, 2, 1)).astype(np.float32)
    ty = np.stack([(tx[0, :, 0, 0] > 0), (tx[1, :, 0, 0] <= 0)]).astype(np.int32)
    return FederatedData(x, y, np.full(2 * n_per, n, np.int32), cluster.astype(np.int32), tx, ty)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_eval_chunk_for_memory_budget():
    from cbo_jax.federated.memory import eval_chunk_for_budget, planned_round_bytes

    data = _two_cluster_data(n_per=4, n=12).train
    model = models.mlp_mnist(hidden=(64,), num_classes=2, input_shape=(2, 1))
    cfg = FedCBOConfig(M=6, local=LocalSGDConfig(epochs=1, batch_size=6))
    # eval_chunk=4 is planned once (inside eval_chunk_for_budget), not twice: each plan compiles a round.
    sizes = {1: planned_round_bytes(fedcbo(model, dataclasses.replace(cfg, eval_chunk=1), 8), data)}
    chunk, plan = eval_chunk_for_budget(model, cfg, data, sizes[1], candidates=(4, 1))
    assert list(plan) == [4, 1]  # tried from the largest down
    sizes[4] = plan[4]
    assert sizes[4] > sizes[1]  # bigger chunks plan more memory
    assert chunk == 1 and plan == sizes  # the largest chunk that fits
    with pytest.raises(ValueError, match="even with eval_chunk=1"):
        eval_chunk_for_budget(model, cfg, data, 1024, candidates=(1,))
    by_model = dataclasses.replace(cfg, eval_by="model", eval_chunk=3)  # a group size, kept as given
    chunk, plan = eval_chunk_for_budget(model, by_model, data, 2 * sizes[4], candidates=(4, 1))
    assert chunk == 3 and list(plan) == [3]


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in the FedCBO memory planner (cbo_jax.federated.memory).

@pytest.mark.reference
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
