"""FedSGLD's variants (issue 16): the chain's start (Algorithm 2) and per-sample clipping
with its per-device privacy accounting."""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated import privacy
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.fedsgld import FedSGLDConfig, fedsgld
from cbo_jax.federated.langevin import SGLDConfig, poisson_clipped_grad, poisson_grad
from cbo_jax.models import logistic_regression

# ----------------------------------------------------------------------------- per-sample clipping


def _tiny_problem():
    """4 features, 3 classes, 12 padded rows of which 9 are real; inputs spread so that
    some per-sample gradient norms lie above C = 1.5 and some below."""
    model = logistic_regression(4, 3)
    rng = np.random.default_rng(0)
    params = {"params": {"Dense_0": {"kernel": jnp.asarray(rng.normal(0, 0.5, (4, 3)), jnp.float32),
                                     "bias": jnp.asarray(rng.normal(0, 0.5, 3), jnp.float32)}}}
    x = rng.normal(0, 1, (12, 4)) * np.array([0.1, 0.3, 1, 3, 0.2, 2, 0.5, 4, 0.05, 1, 1, 1])[:, None]
    x[9:] = 50.0  # padding rows: huge inputs that must never count
    y = np.arange(12) % 3
    return model, params, jnp.asarray(x, jnp.float32), jnp.asarray(y), 9


