"""CBX-family kernels step by step against float64 NumPy references (found by mutation testing).

The default suite compares four CBX-family cases with CBXpy; PSO, AdamCBO, MirrorCBO and
the constrained dynamics are compared only in the slow run. Without noise a step of each
is a closed formula of the module docstrings, checked here for a few steps in float64 (so
drifts, denominators, bias corrections, dual variables, implicit solves and penalties are
all pinned by the default run). The noise terms are checked against CBXpy at the end
(three steps, the same draws), for the cases whose noise terms nothing else in the default
run reads. Such a comparison hands CBXpy the draws cbo_jax made, so it cannot see one draw
used twice: the independence of a step's draws is checked by the variance of their sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import constraints as cons
from cbo_jax import mirror_maps

from _stack import enable_x64

SHIFT = 0.3
ALPHA = 2.0


def quad(x):
    """The objective of every case, ``|x - 0.3|² / 2`` per particle (JAX, population form)."""
    return 0.5 * jnp.sum((x - SHIFT) ** 2, axis=-1)


def np_quad(x):
    return 0.5 * np.sum((x - SHIFT) ** 2, axis=-1)


def np_gibbs(x, e, alpha=ALPHA):
    w = np.exp(-alpha * (e - e.min()))
    return (w[:, None] * x).sum(0) / w.sum()


def _x0(n=7, d=2, seed=0, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, (n, d))


def _run(dyn, x0, steps):
    """The states after 0..steps steps (jitted step, float64)."""
    s = dyn.init(jnp.asarray(x0), jax.random.key(0))
    step = jax.jit(dyn.step)
    out = [s]
    for _ in range(steps):
        s = step(s)
        out.append(s)
    return out


@pytest.fixture(autouse=True)
def _x64():
    with enable_x64(True):
        yield


@pytest.mark.parametrize("correction", ["none", "heaviside"])
def test_pso_paper_step_is_the_semi_implicit_velocity_update(correction):
    """PSO (``formulation="paper"``): ``v ← (m v - H λ1 dt (x - m_α) - λ_mem dt (x - y)) / (m + γ dt)``,
    ``x ← x + dt v``, ``y ← x`` where better; ``m_α`` the Gibbs mean of the memories and
    ``γ = 1 - m`` by default. The correction acts on the consensus pull only (as CBXpy's
    ``PSO.inner_step``): ``H_i = 1`` without one, ``H_i = [E(y_i) > E(m_α)]`` with
    ``"heaviside"`` (the memories' energies, the state's). A pull that dropped the correction
    was caught by nothing in the default run (CBXpy's PSO case has none)."""
    lam, lam_mem, dt, inertia = 1.2, 0.4, 0.1, 0.2
    gamma = 1.0 - inertia
    x0 = _x0()
    x0[0] = [0.35, 0.25]  # a memory better than the consensus point: its pull is switched off
    dyn = cj.pso(quad, lambda1=lam, lambda_memory=lam_mem, dt=dt, m=inertia, alpha=ALPHA, noise="none",
                 correction=correction, dtype="float64")
    states = _run(dyn, x0, 4)
    x, y, v, ey = x0.copy(), x0.copy(), np.zeros_like(x0), np_quad(x0)
    cut = 0
    for s in states[1:]:
        m = np_gibbs(y, ey)
        h = (ey > np_quad(m[None])[0]).astype(float) if correction == "heaviside" else np.ones(len(x))
        cut += int(np.sum(h == 0))
        v = (inertia * v - lam * dt * h[:, None] * (x - m) - lam_mem * dt * (x - y)) / (inertia + gamma * dt)
        x = x + dt * v
        e = np_quad(x)
        better = e < ey
        y, ey = np.where(better[:, None], x, y), np.where(better, e, ey)
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(s.aux.v), v, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(s.aux.y), y, rtol=1e-12, atol=1e-13)
    assert (cut > 0) == (correction == "heaviside")  # the correction switched some pulls off


