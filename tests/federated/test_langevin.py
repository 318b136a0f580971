"""The SGLD oracle of FedSGLD (cbo_jax.federated.langevin): its stationary law, step sizes, clipping, Poisson gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated.langevin import OracleSpec, SGLDConfig, sgld_oracle, step_sizes, temperature
from cbo_jax.models import logistic_regression


A_DIAG = jnp.array([1.0, 4.0])
M_TRUE = jnp.array([1.0, -2.0])


def _quadratic_grad(x, key):
    """∇F for F(x) = ½ (x - m)ᵀ diag(a) (x - m): exp(-F/T) is N(m, T / a)."""
    del key
    return A_DIAG * (x - M_TRUE)


def _chains(spec, num_chains=8000, seed=0):
    keys = jax.random.split(jax.random.key(seed), num_chains)
    run = jax.jit(jax.vmap(lambda k: sgld_oracle(_quadratic_grad, jnp.zeros(2), k, spec)))
    return run(keys)


def test_langevin_oracle_samples_gibbs_measure_of_quadratic(optimized_xla):
    """Quadratic F, no clipping: the oracle's iterates sample exp(-F/T), T = ε²/2.

    8000 independent chains, Q0 = 1000 burn-in steps at η = 0.01 (mixing time 1/(ηa) ≤ 100
    steps) and 500 decaying steps. Closed form: mean m, variance T / a per coordinate.
    Tolerances: the mean within 4 Monte-Carlo standard errors; the variance within 6 %
    (Monte-Carlo error 1.6 %; the Euler bias 1/(1 - ηa/2) is at most 2 % at the burn-in
    step and shrinks with the decaying steps).
    """
    noise = 0.5
    T = temperature(noise)
    assert T == pytest.approx(0.125)
    spec = SGLDConfig(steps=1500, burn_in=1000, lr=0.01, noise=noise, clip_norm=None, decay=True, average="uniform")
    res = _chains(spec)
    x = np.asarray(res.last, np.float64)
    var_true = T / np.asarray(A_DIAG)
    n = x.shape[0]
    assert np.all(np.abs(x.mean(0) - np.asarray(M_TRUE)) < 4 * np.sqrt(var_true / n))
    np.testing.assert_allclose(x.var(0), var_true, rtol=0.06)
    # The running average estimates the mean (unbiased) with a smaller spread than one sample.
    avg = np.asarray(res.average, np.float64)
    assert np.all(np.abs(avg.mean(0) - np.asarray(M_TRUE)) < 4 * np.sqrt(var_true / n))
    assert np.all(avg.var(0) < 0.85 * x.var(0))
    assert float(res.clipped.max()) == 0.0


def test_fixed_step_oracle_matches_exact_discrete_stationary_variance():
    """With a fixed large step the chain is AR(1): variance ε² / (a (2 - ηa)), not T/a.

    η = 0.1, a = 4: the exact discrete variance is 1.25 T/a, which the test separates
    from the continuous-time value (a wrong noise scale such as sqrt(2η)ε fails too).
    """
    noise, eta = 0.5, 0.1
    spec = OracleSpec(steps=300, burn_in=300, lr=eta, noise=noise, clip_norm=None, sampling_rate=1.0, decay=False,
                      average="last", avg_decay=0.0)
    x = np.asarray(_chains(spec, seed=1).last, np.float64)
    a = np.asarray(A_DIAG)
    np.testing.assert_allclose(x.var(0), noise**2 / (a * (2 - eta * a)), rtol=0.06)


def test_step_sizes_and_clipping():
    spec = SGLDConfig(steps=6, burn_in=2, lr=0.1).spec()
    np.testing.assert_allclose(step_sizes(spec), [0.1, 0.1, 0.1, 0.1 * 2 ** (-1 / 3), 0.1 * 3 ** (-1 / 3),
                                                  0.1 * 4 ** (-1 / 3)], rtol=1e-6)
    # One oracle step from x = 0 with a constant gradient of global norm 5, clipped at C = 1
    # (optax's global-norm clipping): x = -η h / 5; with C = 10 nothing is clipped.
    grad = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}
    x0 = jax.tree_util.tree_map(jnp.zeros_like, grad)
    for clip, scale, did in ((1.0, 0.2, 1.0), (10.0, 1.0, 0.0)):
        one = OracleSpec(steps=1, burn_in=1, lr=0.1, noise=0.0, clip_norm=clip, sampling_rate=1.0, decay=False,
                         average="last", avg_decay=0.0)
        res = sgld_oracle(lambda x, k: grad, x0, jax.random.key(0), one)
        np.testing.assert_allclose(res.last["a"], [-0.1 * 3.0 * scale, 0.0], rtol=1e-6)
        np.testing.assert_allclose(res.last["b"], [-0.1 * 4.0 * scale], rtol=1e-6)
        assert float(res.clipped) == did


def test_poisson_gradient_is_unbiased():
    """The masked sum over a Bernoulli(q) draw, divided by q·n, averages to the full gradient.

    The bounds come from the estimator's exact standard error: with g_j the gradient of sample j
    (n real rows), one draw ĝ = (1/(q n)) Σ_j m_j g_j, m_j ~ Bernoulli(q), has variance
    (1-q)/q · Σ_j g_j² / n² per entry. Over N = 20000 draws each entry of the mean is within 4.5
    standard errors of the full gradient, and so is its projection on the full gradient's
    direction, whose standard error is 0.7 % of the gradient: a bias of 10 % (a factor 1.1 or
    0.9 anywhere in the estimator) is 13 standard errors there and fails. An atol of 0.04 on
    entries of 0.02-0.33 let it pass."""
    from cbo_jax.federated.langevin import poisson_grad

    model = logistic_regression(4, 3, zero_init=False)  # every logit differs: no entry of the gradient is 0
    params = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (12, 4))
    y = jnp.array([0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 1, 0])
    count, q, draws = 9, 0.3, 20_000  # rows 9..11 are padding and must never count
    # compiled (op by op, the three gradients took seconds)
    grad = jax.jit(lambda xs, k, q: poisson_grad(model, params, xs, y, count, k, q), static_argnums=2)
    full = grad(x, jax.random.key(2), 1.0)
    sampled = jax.jit(jax.vmap(lambda k: grad(x, k, q)))(jax.random.split(jax.random.key(3), draws))
    one_loss = lambda p, xi, yi: model.loss(model.apply(p, xi[None]), yi[None])[0]  # noqa: E731
    per_sample = jax.jit(jax.vmap(jax.grad(one_loss), in_axes=(None, 0, 0)))(params, x[:count], y[:count])

    def flat(tree, rows=()):
        return np.concatenate([np.reshape(np.asarray(leaf, np.float64), rows + (-1,))
                               for leaf in jax.tree_util.tree_leaves(tree)], -1)

    g_full, g_mean, g_j = flat(full), flat(sampled, (draws,)).mean(0), flat(per_sample, (count,))
    np.testing.assert_allclose(g_j.mean(0), g_full, rtol=1e-5, atol=1e-7)  # the per-sample gradients are the right ones
    assert np.abs(g_full).min() > 0.02
    se = np.sqrt((1 - q) / q * (g_j ** 2).sum(0) / count ** 2 / draws)
    z = (g_mean - g_full) / se
    assert np.abs(z).max() < 4.5, z
    norm2 = g_full @ g_full
    relative = (g_mean - g_full) @ g_full / norm2  # the relative bias along the full gradient
    relative_se = np.sqrt((1 - q) / q * ((g_j @ g_full) ** 2).sum() / count ** 2 / draws) / norm2
    assert relative_se < 0.1 / 12, relative_se
    assert abs(relative) < 4.5 * relative_se, (relative, relative_se)
    x_pad = x.at[9:].set(100.0)
    np.testing.assert_allclose(flat(grad(x_pad, jax.random.key(2), 1.0)), g_full, rtol=1e-5)


@pytest.mark.parametrize("q0, q", [(10, 10), (11, 10)])
def test_burn_in_must_be_below_steps(q0, q):
    with pytest.raises(ValueError, match=r"burn_in \(Q0\)"):
        SGLDConfig(steps=q, burn_in=q0)
