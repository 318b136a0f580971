"""FedSGLD and FedPD (cbo_jax.federated.algorithms.fedsgld): training, bad input, the reproduction.

The SGLD oracle, the synthetic(α, β) data and the privacy accountant have files of their own
(tests/federated/test_langevin.py, test_synthetic.py, test_privacy.py)."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, fedpd, fedsgld
from cbo_jax.federated.langevin import SGLDConfig
from cbo_jax.federated.padding import Layout
from cbo_jax.federated.synthetic import synthetic
from cbo_jax.models import logistic_regression

from _reference import logreg_grad, logreg_loss

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


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("clip", [0.0, -1.0, float("nan")])
def test_bad_clip_norm(clip):
    with pytest.raises(ValueError, match="clip_norm"):
        SGLDConfig(clip_norm=clip)
    with pytest.raises(ValueError, match="clip_norm"):
        FedPDConfig(clip_norm=clip)


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


def test_reproduction_model_has_the_benchmarks_classes_whatever_labels_occur():
    """``run_case`` sized the logistic regression by the largest training label + 1: with
    ``--max-samples 2 --data-seed 9`` no device holds class 9, so the "benchmark" model had 9
    classes (550 parameters, not 610) and a test label 9 could not be scored."""
    from cbo_jax.experiments import fedsgld_synthetic as exp

    data = synthetic(1.0, 1.0, seed=9, max_samples=2)
    assert int(data.y.max()) == 8  # the situation: class 9 in no training set
    model = exp.model_for(data)
    assert model.num_classes == 10 and model.name == "logreg-60-10"


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

LOGREG_3_2 = models.logistic_regression(3, 2)


def _agents(n=5, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


def _logreg_grad(theta, x, y, count):
    """:func:`_reference.logreg_grad` for a ``(kernel, bias)`` pair: the same pair of gradients."""
    g = logreg_grad({"params": {"Dense_0": {"kernel": theta[0], "bias": theta[1]}}}, x, y, count)
    return g["params"]["Dense_0"]["kernel"], g["params"]["Dense_0"]["bias"]


@pytest.mark.reference
@pytest.mark.parametrize("name", ["fedsgld", "fedpd"])
def test_primal_dual_round_by_hand_and_the_loss_of_the_returned_iterate(name):
    """FedSGLD Algorithms 1-2 for one round without noise or clipping, full batches: node i's
    chain starts at ``x0`` and takes ``Q`` steps ``x ← x - η_q ∇L_i(x)`` on
    ``L_i(x) = F_i(x) + <λ_i, x - x0> + (γ/2)||x - x0||²`` (``η_q = η (q - Q0)^(-1/3)`` after the
    burn-in); it returns the running average ``x_i`` of the post-burn-in iterates, from which
    ``λ_i ← λ_i + η_λ γ (x_i - x0)``; the state keeps the chain's *last* iterate (where a
    warm-started chain continues), and ``train_loss`` is ``F_i(x_i)`` at the returned average.
    FedPD (Zhang et al., FedPDConfig): the same with a fixed step, ``η_λ = 1``, and the last
    iterate returned. Float64 NumPy reference of the whole round."""

    n, steps, burn_in, lr, gamma = 3, 4, 1, 0.3, 0.5
    dual_lr = 0.5 if name == "fedsgld" else 1.0  # FedPD: λ ← λ + γ (x - x0)
    data = _agents(n, seed=4)
    if name == "fedsgld":
        oracle = SGLDConfig(steps=steps, burn_in=burn_in, lr=lr, noise=0.0, clip_norm=None, sampling_rate=1.0)
        cfg = FedSGLDConfig(oracle=oracle, gamma=gamma, dual_lr=dual_lr, warm_start=True)
        alg = fedsgld(LOGREG_3_2, cfg, n)
    else:
        cfg = FedPDConfig(local_steps=steps, lr=lr, gamma=gamma, sampling_rate=1.0)
        alg = fedpd(LOGREG_3_2, cfg, n)
    state = alg.init(jax.random.key(1))
    new, info = jax.jit(alg.round)(state, data)
    x, y, counts = np.asarray(data.x, np.float64), np.asarray(data.y), np.asarray(data.counts)
    leaf = lambda t, i, name: np.asarray(t["params"]["Dense_0"][name][i], np.float64)  # noqa: E731
    for i in range(n):
        x0 = (leaf(state.x0, i, "kernel"), leaf(state.x0, i, "bias"))
        lam = (leaf(state.lam, i, "kernel"), leaf(state.lam, i, "bias"))
        cur, post = x0, []
        for q in range(1, steps + 1):
            eta = lr if q <= burn_in or name == "fedpd" else lr * (q - burn_in) ** (-1.0 / 3.0)
            g = _logreg_grad(cur, x[i], y[i], counts[i])
            cur = tuple(c - eta * (gc + lc + gamma * (c - a)) for c, gc, lc, a in zip(cur, g, lam, x0))
            if q > burn_in:
                post.append(cur)
        avg = tuple(np.mean([p[k] for p in post], axis=0) for k in range(2)) if name == "fedsgld" else cur
        lam_new = tuple(lc + dual_lr * gamma * (a - b) for lc, a, b in zip(lam, avg, x0))
        for k, leaf_name in enumerate(("kernel", "bias")):
            assert np.max(np.abs(np.mean([p[k] for p in post], axis=0) - cur[k])) > 1e-3  # averaging matters
            np.testing.assert_allclose(leaf(new.x, i, leaf_name), cur[k], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(leaf(new.lam, i, leaf_name), lam_new[k], rtol=1e-5, atol=1e-6)
        theta = {"params": {"Dense_0": {"kernel": avg[0], "bias": avg[1]}}}
        np.testing.assert_allclose(float(info.train_loss[i]), logreg_loss(theta, x[i], y[i], counts[i]), rtol=1e-5)


# Mutation-testing gaps in FedSGLD / FedPD (cbo_jax.federated.algorithms.fedsgld).

@pytest.mark.reference
def test_server_average_is_over_the_real_nodes_only():
    """FedSGLD Algorithm 1: x0^new = (1/N) Σ_i x0_i^+ over the N real nodes. Inactive
    padding agents (AgentData.valid False, as a sharded run appends) send a zero message and
    must not enter the mean: the padded round's server model equals the unpadded one. A
    mutant dividing by all rows survived the default suite (the padded-vs-unpadded contract
    test of FedSGLD runs only in the slow step)."""
    model = models.logistic_regression(3, 2)
    rng = np.random.default_rng(0)
    n = 3
    data = AgentData(jnp.asarray(rng.normal(size=(n, 5, 3)), jnp.float32),
                     jnp.asarray(rng.integers(0, 2, (n, 5)), jnp.int32), jnp.asarray([5, 4, 3], jnp.int32))
    oracle = SGLDConfig(steps=2, burn_in=1, lr=0.1, noise=0.0, clip_norm=None, sampling_rate=1.0)
    alg = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=2.0), n)
    state = alg.init(jax.random.key(0))
    round_fn = jax.jit(alg.round)
    plain, _ = round_fn(state, data)
    lay = Layout(n, n + 2)
    padded, _ = round_fn(lay.pad_state(state), lay.pad_data(data))
    for a, b in zip(jax.tree_util.tree_leaves(plain.server), jax.tree_util.tree_leaves(padded.server)):
        assert np.max(np.abs(np.asarray(a))) > 1e-3
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