def _numpy_per_sample(params, x, y):
    """float64 per-sample gradients of the cross-entropy of logits = x W + b: (n, 4, 3), (n, 3)."""
    w = np.asarray(params["params"]["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["params"]["Dense_0"]["bias"], np.float64)
    x = np.asarray(x, np.float64)
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = p - np.eye(3)[np.asarray(y)]
    return np.einsum("nf,nc->nfc", x, d), d


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_per_sample_clipped_gradient_matches_numpy_float64(q):
    model, params, x, y, count = _tiny_problem()
    C, key = 1.5, jax.random.key(7)
    g, share = jax.jit(lambda p, k: poisson_clipped_grad(model, p, x, y, count, k, q, C))(params, key)

    gw, gb = _numpy_per_sample(params, x, y)
    norms = np.sqrt((gw**2).sum((1, 2)) + (gb**2).sum(1))
    real = np.arange(12) < count
    # The Poisson mask is poisson_grad's draw: Bernoulli(q) over the padded rows, padding off.
    mask = real if q >= 1 else real & np.asarray(jax.random.bernoulli(key, q, (12,)))
    assert mask.sum() >= 3
    assert np.any(norms[mask] > C) and np.any(norms[mask] < C)  # the clip is active for some samples only
    factor = np.where(mask, np.minimum(1.0, C / norms), 0.0) / (q * count)
    np.testing.assert_allclose(g["params"]["Dense_0"]["kernel"], np.einsum("n,nfc->fc", factor, gw), rtol=2e-5,
                               atol=1e-6)
    np.testing.assert_allclose(g["params"]["Dense_0"]["bias"], np.einsum("n,nc->c", factor, gb), rtol=2e-5, atol=1e-6)
    assert float(share) == pytest.approx(np.sum(mask & (norms > C)) / mask.sum())

    # A clip norm above every per-sample norm: exactly the unclipped Poisson gradient, same draw.
    g_big, share_big = poisson_clipped_grad(model, params, x, y, count, key, q, 1e6)
    ref = poisson_grad(model, params, x, y, count, key, q)
    for a, b in zip(jax.tree_util.tree_leaves(g_big), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(share_big) == 0.0


def test_clipping_config_validates():
    with pytest.raises(ValueError, match="clipping"):
        SGLDConfig(clipping="per_layer")
    with pytest.raises(ValueError, match="per_sample"):
        SGLDConfig(clipping="per_sample", clip_norm=None)
    assert SGLDConfig().clipping == "batch" and SGLDConfig().spec().clipping == "batch"
    assert FedSGLDConfig().warm_start is False  # Algorithm 2's start is the default


# ----------------------------------------------------------------------------- accounting


def test_per_sample_accountant_by_hand_and_against_dp_accounting():
    """z_{q,i} = ε q n_i / (C sqrt(η_q)) per device; ε per device equals dp_accounting's
    RDP accountant composed step by step; the report's ε is the smallest device's."""
    import dp_accounting

    C, lr, noise, q, Q, Q0, delta, R = 2.0, 0.01, 0.5, 0.2, 6, 3, 1e-5, 4
    sizes = [45, 30, 100, 45]
    oracle = SGLDConfig(steps=Q, burn_in=Q0, lr=lr, noise=noise, clip_norm=C, sampling_rate=q, clipping="per_sample")
    cfg = FedSGLDConfig(oracle=oracle, delta=delta)
    rep = privacy.account(cfg, R, device_sizes=np.array(sizes))
    etas = [lr] * Q0 + [lr * (t - Q0) ** (-1 / 3) for t in range(Q0 + 1, Q + 1)]
    assert rep.device_epsilon.shape == (R, 4) and rep.per_device(4) is rep.device_epsilon
    for i, n in enumerate(sizes):
        zs = [noise * q * n / (C * np.sqrt(e)) for e in etas]  # = σ_q / Δ_i, σ_q = ε/sqrt(η_q), Δ_i = C/(q n_i)
        np.testing.assert_allclose(privacy.noise_multipliers(cfg, n), zs, rtol=1e-12)
        assert privacy.sensitivity(cfg, n) == pytest.approx(C / (q * n), rel=1e-12)
        if n in sizes[:i]:
            continue
        acc = dp_accounting.rdp.RdpAccountant()
        for z in zs:  # R rounds of the Q steps (RDP composes additively, in any order)
            acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), R)
        assert rep.device_epsilon[-1, i] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    # The smallest device (n = 30) is the least protected; more data, smaller ε.
    np.testing.assert_array_equal(rep.epsilon, rep.device_epsilon[:, 1])
    assert rep.device_epsilon[-1, 1] > rep.device_epsilon[-1, 0] == rep.device_epsilon[-1, 3] > rep.device_epsilon[-1, 2]
    assert np.all(np.diff(rep.epsilon) > 0)
    assert rep.sensitivity == pytest.approx(C / (q * 30)) and rep.clipping == "per_sample"
    np.testing.assert_allclose(rep.noise_multipliers, privacy.noise_multipliers(cfg, 30), rtol=1e-12)
    with pytest.raises(ValueError, match="device_sizes"):
        privacy.account(cfg, R)
    with pytest.raises(ValueError, match="n_i"):
        privacy.account(cfg, R, device_sizes=[45, 0])

    # Batch clipping at C_b = C / (2 q n_min) has the same multipliers, hence the same ε.
    from cbo_jax.experiments.fedsgld_synthetic import SyntheticRunConfig, matched_batch_clip_norm

    run_cfg = SyntheticRunConfig(steps=Q, burn_in=Q0, lr=lr, per_sample_clip_norm=C, sampling_rate=q)
    c_b = matched_batch_clip_norm(run_cfg, sizes)
    assert c_b == pytest.approx(C / (2 * q * 30))
    batch = dataclasses.replace(cfg, oracle=dataclasses.replace(oracle, clipping="batch", clip_norm=c_b))
    brep = privacy.account(batch, R, device_sizes=sizes)
    np.testing.assert_allclose(brep.epsilon, rep.epsilon, rtol=1e-9)
    assert brep.device_epsilon.shape == (R, 4) and np.all(brep.device_epsilon == brep.epsilon[:, None])


@pytest.mark.parametrize("clipping", ["per_sample", "batch"])
def test_privacy_metric_takes_device_sizes_and_goes_on_past_its_rounds(clipping):
    """The ``privacy`` evaluation metric: per-sample clipping with the device sizes, and a
    run extended beyond ``rounds`` (resume with extend) gets ε of its later rounds."""
    from cbo_jax.federated import metrics

    oracle = SGLDConfig(steps=6, burn_in=3, lr=0.01, noise=0.5, clip_norm=2.0, sampling_rate=0.2, clipping=clipping)
    cfg = FedSGLDConfig(oracle=oracle, delta=1e-5)
    kw = {"device_sizes": [45, 30, 100]} if clipping == "per_sample" else {}
    whole = privacy.account(cfg, 7, **kw).epsilon
    metric = metrics.privacy(cfg, 3, **kw)
    ev = lambda r: metrics.Evaluation(r, False, None, "server", None)  # noqa: E731
    assert [metric(ev(r))["epsilon"] for r in (3, 4, 7, 1)] == [whole[2], whole[3], whole[6], whole[0]]
    if clipping == "per_sample":
        with pytest.raises(ValueError, match="device_sizes"):
            metrics.privacy(cfg, 3)


# ----------------------------------------------------------------------------- the chain's start


def _data():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (2, 6, 4)).astype(np.float32)
    y = (np.arange(12).reshape(2, 6) % 3).astype(np.int32)
    counts = np.array([6, 4], np.int32)
    x[1, 4:] = 0.0
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