def test_pso_and_memory_default_memory_noise_is_lambda_memory_times_sigma():
    """``sigma_memory=None`` means ``λ_mem · σ1`` (CBXpy's default) for PSO and CBOMemory."""
    for cfg in (cj.dynamics.family.PSOConfig(sigma1=0.5, lambda_memory=0.4),
                cj.dynamics.family.CBOMemoryConfig(sigma1=0.5, lambda_memory=0.4)):
        assert cfg.extra_params().sigma_memory == pytest.approx(0.2, rel=1e-15)


def test_cbo_memory_step_pulls_to_consensus_then_to_memory():
    """CBOMemory without noise: ``x' = x - λ1 dt (x - m_α(y))``, then ``x'' = x' - λ_mem dt (x' - y)``."""
    lam, lam_mem, dt = 1.0, 0.7, 0.2
    x0 = _x0(seed=1)
    dyn = cj.cbo_memory(quad, lambda1=lam, lambda_memory=lam_mem, dt=dt, alpha=ALPHA, noise="none", dtype="float64")
    states = _run(dyn, x0, 4)
    x, y, ey = x0.copy(), x0.copy(), np_quad(x0)
    for s in states[1:]:
        m = np_gibbs(y, ey)
        x = x - lam * dt * (x - m)
        x = x - lam_mem * dt * (x - y)
        e = np_quad(x)
        better = e < ey
        y, ey = np.where(better[:, None], x, y), np.where(better, e, ey)
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(s.aux.y), y, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("build", ["cbo_memory", "pso"])
def test_memory_dynamics_two_noise_terms_are_independent_draws(build):
    """CBOMemory and PSO add two noise increments a step, ``σ1 √dt ξ`` for the drift to the
    consensus and ``σ_mem √dt ξ~`` for the drift to the memory; ``ξ`` and ``ξ~`` must be
    independent standard normals (two Brownian motions, ``dB`` and ``dB~``). The step-by-step
    CBXpy comparison hands CBXpy the draws cbo_jax made, so it cannot see one draw used twice.

    One step from N = 4096 particles in 2 dimensions, with no drift (``λ1 = λ_mem = 0``, PSO
    starting at rest) and the constant noise model (increments that do not depend on the
    drifts), ``σ1 = σ_mem = 1``: the step is ``√dt (ξ + ξ~)`` (PSO: ``dt √dt (ξ + ξ~) / (m + γ dt)``),
    whose entries have variance ``2 (1 + ρ)``, ``ρ`` the correlation of the two draws. Over
    n = 8192 entries the sample variance has a standard error of ``2 √(2/n)`` = 0.031, so
    ``ρ̂ = var/2 - 1`` is within 0.08 (5 standard errors) of 0; one draw used for both gives ρ = 1."""
    n, d, dt = 4096, 2, 0.04
    x0 = _x0(n=n, d=d, seed=7)
    common = dict(lambda1=0.0, lambda_memory=0.0, sigma1=1.0, sigma_memory=1.0, dt=dt, alpha=ALPHA,
                  noise="constant", dtype="float64")
    if build == "pso":
        inertia = 0.5
        dyn = cj.pso(quad, m=inertia, **common)
        scale = dt * np.sqrt(dt) / (inertia + (1 - inertia) * dt)
    else:
        dyn = cj.cbo_memory(quad, **common)
        scale = np.sqrt(dt)
    s0, s1 = _run(dyn, x0, 1)
    z = ((np.asarray(s1.x) - x0) / scale).ravel()  # ξ + ξ~, entry by entry
    entries = z.size
    assert abs(z.mean()) < 5 * np.sqrt(2.0 / entries), z.mean()
    rho = z.var() / 2.0 - 1.0
    assert abs(rho) < 5 * np.sqrt(2.0 / entries), rho


