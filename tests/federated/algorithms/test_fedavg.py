"""FedAvg (cbo_jax.federated.algorithms.fedavg): one server model, averaged by data size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax import population as pop
from cbo_jax.federated.algorithms import AgentData, FedAvgConfig, IFCAConfig, fedavg, ifca
from cbo_jax.federated.local import LocalSGDConfig, local_train

from _reference import f64


TINY = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))


def _tiny_data(n=6, n_max=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 2, 2)).astype(np.float32)
    y = rng.integers(0, 4, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


@pytest.mark.parametrize("name", ["fedavg", "ifca"])
def test_a_diverged_agent_gets_weight_zero_in_the_server_average(name):
    """Agent 3's local training diverges (NaN inputs): its NaN model must not reach the
    server models (0 · NaN = NaN in a plain weighted sum); each server model is the
    count-weighted mean of its finite members, computed here in float64."""
    data = _tiny_data(4)
    data = data._replace(x=data.x.at[3].set(jnp.nan))
    loc = LocalSGDConfig(epochs=2, batch_size=4, momentum=0.0)
    alg = fedavg(TINY, FedAvgConfig(local=loc), 4) if name == "fedavg" else ifca(TINY, IFCAConfig(k=2, local=loc), 4)
    state = alg.init(jax.random.key(0))
    new, info = jax.jit(alg.round)(state, data)
    k_local = jax.random.split(state.key, 3)[2]
    if name == "fedavg":
        servers = jax.tree_util.tree_map(lambda a: a[None], state.params)
        assignment = np.zeros(4, int)
        new_servers = jax.tree_util.tree_map(lambda a: a[None], new.params)
    else:
        servers, assignment, new_servers = state.params, np.asarray(info.assignment), new.params
    trained = local_train(TINY, loc, jax.tree_util.tree_map(lambda a: a[assignment], servers), None, data, k_local)
    finite = np.asarray(pop.tree_isfinite_rows(trained.params))
    assert not finite[3] and finite[:3].all()  # the premise: exactly agent 3 diverged
    counts = np.asarray(data.counts, np.float64)
    for k in range(len(jax.tree_util.tree_leaves(servers)[0])):
        w = counts * ((assignment == k) & finite)
        for got, rows, old in zip(jax.tree_util.tree_leaves(new_servers), jax.tree_util.tree_leaves(trained.params),
                                  jax.tree_util.tree_leaves(servers)):
            if w.sum() == 0:  # nothing finite to average: the server model is kept
                np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(old[k]))
                continue
            rows = np.where(finite.reshape((-1,) + (1,) * (rows.ndim - 1)), np.asarray(rows, np.float64), 0.0)
            want = np.tensordot(w / w.sum(), rows, axes=1)
            np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_fedavg_keeps_its_model_when_every_participant_diverged():
    """FedAvg's server average weighs only finite trained models; when no participant's model
    is usable (all diverged: non-finite inputs make every local model NaN), the server keeps
    its model instead of an average over nothing. A mutant that always took the (empty)
    average survived (the existing test has only one diverged agent)."""
    model = models.logistic_regression(2, 2)
    n = 3
    data = AgentData(jnp.full((n, 4, 2), jnp.inf, jnp.float32), jnp.zeros((n, 4), jnp.int32),
                     jnp.full((n,), 4, jnp.int32))
    alg = fedavg(model, FedAvgConfig(local=LocalSGDConfig(epochs=1, batch_size=2, lr=0.1)), n)
    state = alg.init(jax.random.key(0))
    rng = np.random.default_rng(1)  # a server model away from zero (the logistic model starts at zeros)
    state = state._replace(params=jax.tree_util.tree_map(
        lambda a: jnp.asarray(rng.normal(1.0, 0.5, a.shape), a.dtype), state.params))
    new, _ = jax.jit(alg.round)(state, data)
    for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(state.params)):
        assert np.all(np.isfinite(np.asarray(b))) and np.all(np.asarray(b) != 0)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


LOGREG = models.logistic_regression(3, 2)


def _agents(n=5, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


@pytest.mark.reference
def test_fedavg_server_model_averages_only_the_participants():
    """FedAvg (McMahan et al.; the FedCBO paper's baseline) with partial participation: the
    new global model is ``Σ_{j ∈ G_n} n_j θ_j / Σ_{j ∈ G_n} n_j`` over the locally trained
    models of the agents of ``G_n`` only, ``n_j`` their data sizes. Float64 NumPy reference
    from the round's trained models (recomputed from its key split). A mutant averaging every
    agent was caught only by the pinned FedAvg run (the IFCA form is in test_ifca.py)."""
    from cbo_jax.federated.algorithms.base import broadcast

    n = 6
    data = _agents(n, seed=8)
    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.3, momentum=0.0)
    alg = fedavg(LOGREG, FedAvgConfig(local=loc, participation=0.5), n)
    state = alg.init(jax.random.key(2))
    new, info = jax.jit(alg.round)(state, data)
    _, _, k_local = jax.random.split(state.key, 3)
    trained = f64(jax.jit(lambda p: local_train(LOGREG, loc, broadcast(p, n), None, data, k_local).params)(
        state.params))
    active = np.asarray(info.active)
    assert 0 < active.sum() < n
    w = np.asarray(data.counts, np.float64) * active
    for leaf, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new.params)):
        want = np.tensordot(w / w.sum(), leaf, axes=1)
        assert np.max(np.abs(want - np.tensordot(np.asarray(data.counts) / np.sum(data.counts), leaf, axes=1))) > 1e-4
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
