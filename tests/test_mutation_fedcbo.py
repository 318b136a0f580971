"""Mutation-testing gaps in FedCBO (cbo_jax.federated.algorithms.fedcbo)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, group_loss
from cbo_jax.federated.local import LocalSGDConfig


@pytest.mark.parametrize("reduction", ["mean", "sum_of_batch_means"])
def test_model_by_model_energy_honours_the_loss_reduction(reduction):
    """``eval_by="model"``'s energy L_j(θ) of eq. (19) (``group_loss``) reduces each agent's
    per-sample losses as ``loss_reduction`` says: the mean over its real samples (paper) or
    the reference code's sum over mini-batches of B of each batch's mean. Float64 NumPy
    reduction of the model's per-sample losses; a mutant that always took the mean survived
    the default suite (the by-model-equals-by-agent test for this reduction is slow)."""
    model = models.logistic_regression(3, 2)
    rng = np.random.default_rng(0)
    g, n_max, b = 3, 7, 3
    x = rng.normal(size=(g, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (g, n_max)).astype(np.int32)
    counts = np.array([7, 5, 1], np.int32)
    theta = model.init(jax.random.key(0))
    cfg = FedCBOConfig(M=1, loss_reduction=reduction, local=LocalSGDConfig(batch_size=b))
    got = np.asarray(jax.jit(group_loss(model, cfg))(theta, jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts)))
    for j in range(g):
        per = np.asarray(model.loss(model.apply(theta, jnp.asarray(x[j])), jnp.asarray(y[j])), np.float64)[:counts[j]]
        want = per.mean() if reduction == "mean" else sum(per[s:s + b].mean() for s in range(0, counts[j], b))
        assert got[j] == pytest.approx(want, rel=1e-5)