def _numpy_mean_grad(params, x, y, count):
    gw, gb = _numpy_per_sample(params, x[:count], y[:count])
    return gw.mean(0), gb.mean(0)


def test_chain_starts_at_broadcast_point_not_at_last_iterate():
    """One oracle step (Q = 1, no noise, no clipping, full batch): Algorithm 2's chain gives
    x = x0 - η ∇F_i(x0) whatever the last iterate; the warm start gives x - η ∇F_i(x)."""
    model = logistic_regression(4, 3)
    data = _data()
    oracle = SGLDConfig(steps=1, burn_in=0, lr=0.1, noise=0.0, clip_norm=None, sampling_rate=1.0, average="last")
    lr, gamma = 0.1, 2.0
    paper = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=gamma), 2)
    warm = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=gamma, warm_start=True), 2)
    state = paper.init(jax.random.key(0))
    rng = np.random.default_rng(2)
    x0 = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(0, 0.3, a.shape), a.dtype), state.x0)
    last = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(0, 0.3, a.shape) + 1.0, a.dtype), state.x)
    state = state._replace(x=last, x0=x0)
    other = state._replace(x=jax.tree_util.tree_map(lambda a: a - 3.0, last))

    step_p, step_w = jax.jit(paper.round), jax.jit(warm.round)
    new_p, _ = step_p(state, data)
    new_p2, _ = step_p(other, data)
    for a, b in zip(jax.tree_util.tree_leaves(new_p.x), jax.tree_util.tree_leaves(new_p2.x)):
        np.testing.assert_array_equal(a, b)  # the last iterate does not matter
    new_w, _ = step_w(state, data)
    for i in range(2):
        count = int(data.counts[i])
        for start, out in ((x0, new_p), (last, new_w)):
            p_i = jax.tree_util.tree_map(lambda a: np.asarray(a[i], np.float64), start)
            a_i = jax.tree_util.tree_map(lambda a: np.asarray(a[i], np.float64), x0)
            gw, gb = _numpy_mean_grad(p_i, np.asarray(data.x[i]), np.asarray(data.y[i]), count)
            k, b = p_i["params"]["Dense_0"]["kernel"], p_i["params"]["Dense_0"]["bias"]
            k0, b0 = a_i["params"]["Dense_0"]["kernel"], a_i["params"]["Dense_0"]["bias"]
            # λ = 0 at the start: h = ∇F_i(p) + γ (p - x0)
            np.testing.assert_allclose(out.x["params"]["Dense_0"]["kernel"][i], k - lr * (gw + gamma * (k - k0)),
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(out.x["params"]["Dense_0"]["bias"][i], b - lr * (gb + gamma * (b - b0)),
                                       rtol=1e-5, atol=1e-6)


def test_per_sample_fedsgld_trains_and_reports_clipping():
    """FedSGLD with per-sample clipping on a small synthetic problem: the server model's
    objective (1/N) Σ_i F_i is finite and decreases, and ``clipped`` is the fraction of
    clipped per-sample gradients."""
    from cbo_jax.federated.synthetic import synthetic
    from cbo_jax.models import masked_loss

    data = synthetic(1.0, 1.0, seed=0, num_devices=6, max_samples=40).agent_data()
    model = logistic_regression()
    # No oracle noise: it is not what this test is about, and it triples the compile time.
    oracle = SGLDConfig(steps=4, burn_in=2, lr=0.02, noise=0.0, clip_norm=5.0, sampling_rate=0.3,
                        clipping="per_sample")
    alg = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=10.0), 6)
    objective = jax.jit(lambda p: jnp.mean(jax.vmap(
        lambda xi, yi, ci: masked_loss(model, p, xi, yi, jnp.arange(xi.shape[0]) < ci))(data.x, data.y, data.counts)))
    step, state, clipped = jax.jit(alg.round), alg.init(jax.random.key(0)), []
    losses = [float(objective(state.server))]
    for _ in range(4):
        state, info = step(state, data)
        losses.append(float(objective(state.server)))
        clipped.append(np.asarray(info.clipped))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[1] < losses[0] == pytest.approx(np.log(10))
    clipped = np.array(clipped)
    assert np.all((clipped >= 0) & (clipped <= 1)) and clipped[0].mean() > 0