@pytest.mark.parametrize("build", ["cbo", "mirror_cbo"])
def test_resampling_kick_is_independent_of_the_step_noise(build):
    """The resampling kick ``σ_r √dt ξ_r`` (:mod:`cbo_jax.resampling`) draws from a stream of its
    own, ``fold_in(key, RESAMPLE_STREAM)``. Drawn with the step's key itself, it repeated the
    noise of every dynamic that draws its noise from that key (MirrorCBO, AdamCBO, PolarCBO, the
    constrained ones), and nothing in the default run failed.

    Two steps of N = 4096 particles in 2 dimensions, no drift, the constant noise model,
    ``σ1 = σ_r = 1`` and a trigger that fires from the second step on: the second step moves the
    particles by ``√dt (ξ + ξ_r)``, whose entries have variance ``2 (1 + ρ)``; ``ρ̂`` is within
    5 standard errors (``√(2/n)`` = 0.016) of 0 (as the memory dynamics' two draws above)."""
    n, d, dt = 4096, 2, 0.04
    x0 = _x0(n=n, d=d, seed=8)
    res = cj.resampling.Resampling(cj.resampling.UpdateStagnation(update_thresh=1e30), sigma=1.0)
    dyn = getattr(cj, build)(quad, lambda1=0.0, sigma1=1.0, dt=dt, alpha=ALPHA, noise="constant", resampling=res,
                             dtype="float64")
    _, s1, s2 = _run(dyn, x0, 2)
    assert int(s1.ctrl.resamplings) == 0 and int(s2.ctrl.resamplings) == 1  # the second step resampled
    z = ((np.asarray(s2.x) - np.asarray(s1.x)) / np.sqrt(dt)).ravel()  # ξ + ξ_r
    assert abs(z.mean()) < 5 * np.sqrt(2.0 / z.size), z.mean()
    rho = z.var() / 2.0 - 1.0
    assert abs(rho) < 5 * np.sqrt(2.0 / z.size), rho


def test_adam_cbo_step_is_bias_corrected_adam_on_the_drift():
    """AdamCBO (Chen, Jin, Lyu 2022, Alg. 1) without noise, four steps by hand."""
    lam, b1, b2, eps = 0.1, 0.9, 0.99, 1e-8
    x0 = _x0(seed=2)
    dyn = cj.adam_cbo(quad, lambda1=lam, beta1=b1, beta2=b2, eps=eps, dt=0.1, alpha=ALPHA, noise="none",
                      dtype="float64")
    states = _run(dyn, x0, 4)
    x, mom, vel = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for k, s in enumerate(states[1:], start=1):
        u = x - np_gibbs(x, np_quad(x))
        mom = b1 * mom + (1 - b1) * u
        vel = b2 * vel + (1 - b2) * u * u
        x = x - lam * (mom / (1 - b1 ** k)) / (np.sqrt(vel / (1 - b2 ** k)) + eps)
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-11, atol=1e-12)


def _fixed_noise(key, u, dt):
    """A noise model with no randomness (a callable noise, ``kind(key, u, dt)``): ``√dt u ∘ c``,
    so that a step with noise is a closed formula of the drift it is handed."""
    return jnp.sqrt(dt) * u * jnp.array([0.9, -1.3])


