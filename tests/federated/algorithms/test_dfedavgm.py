"""DFedAvgM (cbo_jax.federated.algorithms.dfedavgm): decentralised averaging with momentum."""

import jax
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.local import LocalSGDConfig

from _reference import f64


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

LOGREG = models.logistic_regression(3, 2)


@pytest.mark.reference
def test_dfedavgm_averages_self_and_neighbours_weighted_by_data_size():
    """DFedAvgM (Sun, Li and Wang; the FedCB²O paper's Oracle baselines): after local
    training, agent j becomes ``(n_j θ_j + Σ_{i ∈ N_j} n_i θ_i) / (n_j + Σ_{i ∈ N_j} n_i)``
    over its ``M`` neighbours of its own group, ``n_i`` the training-set sizes. Float64
    NumPy reference from the round's trained models (recomputed from its key split); the
    only other check of the weights is a slow test."""
    from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm
    from cbo_jax.federated.attacks import AttackData, grouped_local_train

    n = 5
    rng = np.random.default_rng(6)
    sizes = [3, 6, 4, 5, 2]
    tx = [rng.normal(size=(s, 3)).astype(np.float32) for s in sizes]
    ty = [rng.integers(0, 2, s).astype(np.int32) for s in sizes]
    data = AttackData.from_lists(tx, ty, tx, ty)
    cfg = DFedAvgMConfig(M=2, local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.5, momentum=0.0))
    alg = dfedavgm(LOGREG, cfg, np.zeros(n, np.int32))
    state = alg.init(jax.random.key(3))
    new, info = jax.jit(alg.round)(state, data)
    _, k_local, _ = jax.random.split(state.key, 3)
    trained = f64(jax.jit(lambda p, o: grouped_local_train(LOGREG, cfg.local, p, o, data.groups, k_local).params)(
        state.params, state.opt_state))
    idx, w = np.asarray(info.idx), np.asarray(sizes, np.float64)
    for leaf, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new.params)):
        for j in range(n):
            rows = np.append(idx[j], j)
            want = np.tensordot(w[rows] / w[rows].sum(), leaf[rows], axes=1)
            assert np.max(np.abs(want - leaf[j])) > 1e-4  # the average moves the model
            np.testing.assert_allclose(np.asarray(got[j]), want, rtol=1e-5, atol=1e-6)