# ----------------------------------------------------------------------------- the reproduction


def test_cli_rejects_bad_per_sample_clip_norm(capsys, tmp_path):
    from cbo_jax import cli

    rc = cli.main(["reproduce", "fedsgld-synthetic", "--output", str(tmp_path), "--no-progress",
                   "--per-sample-clip-norm", "0"])
    assert rc == 2
    assert "clip_norm" in capsys.readouterr().err


@pytest.mark.slow
def test_reproduction_json_has_every_variant(tmp_path):
    from cbo_jax.experiments import fedsgld_synthetic as exp

    ns = argparse.Namespace(rounds=2, steps=4, burn_in=2, lr=0.01, gamma=10.0, clip_norm=100.0, per_sample_clip_norm=5.0,
                            sampling_rate=0.1, server_momentum=0.0, delta=1e-5, data_seed=0, seed=0, max_samples=60,
                            no_matched_epsilon=False, output=str(tmp_path))
    res = exp.run(ns)
    for case in ("low_noise", "high_noise"):
        r = res[case]
        assert set(r["variants"]) == set(exp.VARIANTS)
        for v in r["variants"].values():
            assert np.isfinite(v["train_loss"]) and v["epsilon"] > 0
        # the default variant stays where it was
        assert r["fedsgld"]["train_loss"] == r["variants"]["paper_start_batch_clip"]["train_loss"]
        assert r["epsilon"] == r["variants"]["paper_start_batch_clip"]["epsilon"]
        assert "train_loss" in r["fedpd"] and isinstance(r["fedsgld_loss_at_most_fedpd"], bool)
    m = res["high_noise"]["matched_epsilon"]
    assert m["paper_start_batch_clip"]["epsilon"] == pytest.approx(m["paper_start_per_sample_clip"]["epsilon"],
                                                                   rel=1e-6)
    assert res["high_noise"]["variants"]["paper_start_per_sample_clip"]["epsilon"] <= 10
    assert (tmp_path / "training_loss_high_noise.png").is_file()
    # the equal-variance control: less noise than noisy FedPD's, so a larger privacy epsilon
    eq, noisy = res["high_noise"]["noisy_fedpd_equal_variance"], res["high_noise"]["noisy_fedpd"]
    assert eq["noise"] < noisy["noise"] == exp.HIGH_NOISE and eq["epsilon"] > noisy["epsilon"]
    assert isinstance(res["high_noise"]["fedsgld_lower_loss_than_noisy_fedpd_equal_variance"], bool)


def test_equal_variance_noise_is_fedsglds_injected_variance_per_round():
    """Noisy FedPD's control: ``ε'² Q η = ε² Σ_q η_q``, the steps ``η`` for ``q ≤ Q0`` and
    ``η (q - Q0)^(-1/3)`` after (closed form, float64); 0.757 of the variance at the defaults."""
    from cbo_jax.experiments.fedsgld_synthetic import SyntheticRunConfig, equal_variance_noise

    for steps, burn_in, lr in ((40, 20, 0.01), (7, 3, 0.2)):
        cfg = SyntheticRunConfig(steps=steps, burn_in=burn_in, lr=lr)
        total = lr * (burn_in + sum(k ** (-1.0 / 3.0) for k in range(1, steps - burn_in + 1)))
        assert equal_variance_noise(cfg, 0.5) == pytest.approx(0.5 * np.sqrt(total / (steps * lr)), rel=1e-6)
    assert (equal_variance_noise(SyntheticRunConfig(), 0.5) / 0.5) ** 2 == pytest.approx(0.75656, abs=1e-5)
