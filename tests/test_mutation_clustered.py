"""Clustered system: what the default suite left unchecked (found by mutation testing).

* The α schedule of each class reads that class's energies *of the step just taken's
  consensus* (the energies before the move, CBXpy's order). Only the effective-sample-size
  schedule reads energies at all, and no default test ran it on the clustered system, so
  feeding it the new energies went unnoticed.
* The gradient terms use ``∇L_{k_i}`` of each particle's *own* class; the pinned
  gradient case is slow-only.
* With ``particle_chunk`` and a fast RNG layout each chunk draws its own noise
  (``fold_in(key, c)``); without the fold every chunk repeats chunk 0's draw.
"""

from __future__ import annotations

import jax
import numpy as np

from cbo_jax import objectives, schedules
from cbo_jax.dynamics.clustered import clustered, particles

from _stack import enable_x64


def _np_ess(e, alpha):
    """float64 NumPy reference of J_eff(α) = (Σ w)² / Σ w², w = e^{-α (E - E_min)}."""
    w = np.exp(-alpha * (e - e.min()))
    return w.sum() ** 2 / (w ** 2).sum()


def test_ess_schedule_of_each_class_reads_the_pre_step_energies():
    """After one step, class k's α solves J_eff(α; E_k before the step) = η N (float64 NumPy ESS)."""
    rng = np.random.default_rng(0)
    centers = np.array([[1.0, 0.0], [-1.0, 0.5]])
    x0 = rng.uniform(-2, 2, (16, 2))
    eta = 0.5
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=c) for c in centers], lambda1=1.0, sigma1=1.0, dt=0.1,
                        alpha=schedules.EffectiveSampleSize(eta=eta, alpha0=1.0, iterations=60), dtype="float64")
        s0 = dyn.init(particles(x0, np.arange(16) % 2), jax.random.key(0))
        s1 = jax.jit(dyn.step)(s0)
    e0, e1 = np.asarray(s0.energy), np.asarray(s1.energy)
    assert np.max(np.abs(e1 - e0)) > 0.1  # the step moved the energies: the two conventions differ
    for k in range(2):
        a = float(s1.alpha[k])
        np.testing.assert_allclose(_np_ess(e0[k], a), eta * 16, rtol=1e-6)
        assert abs(_np_ess(e1[k], a) - eta * 16) > 1e-3


def test_gradient_drift_uses_each_particle_own_class():
    """Noise off, α = 0, λ1 = 0: one step is plain gradient descent on L_{k_i}, x - λ2 dt (x - c_{k_i})."""
    centers = np.array([[1.0, 2.0], [-3.0, 0.5]])
    x0 = np.random.default_rng(1).normal(size=(6, 2))
    label = np.array([0, 1, 1, 0, 1, 0])
    lam2, dt = 2.0, 0.1
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=c) for c in centers], lambda1=0.0, sigma1=0.0, lambda2=lam2,
                        dt=dt, alpha=0.0, noise="none", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(particles(x0, label), jax.random.key(0)))
    want = x0 - lam2 * dt * (x0 - centers[label])  # Quadratic: L(x) = |x - c|² / 2
    np.testing.assert_allclose(np.asarray(s.x), want, rtol=1e-13, atol=1e-13)


def test_chunks_draw_independent_noise():
    """Two identical halves of a population, processed as two chunks: with the fast layout the
    chunks draw different normals, so the halves must not stay identical after a step."""
    half = np.random.default_rng(2).uniform(-2, 2, (8, 3))
    x0 = np.concatenate([half, half])
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=0.3)], lambda1=1.0, sigma1=1.0, dt=0.1, alpha=1.0,
                        noise="anisotropic", particle_chunk=8, rng="fast", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(particles(x0), jax.random.key(0)))
    x = np.asarray(s.x)
    assert np.min(np.abs(x[:8] - x[8:])) > 0  # every coordinate got its own draw
