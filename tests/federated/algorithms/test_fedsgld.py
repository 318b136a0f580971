"""FedSGLD / FedPD, the SGLD oracle, the synthetic(α, β) data and the privacy accountant."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated import privacy
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, fedpd, fedsgld
from cbo_jax.federated.langevin import OracleSpec, SGLDConfig, sgld_oracle, step_sizes, temperature
from cbo_jax.federated.synthetic import synthetic
from cbo_jax.models import logistic_regression, mlp_mnist

# ----------------------------------------------------------------------------- oracle

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


# ----------------------------------------------------------------------------- data


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


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_models_logistic_and_mlp_still_usable():
    lr = logistic_regression()
    p = lr.init(jax.random.key(0))
    assert p["params"]["Dense_0"]["kernel"].shape == (60, 10)
    assert lr.apply(p, jnp.ones((5, 60))).shape == (5, 10)
    mlp = mlp_mnist()
    assert mlp.apply(mlp.init(jax.random.key(0)), jnp.zeros((2, 28, 28), jnp.uint8)).shape == (2, 10)


# ----------------------------------------------------------------------------- algorithms

SMALL = dict(seed=0, max_samples=200)
LOGREG = logistic_regression()  # one model object: the compiled scan is cached per (algorithm, model)


def _curves(alg, data, rounds, key=0):
    from cbo_jax.experiments.fedsgld_synthetic import train_curves

    return train_curves(alg, LOGREG, data, rounds, jax.random.key(key))


@pytest.fixture(scope="module")
def small_data():
    return synthetic(1.0, 1.0, **SMALL)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_fedpd_reduces_training_loss(small_data):
    alg = fedpd(LOGREG, FedPDConfig(local_steps=10, lr=0.01, gamma=10.0, sampling_rate=0.2), 30)
    c = _curves(alg, small_data, rounds=20)
    loss = c["train_loss"]
    assert loss[0] < np.log(10) + 1e-3  # zero-initialised model: log 10
    assert loss[-1] < 0.6 * np.log(10)
    assert loss[-1] < loss[4] < loss[0]
    assert c["test_acc"][-1] > 50


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_fedsgld_low_noise_trains_and_is_deterministic(small_data):
    cfg = FedSGLDConfig(oracle=SGLDConfig(steps=10, burn_in=5, lr=0.01, noise=1e-4, clip_norm=100.0,
                                          sampling_rate=0.2), gamma=10.0)
    alg = fedsgld(LOGREG, cfg, 30)
    c1 = _curves(alg, small_data, rounds=10)
    c2 = _curves(alg, small_data, rounds=10)
    c3 = _curves(alg, small_data, rounds=10, key=1)
    for k in c1:
        np.testing.assert_array_equal(c1[k], c2[k])
    assert not np.array_equal(c1["train_loss"], c3["train_loss"])
    assert c1["train_loss"][-1] < 0.8 * np.log(10)


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


# ----------------------------------------------------------------------------- privacy


def test_accountant_matches_dp_accounting_directly():
    import dp_accounting

    C, lr, noise, q, Q, Q0, delta = 1.0, 0.01, 0.5, 0.1, 8, 4, 1e-5
    cfg = FedSGLDConfig(oracle=SGLDConfig(steps=Q, burn_in=Q0, lr=lr, noise=noise, clip_norm=C, sampling_rate=q),
                        delta=delta)
    rep = privacy.account(cfg, rounds=5)
    assert rep.epsilon.shape == (5,) and np.all(np.isfinite(rep.epsilon))
    assert np.all(np.diff(rep.epsilon) > 0)
    assert rep.sensitivity == 2 * C
    # By hand: η_q = η for q <= Q0, then η (q - Q0)^(-1/3); z_q = noise / (2 C sqrt(η_q)).
    etas = [lr] * Q0 + [lr * (t - Q0) ** (-1 / 3) for t in range(Q0 + 1, Q + 1)]
    zs = [noise / (2 * C * np.sqrt(e)) for e in etas]
    np.testing.assert_allclose(rep.noise_multipliers, zs, rtol=1e-12)
    for rounds in (1, 5):
        acc = dp_accounting.rdp.RdpAccountant()
        for _ in range(rounds):
            for z in zs:
                acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
        assert rep.epsilon[rounds - 1] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    assert rep.per_device(30).shape == (5, 30)
    # Constant multiplier (noisy FedPD): one self-composed event of rounds·Q steps.
    pd_cfg = FedPDConfig(local_steps=Q, lr=lr, noise=noise, clip_norm=C, sampling_rate=q, delta=delta)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise / (2 * C * np.sqrt(lr)))),
                3 * Q)
    assert privacy.account(pd_cfg, rounds=3).epsilon[-1] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    # No noise or no clipping: no guarantee.
    assert np.isinf(privacy.account(FedPDConfig(), rounds=2).epsilon).all()
    assert np.isinf(privacy.account(dataclass_replace_clip_none(cfg), rounds=2).epsilon).all()


def dataclass_replace_clip_none(cfg):
    import dataclasses

    return dataclasses.replace(cfg, oracle=dataclasses.replace(cfg.oracle, clip_norm=None))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("clip", [0.0, -1.0, float("nan")])
def test_bad_clip_norm(clip):
    with pytest.raises(ValueError, match="clip_norm"):
        SGLDConfig(clip_norm=clip)
    with pytest.raises(ValueError, match="clip_norm"):
        FedPDConfig(clip_norm=clip)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        FedSGLDConfig(delta=delta)
    with pytest.raises(ValueError, match="delta"):
        privacy.account(FedSGLDConfig(), rounds=1, delta=delta)


@pytest.mark.parametrize("q0, q", [(10, 10), (11, 10)])
def test_burn_in_must_be_below_steps(q0, q):
    with pytest.raises(ValueError, match=r"burn_in \(Q0\)"):
        SGLDConfig(steps=q, burn_in=q0)


def test_cli_rejects_bad_input_before_any_work(monkeypatch, capsys, tmp_path):
    from cbo_jax import cli
    from cbo_jax.experiments import fedsgld_synthetic as exp

    def boom(*a, **k):
        raise AssertionError("data generated or compiled before validation")

    monkeypatch.setattr(exp, "synthetic", boom)
    monkeypatch.setattr(exp, "train_curves", boom)
    for flags, name in ((["--clip-norm", "0"], "clip_norm"), (["--delta", "1"], "delta"),
                        (["--burn-in", "40", "--steps", "40"], "burn_in")):
        rc = cli.main(["reproduce", "fedsgld-synthetic", "--output", str(tmp_path), "--no-progress", *flags])
        assert rc == 2
        assert name in capsys.readouterr().err


def test_experiment_config_validates():
    from cbo_jax.experiments.fedsgld_synthetic import SyntheticRunConfig, config_from_args

    with pytest.raises(ValueError, match="rounds"):
        SyntheticRunConfig(rounds=0)
    ns = argparse.Namespace(rounds=5, steps=4, burn_in=2, lr=0.01, gamma=1.0, clip_norm=1.0, sampling_rate=0.1,
                            server_momentum=0.0, delta=1e-5, data_seed=0, seed=0)
    assert config_from_args(ns).rounds == 5


def test_cli_curves_json_is_strict_and_progress_follows_the_flag(monkeypatch, tmp_path):
    """curves_*.json holds non-finite values as null (strict JSON), and the training runs
    show progress unless --no-progress."""
    import json

    from cbo_jax.experiments import fedsgld_synthetic as exp

    seen = []

    def fake_case(cfg, data, noise, noisy, fedpd_curves=None, matched=False, progress=False):
        seen.append(progress)
        curve = {"train_loss": np.array([1.0, np.nan, np.inf])}
        return ({"fedsgld": {"train_loss": 1.0}, "fedpd": {"train_loss": 2.0}},
                {"fedpd": curve, "fedsgld": curve, "paper_start_batch_clip": curve})

    monkeypatch.setattr(exp, "run_case", fake_case)
    monkeypatch.setattr(exp, "plot_curves", lambda *a, **k: None)
    ns = argparse.Namespace(rounds=2, steps=4, burn_in=2, lr=0.01, gamma=1.0, clip_norm=1.0, sampling_rate=0.1,
                            server_momentum=0.0, delta=1e-5, data_seed=0, seed=0, max_samples=5, output=str(tmp_path),
                            no_progress=False)
    exp.run(ns)
    ns.no_progress = True
    exp.run(ns)
    assert seen == [True, True, False, False]

    def strict(token):
        raise ValueError(f"non-standard JSON token {token}")

    for case in ("low_noise", "high_noise"):
        curves = json.loads((tmp_path / f"curves_{case}.json").read_text(), parse_constant=strict)
        assert curves["fedpd"]["train_loss"] == [1.0, None, None]


@pytest.mark.parametrize("orders, match", [
    ([], "non-empty"),
    (8.0, "1-D"),
    ([float("nan"), 8.0], "finite"),
    ([0.5, 8.0], ">= 1"),
])
def test_account_refuses_bad_orders(orders, match):
    """``orders=[]`` failed with NumPy's "argmin of an empty sequence", a scalar with "iteration
    over a 0-d array", and a NaN order was silently dropped by the library."""
    with pytest.raises(ValueError, match=f"orders.*{match}|{match}.*orders"):
        privacy.account(SGLDConfig(steps=4, burn_in=2), rounds=1, delta=1e-5, orders=orders)


@pytest.mark.parametrize("q", [0.0, 2.0, -0.1, float("nan")])
def test_round_event_refuses_a_sampling_rate_outside_0_1(q):
    """``round_event(cfg, sampling_rate=2.0)`` built a PoissonSampledDpEvent with probability 2
    (NaN likewise) without a word."""
    with pytest.raises(ValueError, match="sampling_rate"):
        privacy.round_event(SGLDConfig(steps=4, burn_in=2), sampling_rate=q)


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


def test_reproduction_model_has_the_benchmarks_classes_whatever_labels_occur():
    """``run_case`` sized the logistic regression by the largest training label + 1: with
    ``--max-samples 2 --data-seed 9`` no device holds class 9, so the "benchmark" model had 9
    classes (550 parameters, not 610) and a test label 9 could not be scored."""
    from cbo_jax.experiments import fedsgld_synthetic as exp

    data = synthetic(1.0, 1.0, seed=9, max_samples=2)
    assert int(data.y.max()) == 8  # the situation: class 9 in no training set
    model = exp.model_for(data)
    assert model.num_classes == 10 and model.name == "logreg-60-10"