@pytest.mark.parametrize("noise", ["none", "fixed"])
@pytest.mark.parametrize("name", ["ProjectionBall", "ElasticNet"])
def test_mirror_cbo_moves_the_dual_variable(name, noise):
    """MirrorCBO: ``y_0 = ∇φ(x_0)``, ``y ← y - λ1 dt u + σ1 · noise(u)`` with the corrected drift
    ``u = H(E(x) - E(m)) (x - m)``, ``x = ∇φ*(y)`` (the dual variable keeps what the projection or
    shrinkage cuts off). The noise is handed the corrected drift too (as CBXpy's
    ``MirrorCBO.inner_step``): checked with a noise model without randomness, ``√dt u ∘ c``,
    where a noise term that dropped the correction moves the particles the correction stops
    (nothing in the default run saw that: CBXpy's MirrorCBO cases have no correction)."""
    lam, dt, sigma = 1.0, 0.3, 0.8
    c = np.array([0.9, -1.3])
    if name == "ProjectionBall":
        radius = 1.5  # not 1: the radius must enter as |y| / r
        mm, grad, conj = mirror_maps.ProjectionBall(radius=radius), (lambda x: x), (
            lambda y: y / np.maximum(1.0, np.linalg.norm(y, axis=-1, keepdims=True) / radius))
    else:
        delta, lamda = 0.5, 0.3
        mm = mirror_maps.ElasticNet(delta=delta, lamda=lamda)
        grad = lambda x: x / delta + lamda * np.sign(x)  # noqa: E731
        conj = lambda y: delta * np.sign(y) * np.maximum(np.abs(y) - lamda, 0)  # noqa: E731
    x0 = _x0(seed=3, lo=-4.0, hi=4.0)  # well outside the ball: the dual variable keeps what it cuts off
    dyn = cj.mirror_cbo(quad, mirror_map=mm, lambda1=lam, dt=dt, alpha=ALPHA, sigma1=sigma,
                        noise="none" if noise == "none" else _fixed_noise, correction="heaviside", dtype="float64")
    states = _run(dyn, x0, 4)
    y, x = grad(x0), x0.copy()  # the initial particles are taken as they are (not projected)
    np.testing.assert_allclose(np.asarray(states[0].x), x0, rtol=0, atol=0)
    cut = 0
    for s in states[1:]:
        e = np_quad(x)
        m = np_gibbs(x, e)
        h = (e > np_quad(m[None])[0]).astype(float)
        cut += int(np.sum(h == 0))
        u = h[:, None] * (x - m)
        y = y - lam * dt * u
        if noise == "fixed":
            y = y + sigma * np.sqrt(dt) * u * c
        x = conj(y)
        np.testing.assert_allclose(np.asarray(s.aux.y), y, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-12, atol=1e-13)
    assert cut > 0  # the correction stopped some particles


def _np_grad_hess(g, x):
    """∇g and the Hessian of a single-particle JAX function ``g`` at each row (float64)."""
    gr = np.asarray(jax.vmap(jax.grad(g))(jnp.asarray(x)))
    he = np.asarray(jax.vmap(jax.hessian(g))(jnp.asarray(x)))
    return gr, he


CONSTRAINTS = {
    "sphere": (lambda: cons.sphere(1.0), lambda x: np.sum(x * x, -1) - 1.0,
               lambda x: 2 * x, lambda x: np.broadcast_to(2 * np.eye(x.shape[1]), x.shape + (x.shape[1],))),
    "ellipse-function": (lambda: (lambda p: p[0] ** 2 + 2.0 * p[1] ** 2 - 1.0),
                         lambda x: x[:, 0] ** 2 + 2 * x[:, 1] ** 2 - 1.0,
                         lambda x: np.stack([2 * x[:, 0], 4 * x[:, 1]], -1),
                         lambda x: np.broadcast_to(np.diag([2.0, 4.0]), x.shape + (2,))),
    "quadric": (lambda: cons.quadric(np.array([[1.0, 0.5], [0.0, 2.0]]), np.array([0.2, -0.1]), -1.0),
                lambda x: np.einsum("na,ab,nb->n", x, np.array([[1.0, 0.5], [0.0, 2.0]]), x) + x @ np.array([0.2, -0.1]) - 1.0,
                lambda x: x @ np.array([[2.0, 0.5], [0.5, 4.0]]) + np.array([0.2, -0.1]),
                lambda x: np.broadcast_to(np.array([[2.0, 0.5], [0.5, 4.0]]), x.shape + (2,))),
}


