"""Mutation-testing gaps in the consensus kernel (cbo_jax.federated.aggregation).

Each test checks one branch of :func:`consensus_downloads` against a float64 NumPy reference
on a toy energy (no network), so it runs in well under a second."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated.aggregation import Energy, consensus_downloads


def _toy_energy(models, theta_j, target, own_e):
    """E_j^i = ||θ_i - target_j||², the agent's own energy given as data (own_e)."""
    e = jnp.sum((models["w"] - target[None, :]) ** 2, axis=1)
    return Energy(e, e, own_e, own_e)


@pytest.mark.parametrize("self_largest", [False, True])
def test_include_self_with_self_largest_caps_the_own_energy_at_the_lowest_download(self_largest):
    """FedCB²O reference-code form (FedCB2OConfig.self_largest): with
    ``include_self`` the own model enters eq. (3.13)'s average with energy
    ``min(min_i E_j^i, E_j^own)`` when ``self_largest`` (so it gets the largest weight), else
    with ``E_j^own``. Guards the ``jnp.minimum`` in ``_weigh`` (a mutant dropping it survived
    the default suite)."""
    rng = np.random.default_rng(0)
    n, m, d, alpha = 5, 3, 2, 1.5
    w = rng.normal(size=(n, d))
    target = rng.normal(size=(n, d))
    own_e = np.full(n, 4.0)  # larger than every download's energy below: the cap matters
    idx = np.array([[(j + k + 1) % n for k in range(m)] for j in range(n)])
    params = {"w": jnp.asarray(w, jnp.float32)}
    res = jax.jit(lambda p, t, o: consensus_downloads(
        _toy_energy, p, jnp.asarray(idx, jnp.int32), p, (t, o), alpha=alpha, include_self=True, chunk=2,
        self_largest=self_largest))(params, jnp.asarray(target, jnp.float32), jnp.asarray(own_e, jnp.float32))
    for j in range(n):
        e = np.sum((w[idx[j]] - target[j]) ** 2, axis=1)
        assert e.min() < own_e[j]
        e_self = min(e.min(), own_e[j]) if self_largest else own_e[j]
        all_e = np.append(e, e_self)
        mu = np.exp(-alpha * (all_e - all_e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(res.weights[j]), mu[:-1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(res.self_weight[j]), mu[-1], rtol=1e-5, atol=1e-7)
        ref = mu[:-1] @ w[idx[j]] + mu[-1] * w[j]
        np.testing.assert_allclose(np.asarray(res.consensus["w"][j]), ref, rtol=1e-5, atol=1e-6)
        if self_largest:
            assert float(res.self_weight[j]) >= float(np.max(np.asarray(res.weights[j]))) - 1e-7


def test_model_by_model_consensus_gives_empty_slots_no_weight():
    """consensus_by_model (FedCBO ``eval_by="model"``): a slot with ``valid`` False (fewer
    than M participants, ProbSampling's unfilled slots) holds some other agent and must weigh
    nothing in eq. (19): m_j is the Gibbs average over the filled slots only, as in
    consensus_downloads. Float64 NumPy reference on a toy energy; a mutant dropping the
    ``valid`` mask in this path survived the default suite."""
    from cbo_jax.federated.aggregation import consensus_by_model

    rng = np.random.default_rng(1)
    n, m, d, alpha = 5, 3, 2, 2.0
    w = rng.normal(size=(n, d))
    target = rng.normal(size=(n, d))
    idx = np.array([[(j + k + 1) % n for k in range(m)] for j in range(n)])
    valid = np.ones((n, m), bool)
    valid[0, 1:] = False
    valid[2, 2] = False
    valid[3, 0] = False

    def group_energy(theta, t):  # one model's energy on a group of agents' data
        return jnp.sum((theta["w"][None, :] - t) ** 2, axis=1)

    res = jax.jit(lambda p, t, v: consensus_by_model(group_energy, p, jnp.asarray(idx, jnp.int32), (t,), alpha=alpha,
                                                     group=2, valid=v))(
        {"w": jnp.asarray(w, jnp.float32)}, jnp.asarray(target, jnp.float32), jnp.asarray(valid))
    for j in range(n):
        rows = idx[j][valid[j]]
        e = np.sum((w[rows] - target[j]) ** 2, axis=1)
        mu = np.exp(-alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(res.weights[j])[valid[j]], mu, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(res.weights[j])[~valid[j]], 0.0)
        np.testing.assert_allclose(np.asarray(res.consensus["w"][j]), mu @ w[rows], rtol=1e-5, atol=1e-6)
