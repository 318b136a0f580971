"""Statistics of the Euler–Maruyama increments and closed-form contraction.

Noise tests draw n = 200 000 increments of one particle and compare sample moments
with the exact Gaussian ones. Tolerance: 6 standard errors of the estimator (for a
mean, sd/sqrt(n); for a variance s², s² sqrt(2/(n-1)); for a covariance of
independent components, s_a s_b / sqrt(n)), so a correct kernel fails with
probability below 1e-8 per check, while a wrong scale (for example a missing √dt,
or |u|² instead of |u|) is off by hundreds of standard errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import _xla_cpu, sde

from _stack import enable_x64


N_SAMPLES = 200_000
K_SE = 6.0


def _increments(noise, u, dt, lambda1, sigma1, grad=None, lambda2=0.0, sigma2=0.0, seed=0):
    d = u.shape[0]
    m = jnp.zeros((d,), jnp.float32)
    x = jnp.broadcast_to(jnp.asarray(u, jnp.float32), (N_SAMPLES, d))
    g = None if grad is None else jnp.broadcast_to(jnp.asarray(grad, jnp.float32), (N_SAMPLES, d))
    new = sde.euler_maruyama(
        jax.random.key(seed), x, m, dt=dt, lambda1=lambda1, sigma1=sigma1, noise=noise, grad=g, lambda2=lambda2, sigma2=sigma2
    )
    return np.asarray(new, np.float64) - np.asarray(x, np.float64)


def _check_moments(inc, mean, cov):
    n = inc.shape[0]
    emp_mean = inc.mean(0)
    emp_cov = np.cov(inc.T)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_array_less(np.abs(emp_mean - mean), K_SE * sd / np.sqrt(n) + 1e-7)
    var_se = np.diag(cov) * np.sqrt(2.0 / (n - 1))
    np.testing.assert_array_less(np.abs(np.diag(emp_cov) - np.diag(cov)), K_SE * var_se + 1e-9)
    off = ~np.eye(len(mean), dtype=bool)
    assert np.all(np.abs(emp_cov[off] - cov[off]) < K_SE * np.outer(sd, sd)[off] / np.sqrt(n) + 1e-9)


def test_anisotropic_noise_mean_and_covariance():
    u = np.array([0.5, -2.0, 1.5, 0.0], np.float64)  # θ - m; a zero component gets no noise
    dt, lam, sig = 0.01, 1.0, 3.0
    inc = _increments("anisotropic", u, dt, lam, sig)
    _check_moments(inc, -lam * dt * u, np.diag(sig**2 * dt * u**2))
    assert np.all(inc[:, 3] == 0.0)


def test_isotropic_noise_mean_and_covariance():
    u = np.array([0.5, -2.0, 1.5], np.float64)
    dt, lam, sig = 0.05, 2.0, 0.7
    inc = _increments("isotropic", u, dt, lam, sig)
    _check_moments(inc, -lam * dt * u, np.eye(3) * sig**2 * dt * np.sum(u**2))


def test_gradient_drift_and_gradient_noise_moments():
    u = np.array([1.0, -1.0, 0.5], np.float64)
    g = np.array([0.3, 2.0, -1.0], np.float64)
    dt, lam1, sig1, lam2, sig2 = 0.02, 1.0, 0.5, 3.0, 0.8
    inc = _increments("anisotropic", u, dt, lam1, sig1, grad=g, lambda2=lam2, sigma2=sig2)
    mean = -lam1 * dt * u - lam2 * dt * g
    cov = np.diag(sig1**2 * dt * u**2) + np.eye(3) * sig2**2 * dt * np.sum(g**2)
    _check_moments(inc, mean, cov)


def test_pytree_isotropic_noise_uses_whole_vector_norm():
    u = {"a": jnp.full((N_SAMPLES, 2), 1.0), "b": jnp.full((N_SAMPLES, 1), 2.0)}
    m = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
    new = sde.euler_maruyama(jax.random.key(3), u, m, dt=0.04, lambda1=0.0, sigma1=1.0, noise="isotropic")
    var = np.var(np.asarray(new["b"][:, 0]) - 2.0)
    expected = 0.04 * (1 + 1 + 4)  # σ² dt |u|² with |u|² over both leaves
    assert abs(var - expected) < K_SE * expected * np.sqrt(2.0 / N_SAMPLES)


@pytest.mark.parametrize("lam,dt", [(1.0, 0.01), (3.0, 0.001)])
def test_noiseless_drift_contracts_as_exp_minus_lambda_t(lam, dt):
    """With α = 0 the consensus is the plain mean, which the noiseless drift keeps fixed;
    then θ_i(t) - m = e^{-λ t} (θ_i(0) - m) exactly in continuous time and
    (1 - λ dt)^k (θ_i(0) - m) for Euler–Maruyama."""
    import cbo_jax as cj

    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(64, 5)).astype(np.float64)
    steps = int(round(1.0 / dt))
    cfg = cj.CBOConfig(lambda1=lam, sigma1=0.0, dt=dt, alpha=0.0, noise="none", dtype="float32")
    res = cj.simulate(cj.cbo(cj.objectives.Rastrigin(), cfg), x0, jax.random.key(0), steps)
    m = x0.mean(0)
    got = np.asarray(res.state.x, np.float64) - m
    np.testing.assert_allclose(got, (1 - lam * dt) ** steps * (x0 - m), rtol=2e-4, atol=1e-5)
    t = steps * dt
    # Euler–Maruyama vs the flow: relative error ≈ λ² t dt / 2.
    rel = np.abs((1 - lam * dt) ** steps / np.exp(-lam * t) - 1)
    assert rel < lam**2 * t * dt
    np.testing.assert_allclose(got, np.exp(-lam * t) * (x0 - m), rtol=2 * rel + 2e-4, atol=1e-5)


def test_gradient_drift_alone_is_gradient_descent():
    import cbo_jax as cj

    x0 = np.random.default_rng(1).normal(size=(10, 3))
    cfg = cj.CBOConfig(lambda1=0.0, sigma1=0.0, lambda2=2.0, dt=0.01, alpha=1.0, noise="none")
    res = cj.simulate(cj.cbo(cj.objectives.Quadratic(shift=0.5), cfg), x0, jax.random.key(0), 100)
    np.testing.assert_allclose(np.asarray(res.state.x), 0.5 + (1 - 0.02) ** 100 * (x0 - 0.5), rtol=1e-4, atol=1e-5)


# --- the draw layout: agent axis last, written out in its own kernel on XLA:CPU ----------


def _reference_draw(key, shape, dtype):
    return jnp.moveaxis(jax.random.normal(key, tuple(shape[1:]) + (shape[0],), dtype), -1, 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("raw_key", [False, True])
def test_normal_like_is_the_moved_jax_draw_bit_for_bit(dtype, raw_key):
    """The kernel boundary changes no number: jitted, vmapped, typed or raw keys, a pytree."""
    with enable_x64(dtype == jnp.float64):
        key = jax.random.PRNGKey(3) if raw_key else jax.random.key(3)
        tree = {"w": jnp.zeros((7, 3, 2), dtype), "b": jnp.zeros((7,), dtype)}
        got = jax.jit(sde.normal_like)(key, tree)
        kb, kw = jax.random.split(key)  # leaves in tree order: "b", "w"
        np.testing.assert_array_equal(got["w"], _reference_draw(kw, (7, 3, 2), dtype))
        np.testing.assert_array_equal(got["b"], jax.random.normal(kb, (7,), dtype))
        keys = jax.random.split(key, 4)
        x = jnp.zeros((5, 6), dtype)
        batched = jax.jit(jax.vmap(sde.normal_like, in_axes=(0, None)))(keys, x)
        for r in range(4):
            np.testing.assert_array_equal(batched[r], _reference_draw(keys[r], (5, 6), dtype))


def test_draw_is_a_kernel_of_its_own_on_cpu():
    """XLA keeps the conditional around the draw (its predicate is not a constant it can fold).

    If XLA folded it, the normal transform would fuse into the transposing update again,
    1.3x slower per CBO step on the CPU (benchmarks/RESULTS_cbx.md), with equal numbers.
    """
    if jax.default_backend() != "cpu":
        pytest.skip("the boundary is only placed on XLA:CPU")

    def step(key, x):
        return x + x * sde.normal_like(key, x)

    hlo = jax.jit(step).lower(jax.random.key(0), jnp.ones((64, 8), jnp.float32)).compile().as_text()
    assert " conditional(" in hlo
    # several runs (num_runs, sweeps): still one conditional, not a select XLA fuses away
    keys = jax.random.split(jax.random.key(0), 3)
    hlo_runs = jax.jit(jax.vmap(step)).lower(keys, jnp.ones((3, 64, 8), jnp.float32)).compile().as_text()
    assert " conditional(" in hlo_runs
    # the switch really removes it (the comparison above is about the boundary, not the jit)
    old = _xla_cpu._WRITE_OUT_ON_CPU
    _xla_cpu._WRITE_OUT_ON_CPU = False
    try:
        hlo_off = jax.jit(lambda k, x: step(k, x)).lower(jax.random.key(0), jnp.ones((64, 8), jnp.float32))
        assert " conditional(" not in hlo_off.compile().as_text()
    finally:
        _xla_cpu._WRITE_OUT_ON_CPU = old


def test_written_out_is_differentiable_as_the_identity():
    key = jax.random.key(0)
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(3, 2)

    def f(x):
        return jnp.sum(_xla_cpu.written_out(x * x, key))

    np.testing.assert_array_equal(jax.grad(f)(x), 2 * x)
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.grad(f)))(jnp.stack([x, -x])), jnp.stack([2 * x, -2 * x]))
    _, tangent = jax.jvp(f, (x,), (jnp.ones_like(x),))
    assert float(tangent) == float(jnp.sum(2 * x))


def test_a_constrained_step_is_differentiable_in_the_positions():
    """reg_combination_cbo writes its solve out (_xla_cpu.written_out): gradients still flow through it."""
    import cbo_jax as cj

    x0 = np.random.default_rng(0).uniform(-1, 1, (16, 3)).astype(np.float32)
    dyn = cj.reg_combination_cbo(cj.objectives.Sphere(), constraints=[cj.constraints.sphere(1.0)],
                                 lambda1=1.0, sigma1=0.5, dt=0.01, alpha=10.0)
    state = jax.jit(dyn.init)(jnp.asarray(x0), jax.random.key(1))  # jitted: one compile, not op by op

    def moved(x):
        return jnp.sum(dyn.step(state._replace(x=x)).x)

    g = jax.jit(jax.grad(moved))(state.x)
    assert g.shape == x0.shape and bool(jnp.all(jnp.isfinite(g)))
    # against central differences in one coordinate (float32: loose tolerance)
    e = jnp.zeros_like(state.x).at[3, 1].set(1e-2)
    moved_jit = jax.jit(moved)  # compiled once for both sides
    fd = (moved_jit(state.x + e) - moved_jit(state.x - e)) / 2e-2
    np.testing.assert_allclose(float(g[3, 1]), float(fd), rtol=5e-2, atol=5e-3)


def test_noise_kind_is_checked_also_without_noise_and_none_is_no_diffusion():
    """A misspelt ``noise`` passed silently when σ1 was a Python 0 (and was refused
    otherwise); ``diffusion("none", ...)`` refused "none" while listing it as a choice."""
    x = jnp.ones((3, 2))
    with pytest.raises(ValueError, match="isotrpic"):
        sde.euler_maruyama(jax.random.key(0), x, jnp.zeros(2), dt=0.1, lambda1=1.0, sigma1=0.0, noise="isotrpic")
    np.testing.assert_array_equal(sde.diffusion("none", x, jnp.full((3, 2), 5.0)), jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="unknown noise kind"):
        sde.diffusion("sideways", x, x)


def test_euler_maruyama_negative_dt_is_refused_not_nan():
    x = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="dt must be a finite number >= 0"):
        sde.euler_maruyama(jax.random.key(0), x, jnp.zeros(2), dt=-0.1, lambda1=1.0, sigma1=1.0)
    out = sde.euler_maruyama(jax.random.key(0), x, jnp.zeros(2), dt=0.1, lambda1=1.0, sigma1=0.0)
    np.testing.assert_allclose(np.asarray(out), 0.9, rtol=1e-6)  # the noiseless step (1 - λ dt) x
