"""A float64 federated run is float64 throughout.

The sample-count weights of FedAvg, IFCA, DFedAvgM and the attackers' average, and
FedSGLD's step sizes, averaging factors, Poisson normaliser ``q n_i`` and per-sample
gradient norms, were formed in float32, which held a float64 run to about 1e-8 of its
float64 reference. Each check here compares with a float64 NumPy computation at 1e-13 and
fails by orders of magnitude with the float32 forms (about 1e-8). float32 runs are
unchanged: the float32 forms are what the pinned federated runs use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import population as pop
from cbo_jax.federated.langevin import OracleSpec, poisson_clipped_grad, poisson_grad, sgld_oracle, step_sizes
from cbo_jax.models import logistic_regression

from _stack import enable_x64

TIGHT = dict(rtol=1e-13, atol=1e-15)


def test_weighted_average_of_float64_rows_normalises_in_float64():
    with enable_x64(True):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(5, 3))
        counts = np.array([[3, 7, 11, 0, 200], [1, 0, 0, 5, 9]])  # sample counts, exact in float32
        got = pop.weighted_average(jnp.asarray(x), jnp.asarray(counts, jnp.float32))
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, counts @ x / counts.sum(1, keepdims=True), **TIGHT)
        # float32 rows keep float32 weights (the pinned runs' form)
        rows32 = jnp.asarray(x, jnp.float32)
        assert pop.weighted_average(rows32, jnp.asarray(counts[0], jnp.float32)).dtype == jnp.float32


def _numpy_step_sizes(steps, burn_in, lr, decay=True):
    q = np.arange(1, steps + 1, dtype=np.float64)
    return np.where(q <= burn_in, lr, lr * np.maximum(q - burn_in, 1.0) ** (-1 / 3)) if decay else np.full(steps, lr)


def test_step_sizes_take_the_requested_dtype():
    spec = OracleSpec(steps=7, burn_in=2, lr=0.1, noise=0.0, clip_norm=None, sampling_rate=1.0, decay=True,
                      average="uniform", avg_decay=0.0)
    assert step_sizes(spec).dtype == jnp.float32
    with enable_x64(True):
        got = step_sizes(spec, jnp.float64)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, _numpy_step_sizes(7, 2, 0.1), **TIGHT)
        flat = step_sizes(spec._replace(decay=False), jnp.float64)
        np.testing.assert_allclose(flat, np.full(7, 0.1), **TIGHT)


@pytest.mark.parametrize("average", ["uniform", "ema"])
def test_sgld_oracle_float64_chain_matches_numpy(average):
    """No noise, the gradient of ``½ Σ a x²``: the chain and its average against a float64 loop."""
    a = np.array([0.3, 1.7, 0.9])
    spec = OracleSpec(steps=9, burn_in=3, lr=0.21, noise=0.0, clip_norm=None, sampling_rate=1.0, decay=True,
                      average=average, avg_decay=0.7)
    with enable_x64(True):
        res = sgld_oracle(lambda x, k: {"w": jnp.asarray(a) * x["w"]}, {"w": jnp.ones(3, jnp.float64)},
                          jax.random.key(0), spec)
        assert res.last["w"].dtype == jnp.float64 and res.average["w"].dtype == jnp.float64
    x, avg = np.ones(3), np.ones(3)
    for q, eta in enumerate(_numpy_step_sizes(9, 3, 0.21), start=1):
        x = x - eta * a * x
        t = q - 3
        if t >= 1:
            sigma = (t - 1) / t if average == "uniform" else (0.0 if t == 1 else 0.7)
            avg = sigma * avg + (1 - sigma) * x
        else:
            avg = x
    np.testing.assert_allclose(res.last["w"], x, **TIGHT)
    np.testing.assert_allclose(res.average["w"], avg, **TIGHT)


def _problem64():
    """A float64 logistic regression on 12 padded rows, 9 real, inputs spread so that the
    per-sample gradient norms straddle C = 1.5."""
    rng = np.random.default_rng(0)
    params = {"params": {"Dense_0": {"kernel": jnp.asarray(rng.normal(0, 0.5, (4, 3))),
                                     "bias": jnp.asarray(rng.normal(0, 0.5, 3))}}}
    x = rng.normal(0, 1, (12, 4)) * np.array([0.1, 0.3, 1, 3, 0.2, 2, 0.5, 4, 0.05, 1, 1, 1])[:, None]
    return logistic_regression(4, 3), params, jnp.asarray(x), jnp.asarray(np.arange(12) % 3), 9


def _numpy_per_sample(params, x, y):
    w = np.asarray(params["params"]["Dense_0"]["kernel"])
    b = np.asarray(params["params"]["Dense_0"]["bias"])
    logits = np.asarray(x) @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = p - np.eye(3)[np.asarray(y)]
    return np.einsum("nf,nc->nfc", np.asarray(x), d), d


@pytest.mark.parametrize("clip", [None, 1.5])
def test_poisson_gradients_in_float64_match_numpy(clip):
    q, key = 0.3, jax.random.key(5)
    with enable_x64(True):
        model, params, x, y, count = _problem64()
        if clip is None:
            g = poisson_grad(model, params, x, y, count, key, q)
        else:
            g, _ = poisson_clipped_grad(model, params, x, y, count, key, q, clip)
        mask = (np.arange(12) < count) & np.asarray(jax.random.bernoulli(key, q, (12,)))
    assert g["params"]["Dense_0"]["kernel"].dtype == jnp.float64
    assert 2 <= mask.sum() < count
    gw, gb = _numpy_per_sample(params, x, y)
    factor = np.where(mask, 1.0, 0.0)
    if clip is not None:
        norms = np.sqrt((gw ** 2).sum((1, 2)) + (gb ** 2).sum(1))
        assert np.any(norms[mask] > clip)
        factor = factor * np.minimum(1.0, clip / norms)
    factor = factor / (q * count)
    np.testing.assert_allclose(g["params"]["Dense_0"]["kernel"], np.einsum("n,nfc->fc", factor, gw), **TIGHT)
    np.testing.assert_allclose(g["params"]["Dense_0"]["bias"], np.einsum("n,nc->c", factor, gb), **TIGHT)
