"""The stealth attack of ``fedcb2o-attack --setting stealth``: a partial label flip, the
attackers' validation-loss gap and the metric it is read from (issue 61)."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.experiments import fedcb2o_attack
from cbo_jax.federated import attacks, metrics
from cbo_jax.federated.mnist import MNIST

C = 4
CFG = dict(source=2, target=1, num_classes=C, benign_per_cluster=4, malicious_per_cluster=2, benign_samples=10,
           val_samples=5, malicious_samples=400)


def _images(n_train=2000, n_test=40, seed=0):
    rng = np.random.default_rng(seed)
    return MNIST(rng.integers(0, 256, (n_train, 2, 2)).astype(np.uint8), rng.integers(0, C, n_train).astype(np.int32),
                 rng.integers(0, 256, (n_test, 2, 2)).astype(np.uint8), rng.integers(0, C, n_test).astype(np.int32), "fake")


def test_partial_flip_keeps_the_partition_and_flips_about_its_share():
    full = attacks.label_flip_rotated(_images(), attacks.LabelFlipConfig(**CFG), seed=5)
    part = attacks.label_flip_rotated(_images(), attacks.LabelFlipConfig(**CFG, flip_fraction=0.25), seed=5)
    for name in ("x_train", "y_train", "x_val", "y_val", "x_mal", "y_mal_clean", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(part, name), getattr(full, name))
    source = part.y_mal_clean == 2
    flipped = part.y_mal != part.y_mal_clean
    assert np.all(part.y_mal[flipped] == 1) and np.all(flipped <= source)  # only source images, only to the target
    share = flipped.sum() / source.sum()
    assert 0.18 < share < 0.32, share  # about 400 source images: 0.25 within a few standard deviations
    again = attacks.label_flip_rotated(_images(), attacks.LabelFlipConfig(**CFG, flip_fraction=0.25), seed=5)
    np.testing.assert_array_equal(again.y_mal, part.y_mal)  # seeded
    np.testing.assert_array_equal(full.y_mal, attacks.flip_labels(full.y_mal_clean, 2, 1))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_flip_fraction_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="flip_fraction"):
        attacks.LabelFlipConfig(flip_fraction=bad)


def test_attack_losses_average_same_cluster_downloads_by_maker():
    cluster = [0, 0, 1, 0, 1]
    malicious = [False, False, False, True, True]
    idx = jnp.asarray([[1, 3, 4, 2], [0, 2, 3, 4], [3, 4, 0, 1]])  # rows: the benign agents 0, 1, 2
    loss = jnp.asarray([[1.0, 3.0, 9.0, 7.0], [2.0, 8.0, 5.0, jnp.inf], [6.0, 4.0, 9.0, 9.0]])
    valid = jnp.asarray([[True] * 4, [True] * 4, [True, True, True, False]])
    out = metrics.attack_losses(cluster, malicious)(types.SimpleNamespace(idx=idx, loss=loss, valid=valid))
    got = {k: float(v) for k, v in out["val_loss_same_cluster"].items()}
    # same-cluster benign downloads: agent 0 -> 1 (1.0), agent 1 -> 0 (2.0); agent 2 (cluster 1) has none
    # same-cluster malicious: agent 0 -> 3 (3.0), agent 1 -> 3 (5.0), agent 2 -> 4 (4.0); inf and empty slots out
    assert got == pytest.approx({"benign": 1.5, "malicious": 4.0})


def test_loss_gap_is_the_mean_relative_gap_of_rounds_one_to_five():
    def run(pairs):
        return types.SimpleNamespace(history=[{"round": i + 1, "val_loss_same_cluster": {"benign": b, "malicious": m}}
                                              for i, (b, m) in enumerate(pairs)])
    a = run([(1.0, 1.1), (2.0, 1.8), (1.0, 1.0), (0.5, 0.55), (1.0, 0.9), (1.0, 5.0)])  # round 6 not counted
    b = run([(1.0, 1.0)] * 5)
    mean, per = fedcb2o_attack.loss_gap([a, b])
    assert per == [pytest.approx(0.0), 0.0] and mean == pytest.approx(0.0)
    short = run([(1.0, 1.2)] * 3)
    assert fedcb2o_attack.loss_gap([short]) == (None, [None])


def test_stealth_setting_is_a_partial_flip():
    assert fedcb2o_attack.SETTINGS["paper"].flip_fraction == 1.0
    assert 0 < fedcb2o_attack.SETTINGS["stealth"].flip_fraction < 1
