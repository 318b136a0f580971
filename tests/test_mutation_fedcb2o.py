"""Mutation-testing gaps in FedCB²O and its attackers (cbo_jax.federated.algorithms.fedcb2o,
cbo_jax.federated.attacks). Tiny sizes, float64 NumPy references or closed forms."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import models
from cbo_jax.federated import attacks
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.mnist import MNIST

C = 4
TINY = models.mlp_mnist(hidden=(3,), num_classes=C, input_shape=(2, 2))
FLIP = attacks.LabelFlipConfig(source=2, target=1, num_classes=C, benign_per_cluster=3, malicious_per_cluster=2,
                               benign_samples=8, val_samples=4, malicious_samples=6)
LOCAL = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0)
# The reference code's form (include_self, self_largest, shared_init, α = 2) with a step λ1γ = 0.35, not 1.
CFG = FedCB2OConfig.reference_code(M=3, T_G=1, lambda1=3.5, gamma=0.1, local=LOCAL)


def _dataset():
    rng = np.random.default_rng(0)
    images = MNIST(rng.integers(0, 256, (120, 2, 2)).astype(np.uint8), rng.integers(0, C, 120).astype(np.int32),
                   rng.integers(0, 256, (20, 2, 2)).astype(np.uint8), rng.integers(0, C, 20).astype(np.int32), "fake")
    return attacks.label_flip_rotated(images, FLIP, seed=1)


@functools.lru_cache(maxsize=None)
def _round_zero():
    """One round (round 0 < T_G) of CFG, and the models after its local training, recomputed
    from the round's key split (as the FedCBO round tests do): one compilation for both tests."""
    ds = _dataset()
    data = ds.attack_data()
    nb = ds.num_benign
    alg = fedcb2o(TINY, CFG, ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(7))
    _, k_local, _, _ = jax.random.split(state.key, 4)
    val = data.val

    @jax.jit
    def trained_and_val_losses(state, data):
        trained = attacks.grouped_local_train(TINY, LOCAL, state.params, state.opt_state, data.groups, k_local).params
        benign = jax.tree_util.tree_map(lambda a: a[:nb], trained)
        return trained, jax.vmap(lambda p, x, y: TINY.loss(TINY.apply(p, x), y))(benign, val.x, val.y)

    trained, per = trained_and_val_losses(state, data)
    new, info = jax.jit(alg.round)(state, data)
    f64 = lambda t: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), t)  # noqa: E731
    return nb, np.asarray(val.counts), f64(trained), np.asarray(per, np.float64), info, f64(new.params)


def test_attacker_average_ignores_the_slots_its_cluster_cannot_fill():
    """The attackers' strategy (FedCB²O §3.5, attacks.attacker_average): the average of the own
    model and the *valid* downloads, weighted by training-set size. A slot marked invalid
    (attacker_selection: the cluster has fewer than M others) holds some other agent and must
    weigh nothing; a mutant that ignored ``valid`` survived the default suite."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 3))
    sizes = np.array([2.0, 5.0, 1.0, 7.0, 3.0, 4.0])
    attackers = np.array([4, 5])
    idx = np.array([[5, 0, 2], [4, 1, 3]])
    valid = np.array([[True, True, False], [True, False, False]])
    new = attacks.attacker_average({"w": jnp.asarray(w, jnp.float32)}, jnp.asarray(attackers), jnp.asarray(idx),
                                   jnp.asarray(valid), jnp.asarray(sizes, jnp.float32))
    for r, a in enumerate(attackers):
        rows = [a] + [i for i, v in zip(idx[r], valid[r]) if v]
        ref = np.sum(sizes[rows, None] * w[rows], axis=0) / np.sum(sizes[rows])
        np.testing.assert_allclose(np.asarray(new["w"][r]), ref, rtol=1e-5, atol=1e-6)


def test_reference_form_weighs_the_own_model_by_its_loss_before_T_G():
    """FedCB2OConfig.reference_code (include_self, self_largest): the own model gets the largest
    weight only from round T_G on, together with G; before T_G the energy of every model,
    the own one included, is its mean validation loss (FedCB²O Algorithm 1, step f), so
    μ_self ∝ exp(-α L_j(θ_j)). Checked at round 0 < T_G against the losses of the trained
    models. A mutant applying self_largest before T_G survived the default suite."""
    nb, counts, _, per, info, _ = _round_zero()
    capped = 0
    for j in range(nb):
        own = per[j, :counts[j]].mean()
        ok = np.asarray(info.valid[j]) if info.valid is not None else np.ones(CFG.M, bool)
        down = np.asarray(info.loss[j], np.float64)[ok]
        capped += own > down.min()
        e = np.append(down, own)
        mu = np.exp(-CFG.alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(info.weights[j])[ok], mu[:-1], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(float(info.self_weight[j]), mu[-1], rtol=1e-4, atol=1e-6)
    assert capped > 0  # some agent's own loss is above its best download's: self_largest would change it


def test_loss_criterion_keeps_the_mean_loss_from_round_T_G_on():
    """``criterion="loss"`` (FedCBO with ProbSampling, the attacked baseline) never switches to G
    nor to self_largest: from round T_G on, as before it, every model's energy, the own one
    included, is its mean validation loss. With T_G = 0 its round 0 is past T_G; it trains and
    selects as CFG's round 0 (same key), so the weights are exp(-α L) over the same trained
    models. A mutant that switched the baseline to G at T_G was caught only by a slow pinned run."""
    nb, counts, _, per, _, _ = _round_zero()
    ds = _dataset()
    alg = fedcb2o(TINY, dataclasses.replace(CFG, criterion="loss", T_G=0), ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(7))
    _, info = jax.jit(alg.round)(state, ds.attack_data())
    assert int(state.round) >= alg.config.T_G
    capped = 0
    for j in range(nb):
        own = per[j, :counts[j]].mean()
        ok = np.asarray(info.valid[j]) if info.valid is not None else np.ones(CFG.M, bool)
        down = np.asarray(info.loss[j], np.float64)[ok]
        capped += own > down.min()
        e = np.append(down, own)
        mu = np.exp(-CFG.alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(info.weights[j])[ok], mu[:-1], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(float(info.self_weight[j]), mu[-1], rtol=1e-4, atol=1e-6)
    assert capped > 0  # some agent's own loss is above its best download's: self_largest (with G) would change it


def test_benign_update_moves_the_fraction_lambda1_gamma_towards_the_consensus_point():
    """FedCB²O eq. (3.14): θ_j ← θ_j - λ1γ (θ_j - m_j), with m_j = Σ_i μ_i θ_i + μ_self θ_j
    (eq. (3.13), the own model included in the reference form) over the trained models and
    the round's weights. λ1γ = 0.35 here; at the default λ1γ = 1 (θ_j ← m_j) a mutant that
    ignored the step survived the default suite."""
    nb, _, trained, _, info, new = _round_zero()
    step = CFG.lambda1 * CFG.gamma
    idx = np.asarray(info.idx)
    w = np.asarray(info.weights, np.float64)
    w_self = np.asarray(info.self_weight, np.float64)
    for t, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new)):
        for j in range(nb):
            m_j = np.tensordot(w[j], t[idx[j]], axes=1) + w_self[j] * t[j]
            assert np.max(np.abs(t[j] - m_j)) > 1e-4  # the trained model is not its consensus point
            np.testing.assert_allclose(got[j], t[j] - step * (t[j] - m_j), rtol=1e-5, atol=1e-6)
