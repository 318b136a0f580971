"""The FedProx synthetic(α, β) data (cbo_jax.federated.synthetic)."""

from __future__ import annotations

import numpy as np
import pytest

from cbo_jax.federated.synthetic import synthetic


def test_synthetic_shapes_counts_and_labels():
    d = synthetic(1.0, 1.0, seed=0)
    n_dev = 30
    assert d.x.shape[0] == n_dev and d.x.shape[2] == 60 and d.x.dtype == np.float32
    assert d.y.shape == d.x.shape[:2] and d.test_x.shape[0] == n_dev and d.test_x.shape[2] == 60
    total = d.counts + d.test_counts
    assert total.min() >= 50
    np.testing.assert_array_equal(d.counts, (0.9 * total).astype(int))
    # n_k = int(lognormal(4, 2)) + 50 is the generator's first draw.
    expected = np.random.default_rng(0).lognormal(4.0, 2.0, n_dev).astype(np.int64) + 50
    np.testing.assert_array_equal(total, expected)
    assert d.x.shape[1] == d.counts.max() and d.test_x.shape[1] == d.test_counts.max()
    assert np.all(d.x[~d.mask] == 0) and np.all(d.y[~d.mask] == 0)
    # Labels are argmax(x W_k + b_k) on every real sample, train and test.
    logits = np.einsum("knd,kdc->knc", d.x.astype(np.float64), d.W.astype(np.float64)) + d.b[:, None, :]
    np.testing.assert_array_equal(np.argmax(logits, -1)[d.mask], d.y[d.mask])
    tlogits = np.einsum("knd,kdc->knc", d.test_x.astype(np.float64), d.W.astype(np.float64)) + d.b[:, None, :]
    np.testing.assert_array_equal(np.argmax(tlogits, -1)[d.test_mask], d.test_y[d.test_mask])
    assert d.y.min() >= 0 and d.y.max() < 10
    ad = d.agent_data()
    assert ad.x.shape == d.x.shape and int(ad.counts.sum()) == int(d.counts.sum())


def test_synthetic_statistics():
    """Within-device feature variance is Σ = diag(j^-1.2); the IID variant shares W, b and v = 0."""
    d = synthetic(1.0, 1.0, seed=3, max_samples=3000)
    xs = np.concatenate([np.concatenate([d.x[k, : d.counts[k]], d.test_x[k, : d.test_counts[k]]])
                         for k in range(30)])
    centred = np.concatenate([np.concatenate([d.x[k, : d.counts[k]], d.test_x[k, : d.test_counts[k]]]) -
                              np.concatenate([d.x[k, : d.counts[k]], d.test_x[k, : d.test_counts[k]]]).mean(0)
                              for k in range(30)])
    sigma = np.arange(1, 61) ** -1.2
    assert len(xs) > 5000
    np.testing.assert_allclose(centred.var(0), sigma, rtol=0.12)
    # Non-IID: device models differ; IID: one shared model and zero-mean inputs.
    assert np.std(d.W.mean(axis=(1, 2))) > 0.2
    iid = synthetic(iid=True, seed=3, max_samples=3000)
    np.testing.assert_array_equal(iid.W[0], iid.W[-1])
    pooled = np.concatenate([iid.x[k, : iid.counts[k]] for k in range(30)])
    assert np.all(np.abs(pooled.mean(0)) < 5 * np.sqrt(sigma / len(pooled)) + 1e-3)


def test_synthetic_seeding():
    a, b, c = synthetic(seed=7, max_samples=300), synthetic(seed=7, max_samples=300), synthetic(seed=8, max_samples=300)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert a.x.shape != c.x.shape or not np.array_equal(a.x, c.x)
    with pytest.raises(ValueError, match="alpha"):
        synthetic(alpha=-1.0)
    with pytest.raises(ValueError, match="train_fraction"):
        synthetic(train_fraction=1.0)


def test_synthetic_train_fraction_leaving_a_device_empty_is_refused():
    # int(0.006 · 200) = 1 passes the max_samples check, but seed 0 draws devices of
    # 91 and 120 samples: int(0.006 · 120) = 0, so they used to get no training sample.
    with pytest.raises(ValueError, match=r"devices \[0, 1,.*without training or test samples"):
        synthetic(train_fraction=0.006, max_samples=200)
    d = synthetic(train_fraction=0.02, max_samples=200)  # int(0.02 · 50) = 1
    assert d.counts.min() >= 1 and d.test_counts.min() >= 1


@pytest.mark.parametrize("kw, match", [
    (dict(iid="no"), "iid must be a bool"),
    (dict(iid=1), "iid must be a bool"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(alpha=1e300), "alpha"),
    (dict(beta=1e39), "beta"),
])
def test_synthetic_refuses_bad_iid_seed_and_scales(kw, match):
    """``iid="no"`` (truthy) silently generated the IID variant; a negative or fractional seed
    failed in NumPy without naming ``seed``; α = 1e300 made W (float32) infinite."""
    with pytest.raises(ValueError, match=match):
        synthetic(num_devices=2, max_samples=20, **kw)
