"""IFCA (cbo_jax.federated.algorithms.ifca): cluster estimates by the lowest loss, server models averaged by cluster."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax import population as pop
from cbo_jax.federated import metrics, run
from cbo_jax.federated.algorithms import FedCBOConfig, IFCAConfig, fedcbo, ifca
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.data import FederatedData
from cbo_jax.federated.local import LocalSGDConfig, local_train

from _reference import logreg_loss


def _run(alg, model, data, rounds, key, **kw):
    kw.setdefault("progress", False)
    rms = [metrics.round_stats, metrics.selection(data.cluster), metrics.cluster_purity(data.cluster)]
    return run(alg, data, rounds, key, round_metrics=rms, metrics=[metrics.test_accuracy(model, data)], **kw)


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
def test_ifca_recovers_true_clusters_and_fedcbo_selects_own_cluster():
    data = _two_cluster_data()
    model = models.mlp_mnist(hidden=(8,), num_classes=2, input_shape=(2, 1))
    loc = LocalSGDConfig(epochs=2, batch_size=10, lr=0.1, momentum=0.5)
    alg = ifca(model, IFCAConfig(k=2, local=loc), 12)
    res = _run(alg, model, data, 10, jax.random.key(0), every=5)
    assert res.summary["final_cluster_purity"] == 1.0
    assert res.summary["final_test_acc"] > 90
    cfg = FedCBOConfig(M=4, alpha=10.0, eps0=0.3, eps_decay=0.05, eps_min=0.0, local=loc)
    alg = fedcbo(model, cfg, 12)
    res = _run(alg, model, data, 12, jax.random.key(1), every=6)
    assert res.summary["final_sr"] > 0.9 and res.summary["final_test_acc"] > 90
    freq = np.asarray(res.history[-1]["selection_frequency"])
    assert freq[0, 0] > 0.9 and freq[1, 1] > 0.9


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in the baselines (cbo_jax.federated.algorithms.ifca).

@pytest.mark.reference
def test_ifca_server_models_average_only_the_participants():
    """IFCA (Ghosh et al.; the FedCBO paper's baseline) with partial participation: server
    model k becomes the data-size-weighted mean of the locally trained models of the agents
    of G_n whose estimate is k; a model no participant chose is kept. Float64 NumPy reference
    from the round's trained models (recomputed from its key split). The pinned IFCA run has
    full participation, where a mutant averaging the non-participants too survived."""
    model = models.logistic_regression(2, 2)
    rng = np.random.default_rng(0)
    n = 6
    data = AgentData(jnp.asarray(rng.normal(size=(n, 5, 2)), jnp.float32),
                     jnp.asarray(rng.integers(0, 2, (n, 5)), jnp.int32), jnp.asarray([5, 3, 4, 2, 5, 1], jnp.int32))
    local = LocalSGDConfig(epochs=1, batch_size=2, lr=0.2, momentum=0.0)
    alg = ifca(model, IFCAConfig(k=2, participation=0.5, local=local), n)
    state = alg.init(jax.random.key(3))
    new, info = jax.jit(alg.round)(state, data)
    active = np.asarray(info.active)
    assert 0 < active.sum() < n
    _check_server_models(model, local, state, new, data, np.asarray(info.assignment), active)


def _check_server_models(model, local, state, new, data, assignment, active):
    """IFCA's server model k after a round: the data-size-weighted mean of the models the
    active agents with estimate k trained from server model ``assignment[j]`` (retrained
    here with the round's own key split), or the model before the round when no active
    agent chose it."""
    _, _, k_local = jax.random.split(state.key, 3)
    trained = jax.jit(lambda p, a: local_train(model, local, pop.gather(p, a), None, data, k_local).params)(
        state.params, jnp.asarray(assignment))
    counts = np.asarray(data.counts, np.float64)
    for leaf_new, leaf_old, leaf_tr in zip(*(jax.tree_util.tree_leaves(t) for t in (new.params, state.params, trained))):
        t = np.asarray(leaf_tr, np.float64)
        for k in range(leaf_new.shape[0]):
            members = active & (assignment == k)
            if not members.any():
                np.testing.assert_array_equal(np.asarray(leaf_new[k]), np.asarray(leaf_old[k]))
                continue
            w = counts * members
            want = np.tensordot(w / w.sum(), t, axes=1)
            np.testing.assert_allclose(np.asarray(leaf_new[k]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.reference
def test_ifca_agents_estimate_their_cluster_by_the_lowest_loss_and_train_that_model():
    """IFCA's cluster estimate is the argmin over the k server models of the agent's local
    loss, and the agent trains the model it chose. With the default zero-initialised
    logistic regression every server model starts equal, every loss ties and every agent
    picks model 0: mutants taking the argmax, or training model 0 whatever the estimate,
    survived every default test. Here the server models differ; float64 NumPy losses."""
    model = models.logistic_regression(2, 2)
    rng = np.random.default_rng(1)
    n, k = 6, 2
    x = rng.normal(size=(n, 5, 2)).astype(np.float32)
    y = np.array([[0] * 5, [1] * 5, [0, 0, 0, 1, 0], [1, 1, 0, 1, 1], [0] * 5, [1] * 5], np.int32)
    data = AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray([5, 4, 5, 5, 3, 5], jnp.int32))
    local = LocalSGDConfig(epochs=1, batch_size=2, lr=0.2, momentum=0.0)
    alg = ifca(model, IFCAConfig(k=k, participation=1.0, local=local), n)
    state = alg.init(jax.random.key(0))
    servers = [{"params": {"Dense_0": {"kernel": rng.normal(scale=0.3, size=(2, 2)).astype(np.float32),
                                       "bias": np.array(b, np.float32)}}} for b in ([2.0, -2.0], [-2.0, 2.0])]
    state = state._replace(params=jax.tree_util.tree_map(lambda *p: jnp.stack(p), *servers))
    new, info = jax.jit(alg.round)(state, data)

    # the round counts, and the key moves on (a round that kept its key drew the same
    # participants and mini-batches in every round; only the 3-round pin saw it)
    assert int(new.round) == int(state.round) + 1
    assert not np.array_equal(jax.random.key_data(new.key), jax.random.key_data(state.key))

    losses = np.array([[logreg_loss(s, x[j], y[j], int(data.counts[j])) for s in servers] for j in range(n)])
    want = losses.argmin(1)
    assert 0 < want.sum() < n  # both models chosen
    np.testing.assert_array_equal(np.asarray(info.assignment), want)

    # every agent trained the model it chose: the server averages equal those of models
    # trained from gather(params, want), weighted by data size
    _check_server_models(model, local, state, new, data, want, np.ones(n, bool))