@pytest.mark.parametrize("name", ["sphere", "ellipse-function"])
def test_drift_constrained_step_is_the_semi_implicit_solve(name):
    """Drift-constrained CBO without noise: ``(I + f ∇²G) Δ = λ1 dt (x - m) + f ∇G``, ``x ← x - Δ``,
    ``G = Σ g²`` (``∇G = 2 g ∇g``, ``∇²G = 2 (∇g ∇gᵀ + g H)``), ``f = dt/ε``."""
    make, g_np, dg_np, h_np = CONSTRAINTS[name]
    lam, dt, eps = 1.0, 0.05, 0.1
    x0 = _x0(seed=4, lo=-1.5, hi=1.5)
    dyn = cj.drift_constrained_cbo(quad, constraints=make(), lambda1=lam, dt=dt, eps=eps, alpha=ALPHA, noise="none",
                                   dtype="float64")
    states = _run(dyn, x0, 3)
    x, f = x0.copy(), dt / eps
    for s in states[1:]:
        m = np_gibbs(x, np_quad(x))
        g, dg, H = g_np(x), dg_np(x), h_np(x)
        rhs = lam * dt * (x - m) + f * 2 * g[:, None] * dg
        A = np.eye(2) + 2 * f * (dg[:, :, None] * dg[:, None, :] + g[:, None, None] * H)
        x = x - np.linalg.solve(A, rhs[..., None])[..., 0]
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("name", ["sphere", "quadric", "ellipse-function"])
def test_reg_combination_step_and_penalised_objective(name):
    """RegCombinationCBO without noise: the consensus of ``f + (1/ν) Σ g²`` and
    ``(I + 2f g H) x_new = x̃ - 2f g (∇g - H x)``, ``x̃ = x - λ1 dt (x - m)``, ``f = dt/ε``."""
    make, g_np, dg_np, h_np = CONSTRAINTS[name]
    lam, dt, eps, nu = 1.0, 0.05, 0.2, 0.25
    x0 = _x0(seed=5, lo=-1.5, hi=1.5)
    dyn = cj.reg_combination_cbo(quad, constraints=make(), lambda1=lam, dt=dt, eps=eps, nu=nu, alpha=ALPHA,
                                 noise="none", dtype="float64")
    states = _run(dyn, x0, 3)
    np.testing.assert_allclose(np.asarray(states[0].energy), np_quad(x0) + g_np(x0) ** 2 / nu, rtol=1e-12)
    x, f = x0.copy(), dt / eps
    for s in states[1:]:
        m = np_gibbs(x, np_quad(x) + g_np(x) ** 2 / nu)
        g, dg, H = g_np(x), dg_np(x), h_np(x)
        x_tilde = x - lam * dt * (x - m)
        rhs = x_tilde - 2 * f * g[:, None] * (dg - np.einsum("nab,nb->na", H, x))
        A = np.eye(2) + 2 * f * g[:, None, None] * H
        x = np.linalg.solve(A, rhs[..., None])[..., 0]
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-11, atol=1e-12)


def test_hypersurface_sphere_step_projects_the_tangent_drift():
    """Hypersurface CBO on the unit sphere without noise: ``x ← P(x + T_x(-λ1 dt (x - m)))``,
    ``T_x z = z - x̂ (x̂·z)``, ``P`` the normalisation."""
    lam, dt = 1.0, 0.1
    x0 = _x0(seed=6, d=3)
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    dyn = cj.hypersurface_cbo(quad, lambda1=lam, dt=dt, alpha=ALPHA, noise="none", dtype="float64")
    states = _run(dyn, x0, 3)
    x = x0.copy()
    for s in states[1:]:
        t = -lam * dt * (x - np_gibbs(x, np_quad(x)))
        xh = x / np.linalg.norm(x, axis=1, keepdims=True)
        x = x + t - xh * np.sum(xh * t, axis=1, keepdims=True)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        np.testing.assert_allclose(np.asarray(s.x), x, rtol=1e-12, atol=1e-13)


# Noise terms: three steps against CBXpy 1.0.4 with the same draws (cbo_jax._cbx_compare), for
# dynamics whose noise the default run does not otherwise compare.
SHORT_CBX = ["pso-anisotropic", "hypersurface_cbo-sphere-anisotropic", "hypersurface_cbo-sphere-isotropic",
             "cbs-sampling", "cbs-optimization", "polar_cbo-covariance", "cbo-heaviside-reg"]


@pytest.mark.parametrize("name", SHORT_CBX)
def test_noise_terms_match_cbxpy_for_three_steps(name):
    pytest.importorskip("cbx")
    import _cbx_compare as C  # tests/_cbx_compare.py

    r = C.compare(C.get_case(name), n=8, steps=3)
    assert r["max_diff"] <= 1e-10, r["max_diff"]
