"""Partitioners of cbo_jax.federated.partition: what each promises, seeded, and the label skew
issue 62 names (Dirichlet over 100 clients of 10 classes: at α = 0.1 a client holds at most 4
classes with 90 % of its samples on average, at α = 100 at least 9)."""

import numpy as np
import pytest

from cbo_jax.federated import partition

Y = np.random.default_rng(0).integers(0, 10, 20000)


def _is_partition(parts, n, every=True):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample at two clients"
    assert allidx.min() >= 0 and allidx.max() < n
    if every:
        assert len(allidx) == n, "a sample at no client"


@pytest.mark.parametrize("make", [
    lambda s: partition.iid(len(Y), 100, s),
    lambda s: partition.dirichlet(Y, 100, 0.3, s),
    lambda s: partition.classes_per_client(Y, 100, 2, s),
    lambda s: partition.shards(Y, 100, 2, s),
    lambda s: partition.quantity_skew(len(Y), 100, 0.5, s),
])
def test_every_sample_at_exactly_one_client_and_seeded(make):
    a, b, c = make(0), make(0), make(1)
    _is_partition(a, len(Y))
    assert len(a) == 100 and all(len(p) >= 1 for p in a)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def test_dirichlet_concentration_sets_the_label_skew():
    y = np.random.default_rng(1).integers(0, 10, 60000)
    skewed = partition.coverage(y, partition.dirichlet(y, 100, 0.1, seed=0)).mean()
    flat = partition.coverage(y, partition.dirichlet(y, 100, 100.0, seed=0)).mean()
    assert skewed <= 4, skewed
    assert flat >= 9, flat


def test_classes_per_client_and_shards_hold_few_classes():
    counts = partition.label_counts(Y, partition.classes_per_client(Y, 50, 2, seed=3))
    assert np.all((counts > 0).sum(1) == 2)
    assert np.all(counts.sum(0) == np.bincount(Y, minlength=10))  # every class given out whole
    held = (partition.label_counts(Y, partition.shards(Y, 100, 2, seed=0)) > 0).sum(1)
    assert held.max() <= 4 and np.median(held) <= 2


def test_quantity_skew_varies_sizes_not_labels():
    parts = partition.quantity_skew(len(Y), 20, 0.5, seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == len(Y) and sizes.max() > 3 * np.median(sizes)
    big = max(parts, key=len)
    share = np.bincount(Y[big], minlength=10) / len(big)
    assert np.abs(share - 0.1).max() < 0.05


def test_coverage_and_counts_against_a_hand_example():
    y = np.array([0, 0, 0, 1, 2, 2, 2, 2, 2, 2])
    parts = [np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7, 8, 9])]
    np.testing.assert_array_equal(partition.label_counts(y, parts), [[3, 1, 0], [0, 0, 6]])
    np.testing.assert_array_equal(partition.coverage(y, parts, share=0.9), [2, 1])
    np.testing.assert_array_equal(partition.coverage(y, parts, share=0.75), [1, 1])


@pytest.mark.parametrize("spec, match", [
    ("dirichlet", "dirichlet:ALPHA"), ("dirichlet:x", "not a number"), ("dirichlet:-1", "> 0"),
    ("zipf:2", "unknown partition"), ("iid:3", "write it as iid"), ("", "one of"),
])
def test_parse_refuses_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        partition.parse(spec)


def test_parse_gives_the_named_partitioner():
    a = partition.parse("dirichlet:0.3")(Y, 10, 4)
    b = partition.dirichlet(Y, 10, 0.3, 4)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert len(partition.parse("iid")(Y, 7, 0)) == 7


@pytest.mark.parametrize("call, match", [
    (lambda: partition.dirichlet(Y[:5], 10, 0.3), "num_clients"),
    (lambda: partition.dirichlet(Y, 10, 0.0), "alpha"),
    (lambda: partition.dirichlet(Y.astype(float) - 1, 10, 0.3), "labels"),
    (lambda: partition.classes_per_client(Y, 10, 11), "classes"),
    (lambda: partition.shards(Y[:10], 10, 2), "shards"),
    (lambda: partition.dirichlet(Y[:200], 100, 0.01, min_size=3, max_tries=2), "min_size"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_federated_data_and_plot(tmp_path):
    x = np.random.default_rng(0).normal(size=(len(Y), 3)).astype(np.float32)
    parts = partition.dirichlet(Y, 8, 0.5, seed=0)
    data = partition.federated_data(x, Y, parts, test_x=x[:50], test_y=Y[:50])
    assert data.num_agents == 8
    np.testing.assert_array_equal(data.counts, [len(p) for p in parts])
    j = 3
    np.testing.assert_array_equal(data.y[j, :len(parts[j])], Y[parts[j]])
    partition.plot(Y, parts, path=str(tmp_path / "labels.png"))
    assert (tmp_path / "labels.png").stat().st_size > 0


def test_rotated_mnist_partition_splits_the_same_images_by_label():
    import cbo_jax.federated as fl
    from cbo_jax.federated import mnist

    src = mnist.load_bundled()
    equal = fl.rotated_mnist(src, 8, 4, 20, seed=0)
    skewed = fl.rotated_mnist(src, 8, 4, 20, seed=0, partition=fl.partition.parse("dirichlet:0.3"))
    np.testing.assert_array_equal(skewed.cluster, equal.cluster)
    np.testing.assert_array_equal(skewed.test_y, equal.test_y)
    assert skewed.counts.sum() == equal.counts.sum() and len(set(skewed.counts.tolist())) > 1
    for k in range(4):  # each cluster holds the same images, split otherwise
        def labels(d):
            return np.sort(np.concatenate([d.y[j, :d.counts[j]] for j in np.flatnonzero(d.cluster == k)]))
        np.testing.assert_array_equal(labels(skewed), labels(equal))
    with pytest.raises(ValueError, match="two protocols"):
        fl.rotated_mnist(src, 8, 4, 20, subset=100, partition=fl.partition.parse("iid"))
    with pytest.raises(ValueError, match="a partitioner"):
        fl.rotated_mnist(src, 8, 4, 20, partition="iid")


def test_experiment_config_checks_the_partition_spec():
    from cbo_jax.experiments.federated import RotatedMNISTConfig

    assert RotatedMNISTConfig(partition="shards:2").partition == "shards:2"
    with pytest.raises(ValueError, match="unknown partition"):
        RotatedMNISTConfig(partition="zipf:1")
