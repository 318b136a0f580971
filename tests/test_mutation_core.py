"""CBO step core: what the default suite left unchecked (found by mutation testing)."""

from __future__ import annotations

import jax
import numpy as np

import cbo_jax as cj
from cbo_jax import objectives

from _stack import enable_x64


def test_cbo_chunks_draw_independent_noise():
    """``particle_chunk`` with the fast layout: chunk ``c`` draws from ``fold_in(key, c)``. Two
    identical halves of a population, one chunk each, must not move identically (without the
    fold every chunk would repeat chunk 0's normals: correlated particles, a biased swarm)."""
    half = np.random.default_rng(0).uniform(-2, 2, (8, 3))
    x0 = np.concatenate([half, half])
    with enable_x64(True):
        dyn = cj.cbo(objectives.Quadratic(shift=0.3), lambda1=1.0, sigma1=1.0, dt=0.1, alpha=1.0,
                     noise="anisotropic", particle_chunk=8, rng="fast", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(x0, jax.random.key(0)))
    x = np.asarray(s.x)
    assert np.min(np.abs(x[:8] - x[8:])) > 0


def test_diff_tol_compares_the_consensus_move_itself_not_its_square():
    """``diff_tol``: stop once the consensus moves by less than ``diff_tol`` (Euclidean norm)
    in one step, from the second step on. Gradient descent alone (α = 0, no consensus drift,
    no noise) on ``|x - c|²/2`` moves the consensus (the mean) by ``λ2 dt r^{k-2} |x̄_0 - c|``
    at step ``k``, ``r = 1 - λ2 dt``: the stopping step is known in closed form."""
    c, lam2, dt, tol = 0.3, 1.0, 0.1, 1e-2
    x0 = np.random.default_rng(1).uniform(0.8, 1.6, (6, 2))
    dist = np.linalg.norm(x0.mean(0) - c)
    r = 1 - lam2 * dt
    k = 2
    while lam2 * dt * r ** (k - 2) * dist >= tol:
        k += 1
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.0, sigma1=0.0, lambda2=lam2, dt=dt, alpha=0.0, noise="none", diff_tol=tol,
                           dtype="float64")
        res = cj.simulate(cj.cbo(objectives.Quadratic(shift=c), cfg), x0, jax.random.key(0), 200)
    assert k > 10  # the squared move would have stopped it at step 3
    assert int(res.state.step) == k and not bool(res.state.active)


def test_update_stagnation_norm_is_divided_by_n():
    """``UpdateStagnation`` reads ``|x_k - x_{k-1}|_F / N``. Noise off and α = 0: the first step
    moves the particles by ``λ1 dt (x_0 - x̄_0)``; with a threshold of twice that norm over
    ``N`` the trigger fires at step 2 (one step of lag, as CBXpy), not before."""
    from cbo_jax import resampling as R

    n, lam, dt = 10, 1.0, 0.1
    x0 = np.random.default_rng(2).uniform(-2, 2, (n, 2))
    norm1 = lam * dt * np.linalg.norm(x0 - x0.mean(0)) / n
    rs = R.Resampling(R.UpdateStagnation(update_thresh=2 * norm1), sigma=0.0)
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=lam, sigma1=0.0, dt=dt, alpha=0.0, noise="none", resampling=rs, dtype="float64")
        res = cj.simulate(cj.cbo(objectives.Quadratic(), cfg), x0, jax.random.key(0), 2)
    assert list(np.asarray(res.history["resamplings"])) == [0, 1]


def test_resampling_kick_is_sigma_sqrt_dt_normal():
    """A resampling moves every particle by ``σ_r √dt ξ`` (CBXpy's ``apply_resampling_default``).
    Nothing else moves the particles here, so the second step's increments (the first that
    fires) have variance ``σ_r² dt`` (6 standard errors)."""
    from cbo_jax import resampling as R

    n, d, sig_r, dt = 2000, 2, 0.5, 0.04
    x0 = np.random.default_rng(3).uniform(-1, 1, (n, d))
    rs = R.Resampling(R.UpdateStagnation(update_thresh=1.0), sigma=sig_r)
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.0, sigma1=0.0, dt=dt, alpha=1.0, noise="none", resampling=rs, dtype="float64")
        dyn = cj.cbo(objectives.Quadratic(), cfg)
        s1 = jax.jit(dyn.step)(dyn.init(x0, jax.random.key(0)))
        s2 = jax.jit(dyn.step)(s1)
    np.testing.assert_array_equal(np.asarray(s1.x), x0)  # no kick before the first update norm is known
    inc = (np.asarray(s2.x) - x0).ravel()
    var, want = inc.var(), sig_r ** 2 * dt
    assert abs(var / want - 1) < 6 * np.sqrt(2 / inc.size), (var, want)


def test_polar_heaviside_counts_one_consensus_energy_per_particle():
    """Evaluation counts: ``N`` at init, ``N`` per step for the particles and, with a Heaviside
    correction, ``E(m_i)`` for every particle's own consensus (``N`` more) in PolarCBO."""
    n, steps = 6, 3
    x0 = np.random.default_rng(4).uniform(-2, 2, (n, 2))
    res = cj.simulate(cj.polar_cbo(objectives.Quadratic(), correction="heaviside"), x0.astype(np.float32),
                      jax.random.key(0), steps)
    assert list(np.asarray(res.history["evals"])) == [n + 2 * n * k for k in range(1, steps + 1)]
