"""Large N: the streaming consensus and the chunked CBO step (particle_chunk)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import consensus, objectives, schedules

from _stack import enable_x64


def _np_consensus(x, e, alpha, keep):
    """float64 NumPy reference: Σ θ e^{-α(E - E_min)} / Σ e^{-α(E - E_min)} over the kept rows."""
    keep = keep & np.isfinite(e) & np.all(np.isfinite(x), axis=1)
    w = np.where(keep, np.exp(-alpha * np.where(keep, e - e[keep].min(), 0.0)), 0.0)
    return (w[:, None] * np.where(keep[:, None], x, 0)).sum(0) / w.sum()


def test_streaming_consensus_matches_numpy_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    e = rng.exponential(size=60) + 1e-8
    x[5, 1], e[7] = np.nan, np.inf  # non-finite agents get weight zero
    mask = rng.random(60) < 0.7
    streaming = jax.jit(consensus.streaming_consensus_point, static_argnames="chunk")
    with enable_x64(True):
        for alpha in (0.0, 3.0, 1e12):
            for keep in (None, mask):
                got = streaming(x, e, alpha, keep, chunk=12)
                ref = _np_consensus(x, e, alpha, np.ones(60, bool) if keep is None else keep)
                np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12)
        alpha = 3.0
        # K consensus points at once, and a stacked pytree
        E = np.stack([e, rng.exponential(size=60)])
        got = consensus.streaming_consensus_point(x, E, jnp.array([alpha, 1.0]), chunk=20)
        np.testing.assert_allclose(np.asarray(got), np.asarray(consensus.consensus_point(x, E, jnp.array([alpha, 1.0]))),
                                   rtol=1e-12)
        tree = {"a": x[:, :2].reshape(60, 2, 1), "b": x[:, 2:]}
        got = consensus.streaming_consensus_point(tree, e, alpha, chunk=30)
        np.testing.assert_allclose(np.concatenate([np.asarray(got["a"]).ravel(), np.asarray(got["b"])]),
                                   _np_consensus(x, e, alpha, np.ones(60, bool)), rtol=1e-12)
    with pytest.raises(ValueError, match="multiple of chunk"):
        consensus.streaming_consensus_point(x, e, 1.0, chunk=7)


def test_chunked_step_equals_unchunked_with_per_particle_noise():
    """particle_chunk changes the memory of a step, not the dynamics: with per-particle
    noise streams the chunked run equals the unchunked one up to summation order
    (gradient terms, random batches and clipping included)."""
    x0 = np.random.default_rng(1).uniform(-2, 2, (24, 3))
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.9, sigma1=0.7, dt=0.03, alpha=schedules.Multiplicative(3.0, 1.1, 100.0),
                           lambda2=0.3, sigma2=0.1, batch_size=16, max_abs=1.8, rng="per-particle", dtype="float64")
        a = cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), cfg), x0, 1, 30)
        b = cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), dataclasses.replace(cfg, particle_chunk=8)), x0, 1, 30)
    np.testing.assert_allclose(np.asarray(b.state.x), np.asarray(a.state.x), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(b.history["best_energy"], a.history["best_energy"], rtol=1e-11, atol=1e-12)
    with pytest.raises(ValueError, match="particle_chunk=5 must divide the number of particles N=24"):
        cj.simulate(cj.cbo(objectives.Ackley(), particle_chunk=5), x0.astype(np.float32), 0, 2)
