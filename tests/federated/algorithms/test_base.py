"""What every federated algorithm shares (cbo_jax.federated.algorithms.base): the participants G_n of a round."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.local import LocalSGDConfig, local_train


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

LOGREG = models.logistic_regression(3, 2)


def _agents(n=5, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


def _check_non_participants_keep_their_state(alg, data):
    state = alg.init(jax.random.key(5))
    rng = np.random.default_rng(0)  # a momentum trace left by an earlier round
    state = state._replace(opt_state=jax.tree_util.tree_map(
        lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
        state.opt_state))
    new, info = jax.jit(alg.round)(state, data)
    active = np.asarray(info.active)
    assert 0 < active.sum() < active.size
    _, _, k_local = jax.random.split(state.key, 5 if alg.name == "fedcbo" else 3)[:3]
    trained = jax.jit(lambda p, o: local_train(LOGREG, alg.config.local, p, o, data, k_local))(state.params,
                                                                                                state.opt_state)
    for old, got, tr in zip(*(jax.tree_util.tree_leaves(t) for t in (state.opt_state, new.opt_state,
                                                                       trained.opt_state))):
        old, got, tr = np.asarray(old), np.asarray(got), np.asarray(tr)
        np.testing.assert_array_equal(got[~active], old[~active])
        np.testing.assert_allclose(got[active], tr[active], rtol=1e-6, atol=1e-7)
        if np.issubdtype(old.dtype, np.floating):
            assert np.max(np.abs(tr[~active] - old[~active])) > 1e-3  # training would have changed them


@pytest.mark.reference
def test_local_only_non_participants_keep_their_momentum():
    """Partial participation (``G_n``, FedCBO Algorithm 1 step 1, used by every baseline) with
    ``reset_optimizer=False``: only the agents of ``G_n`` train, so a non-participant keeps its
    optimizer state (momentum trace) as well as its model; a participant's becomes the one its
    local SGD left. Exact property of one ``local_only`` round."""
    from cbo_jax.federated.algorithms import LocalConfig, local_only

    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.2, momentum=0.9, reset_optimizer=False)
    _check_non_participants_keep_their_state(local_only(LOGREG, LocalConfig(local=loc, participation=0.5), 5),
                                             _agents(5, seed=7))


@pytest.mark.reference
def test_fedcbo_non_participants_keep_their_momentum():
    """As above for FedCBO (Algorithm 1: only the agents of ``G_n`` run LocalUpdate): with
    ``reset_optimizer=False`` a non-participant's optimizer state is left as it was. The
    pinned FedCBO run that keeps its optimizer state has full participation, the one with
    partial participation resets it every round."""
    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.2, momentum=0.9, reset_optimizer=False)
    cfg = FedCBOConfig(M=2, lambda1=4.0, gamma=0.1, alpha=3.0, participation=0.6, local=loc)
    _check_non_participants_keep_their_state(fedcbo(LOGREG, cfg, 5), _agents(5, seed=7))
