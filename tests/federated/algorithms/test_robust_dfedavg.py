"""The robust decentralised baselines (median, trimmed mean, Krum beside FedCB²O): one round's
aggregation against a float64 NumPy reference."""

import jax
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import attacks
from cbo_jax.federated.algorithms import RobustConfig, robust_dfedavg
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.mnist import MNIST

C = 4
TINY = models.mlp_mnist(hidden=(3,), num_classes=C, input_shape=(2, 2))
FLIP = attacks.LabelFlipConfig(source=2, target=1, num_classes=C, benign_per_cluster=5, malicious_per_cluster=2,
                               benign_samples=10, val_samples=5, malicious_samples=12)
FROZEN = LocalSGDConfig(epochs=1, batch_size=4, lr=1e-30, momentum=0.0)  # local training leaves the models as they are


def _ds():
    rng = np.random.default_rng(0)
    images = MNIST(rng.integers(0, 256, (300, 2, 2)).astype(np.uint8), rng.integers(0, C, 300).astype(np.int32),
                   rng.integers(0, 256, (40, 2, 2)).astype(np.uint8), rng.integers(0, C, 40).astype(np.int32), "fake")
    return attacks.label_flip_rotated(images, FLIP, seed=1)


def _flat(tree, j):
    return np.concatenate([np.asarray(a[j], np.float64).ravel() for a in jax.tree_util.tree_leaves(tree)])


def _reference(rule, rows, f=1, beta=0.2):
    if rule == "median":
        return np.median(rows, axis=0)
    if rule == "trimmed_mean":
        k = int(np.floor(beta * len(rows)))
        return np.sort(rows, axis=0)[k:len(rows) - k].mean(0)
    if rule == "krum":
        d2 = ((rows[:, None] - rows[None]) ** 2).sum(-1)
        near = max(len(rows) - f - 2, 1)
        score = [np.sort(np.delete(d2[i], i))[:near].sum() for i in range(len(rows))]
        return rows[int(np.argmin(score))]
    return rows.mean(0)


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "mean"])
def test_one_round_aggregates_own_and_downloads_by_the_rule(rule):
    ds = _ds()
    cfg = RobustConfig(rule=rule, M=3, beta=0.2, f=1, agent_chunk=4, local=FROZEN)
    alg = robust_dfedavg(TINY, cfg, ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(0))
    new, info = jax.jit(alg.round)(state, ds.attack_data())
    nb = int((~ds.malicious).sum())
    idx = np.asarray(info.idx)
    assert idx.shape == (nb, 3)
    assert np.all(ds.cluster[idx] == ds.cluster[:nb, None]) and not np.any(idx == np.arange(nb)[:, None])
    for j in range(nb):
        rows = np.stack([_flat(state.params, i) for i in [j, *idx[j]]])
        np.testing.assert_allclose(_flat(new.params, j), _reference(rule, rows), rtol=1e-5, atol=1e-6)
    assert not np.any(np.asarray(info.fallback))


def test_runs_in_the_engine_and_names_itself():
    ds = _ds()
    alg = fl.robust_dfedavg(TINY, fl.RobustConfig(rule="krum", M=3, f=1, local=LocalSGDConfig(epochs=1, batch_size=4)),
                            ds.cluster, ds.malicious)
    assert alg.name == "dfedavg_krum"
    res = fl.run(alg, ds.attack_data(), 2, jax.random.key(0), progress=False)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(res.state.params))


@pytest.mark.parametrize("kw, match", [({"rule": "mode"}, "rule"), ({"beta": 0.5}, "beta"), ({"f": -1}, "f"),
                                       ({"M": 0}, "M")])
def test_bad_config_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        RobustConfig(**kw)
