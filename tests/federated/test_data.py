"""FederatedData stacking and the rotated-MNIST builder."""

import numpy as np
import pytest

from cbo_jax.federated import data as fdata
from cbo_jax.federated.mnist import MNIST, load_bundled


def _tiny_mnist(n_train=120, n_test=20):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    return MNIST(imgs, np.arange(n_train, dtype=np.int32) % 10,
                 rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), np.arange(n_test, dtype=np.int32) % 10, "tiny")


def test_from_lists_pads_and_masks():
    xs = [np.ones((3, 2)), np.ones((1, 2)) * 2]
    ys = [np.array([1, 2, 3]), np.array([4])]
    d = fdata.FederatedData.from_lists(xs, ys, [0, 1], np.zeros((2, 5, 2)), np.zeros((2, 5)))
    assert d.x.shape == (2, 3, 2) and d.counts.tolist() == [3, 1]
    assert d.mask.tolist() == [[True, True, True], [True, False, False]]
    assert d.y[1].tolist() == [4, 0, 0]
    with pytest.raises(ValueError, match="agent 0 has 3 inputs but 2 labels"):
        fdata.FederatedData.from_lists(xs, [ys[0][:2], ys[1]], [0, 1], d.test_x, d.test_y)


def test_from_lists_rejects_mismatched_sample_shapes():
    # Agent 1's (2, 1, 2) samples used to be broadcast silently into (2, 2) rows.
    xs = [np.full((3, 2, 2), 0.7, np.float32), np.full((2, 1, 2), 0.5, np.float32)]
    ys = [np.zeros(3, np.int32), np.zeros(2, np.int32)]
    with pytest.raises(ValueError, match=r"xs\[1\] has shape \(2, 1, 2\)"):
        fdata.FederatedData.from_lists(xs, ys)
    with pytest.raises(ValueError, match=r"test_x\[1\] has shape"):
        fdata.FederatedData.from_lists(xs[:1], ys[:1], test_x=xs, test_y=ys)
    with pytest.raises(ValueError, match="xs is empty"):
        fdata.FederatedData.from_lists([], [])


def test_from_lists_keeps_the_common_dtype():
    # The stack took the first agent's dtype: an integer first agent truncated the others' floats.
    d = fdata.FederatedData.from_lists([np.ones((2, 2), np.int64), np.full((3, 2), 0.7)],
                                       [np.zeros(2), np.full(3, 0.6)])
    assert d.x[1, 0].tolist() == [0.7, 0.7]
    d = fdata.FederatedData.from_lists([np.ones((2, 2))] * 2, [np.zeros(2, np.int64), np.full(2, 0.6)])
    assert d.y[1].tolist() == [0.6, 0.6]


def test_from_lists_test_sets_must_match_their_labels():
    xs, ys = [np.ones((3, 2))] * 2, [np.zeros(3, np.int32)] * 2
    # Test set 0 with 3 inputs and 2 labels used to be padded into a test set with a wrong label.
    with pytest.raises(ValueError, match="test set 0 has 3 inputs but 2 labels"):
        fdata.FederatedData.from_lists(xs, ys, test_x=xs, test_y=[np.zeros(2, np.int32)] * 2)
    with pytest.raises(ValueError, match="test_y must be a list of as many"):
        fdata.FederatedData.from_lists(xs, ys, test_x=xs)
    d = fdata.FederatedData.from_lists(xs, ys, test_x=[np.ones((3, 2)), np.ones((1, 2))],
                                       test_y=[np.zeros(3, np.int32), np.ones(1, np.int32)])
    assert d.test_counts.tolist() == [3, 1] and d.test_y.tolist() == [[0, 0, 0], [1, 0, 0]]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_rotated_mnist_partitions_each_cluster(k):
    src = _tiny_mnist()
    n = 4 * k
    d = fdata.rotated_mnist(src, num_agents=n, num_clusters=k, seed=3)
    per_cluster = n // k
    assert d.x.shape == (n, 120 // per_cluster, 28, 28)
    assert d.cluster.tolist() == sorted(d.cluster.tolist()) and np.bincount(d.cluster).tolist() == [per_cluster] * k
    for c, deg in enumerate(fdata.ROTATIONS[k]):
        agents = np.flatnonzero(d.cluster == c)
        # The agents of a cluster hold a partition of the whole rotated training set.
        flat = d.x[agents].reshape(-1, 28, 28)
        unrot = np.rot90(flat, k=-(deg // 90), axes=(1, 2))
        keys = sorted(map(bytes, unrot.reshape(len(unrot), -1)))
        assert keys == sorted(map(bytes, src.train_images.reshape(120, -1)))
        np.testing.assert_array_equal(d.test_x[c], np.rot90(src.test_images, k=deg // 90, axes=(1, 2)))
        labels = d.y[agents].ravel()
        assert np.bincount(labels, minlength=10).tolist() == np.bincount(src.train_labels, minlength=10).tolist()


def test_rotated_mnist_samples_per_agent_and_seed():
    src = _tiny_mnist()
    a = fdata.rotated_mnist(src, 8, 4, samples_per_agent=10, seed=1)
    b = fdata.rotated_mnist(src, 8, 4, samples_per_agent=10, seed=1)
    c = fdata.rotated_mnist(src, 8, 4, samples_per_agent=10, seed=2)
    assert a.x.shape == (8, 10, 28, 28)
    np.testing.assert_array_equal(a.x, b.x)
    assert not np.array_equal(a.x, c.x)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_agents=10, num_clusters=4), "divisible"),
        (dict(num_agents=12, num_clusters=3), "rotation count"),
        (dict(num_agents=0, num_clusters=1), "num_agents"),
        (dict(num_agents=8, num_clusters=4, samples_per_agent=100), "training images per cluster"),
    ],
)
def test_rotated_mnist_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fdata.rotated_mnist(_tiny_mnist(), **kwargs)


def test_rotated_mnist_from_bundled_subset_paper_shape():
    d = fdata.rotated_mnist(load_bundled(), num_agents=40, num_clusters=4, samples_per_agent=200)
    assert d.x.shape == (40, 200, 28, 28) and d.test_x.shape == (4, 2000, 28, 28)
