"""The federated algorithms checked equation by equation against the papers, on tiny inputs
with float64 NumPy references (FedCBO, FedCB²O, FedSGLD)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated import privacy, selection
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, fedsgld
from cbo_jax.federated.langevin import SGLDConfig
from cbo_jax.federated.local import LocalSGDConfig, local_train

from _reference import f64, logreg_grad

TINY = models.mlp_mnist(hidden=(3,), num_classes=3, input_shape=(2, 2))


def _tiny_data(n, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, n_max, 2, 2)).astype(np.uint8)
    y = rng.integers(0, 3, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


# --------------------------------------------------------------------------- FedCBO Remark 3, eq. (21)


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_epsilon_greedy_never_duplicates_when_candidates_have_minus_inf_likelihood(eps):
    """Remark 3: M *distinct* others. Eq. (21) sets P[j, i] = -inf after a download with an
    infinite loss (a diverged model); such a candidate must still rank above the agents already
    picked at random and above j itself. The old kernel let top_k fill the greedy slots with the
    random picks again (agent 1 downloaded twice, agent 2 never)."""
    n, m = 4, 3  # every agent must download all three others
    P = selection.init_likelihood(n).at[0, 2].set(-jnp.inf).at[0, 3].set(-jnp.inf)
    draw = jax.jit(jax.vmap(lambda k, p, e: selection.draw_epsilon_greedy(k, p, m, e), in_axes=(0, None, None)))
    idx, is_random = draw(jax.random.split(jax.random.key(0), 20), P, jnp.float32(eps))
    for seed in range(20):
        for j, row in enumerate(np.asarray(idx[seed])):
            assert sorted(row.tolist()) == sorted(set(range(n)) - {j}), (seed, j, row)
    assert np.all(np.asarray(is_random).sum(axis=2) == int(eps * m))
    # With room to spare, the -inf candidates are still picked last (after every finite P).
    P = selection.init_likelihood(6).at[0, 1].set(-jnp.inf).at[0, 2].add(5.0).at[0, 3].add(3.0)
    idx, _ = jax.jit(selection.draw_epsilon_greedy, static_argnums=2)(jax.random.key(0), P, 4, jnp.float32(0.0))
    assert np.asarray(idx)[0].tolist()[:2] == [2, 3] and 1 not in np.asarray(idx)[0].tolist()


@pytest.mark.slow  # compiles a FedCBO round
def test_fedcbo_round_with_a_diverged_agent_downloads_distinct_others():
    """The same through whole FedCBO rounds: agent 3 diverges (NaN), every other agent's P
    entry for it becomes -inf by eq. (21), and with M = N - 1 they must still download each of
    the others exactly once (the diverged one with weight zero)."""
    n = 4
    data = _tiny_data(n, seed=1)
    cfg = FedCBOConfig(M=n - 1, local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.05), eps0=0.4, eps_decay=0.0,
                       eps_min=0.4)
    alg = fedcbo(TINY, cfg, n)
    state = alg.init(jax.random.key(0))
    step = jax.jit(alg.round)
    for _ in range(2):
        state = state._replace(params=jax.tree_util.tree_map(lambda a: a.at[3].set(jnp.nan), state.params))
        state, info = step(state, data)
        for j, row in enumerate(np.asarray(info.idx)[:3]):
            assert sorted(row.tolist()) == sorted(set(range(n)) - {j})
    assert np.all(np.isneginf(np.asarray(state.P)[:3, 3]))
    for leaf in jax.tree_util.tree_leaves(state.params):
        assert np.isfinite(np.asarray(leaf)[:3]).all()


def test_epsilon_schedule_values():
    """FedCBO Remark 3 and §2.4: ε(n) = max(0.5 - 0.01 n, 0.1) (round n counted from 0)."""
    n = np.arange(0, 60)
    np.testing.assert_allclose(np.asarray(selection.epsilon_schedule(jnp.asarray(n, jnp.float32))),
                               np.maximum(0.5 - 0.01 * n, 0.1), rtol=1e-6)


# --------------------------------------------------------------------------- FedCBO JMLR eq. (70)


@pytest.mark.slow  # three FedCBO compilations
@pytest.mark.parametrize("noise_gamma", [None, 0.01])
def test_fedcbo_appendix_e_noise_isotropic_uses_the_global_norm(noise_gamma):
    """JMLR Appendix E, eq. (70): θ ← θ - λ1γ(θ - m) + σ1 √γ |θ - m| z (isotropic: |·| the
    Euclidean norm over the whole model) or + σ1 √γ (θ - m) ∘ z (anisotropic), with the same
    z for the same key. Recovered from three runs that share every random draw."""
    n, m, sigma1 = 5, 2, 0.3
    data = _tiny_data(n, seed=2)
    base = dict(M=m, lambda1=4.0, gamma=0.1, alpha=2.0, sigma1=sigma1, noise_gamma=noise_gamma,
                local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.05))
    runs = {}
    for noise in ("none", "isotropic", "anisotropic"):
        alg = fedcbo(TINY, FedCBOConfig(noise=noise, **base), n)
        state = alg.init(jax.random.key(3))
        runs[noise] = jax.jit(alg.round)(state, data)[0].params
    _, _, k_local, _, _ = jax.random.split(state.key, 5)
    theta = f64(local_train(TINY, LocalSGDConfig(epochs=1, batch_size=3, lr=0.05), state.params, state.opt_state,
                             data, k_local).params)
    none, iso, aniso = (f64(runs[k]) for k in ("none", "isotropic", "anisotropic"))
    step = 0.4
    scale = sigma1 * math.sqrt(0.1 if noise_gamma is None else noise_gamma)
    diff = jax.tree_util.tree_map(lambda t, a: (t - a) / step, theta, none)  # θ - m
    norm = np.sqrt(sum(np.sum(d.reshape(n, -1) ** 2, axis=1) for d in jax.tree_util.tree_leaves(diff)))
    for d, a, i, b in zip(*(jax.tree_util.tree_leaves(t) for t in (diff, aniso, iso, none))):
        z = (a - b) / (scale * d)  # anisotropic: σ1 √γ (θ - m) ∘ z
        shape = (n,) + (1,) * (d.ndim - 1)
        np.testing.assert_allclose(i - b, scale * norm.reshape(shape) * z, rtol=2e-3, atol=2e-6)


# --------------------------------------------------------------------------- FedSGLD Algorithm 1


def test_fedsgld_round_dual_update_message_and_server_momentum_by_hand():
    """Algorithm 1 (FedSGLD; FedPD's dual ascent): with one noise-free, unclipped full-batch
    oracle step from x0_i, h = ∇F_i(x0_i) + λ_i + γ (x - x0_i) (eq. (19));
    λ_i ← λ_i + η_λ γ (x_i - x0_i); message x0_i^+ = x_i + λ_i / γ; x0^new = mean of the
    messages; broadcast x0^new + β (x0^new - x0^old)."""
    model = models.logistic_regression(4, 3)
    rng = np.random.default_rng(0)
    n, lr, gamma, dual_lr, beta = 3, 0.1, 2.0, 0.5, 0.3
    x = jnp.asarray(rng.normal(0, 1, (n, 7, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, (n, 7)), jnp.int32)
    counts = jnp.asarray([7, 5, 6], jnp.int32)
    data = AgentData(x, y, counts)
    oracle = SGLDConfig(steps=1, burn_in=0, lr=lr, noise=0.0, clip_norm=None, sampling_rate=1.0, average="last")
    alg = fedsgld(model, FedSGLDConfig(oracle=oracle, gamma=gamma, dual_lr=dual_lr, server_momentum=beta), n)
    state = alg.init(jax.random.key(0))
    rand = lambda tree, s: jax.tree_util.tree_map(  # noqa: E731
        lambda a: jnp.asarray(rng.normal(0, s, a.shape), a.dtype), tree)
    state = state._replace(x0=rand(state.x0, 0.3), lam=rand(state.lam, 0.2), server=rand(state.server, 0.3))
    new, _ = jax.jit(alg.round)(state, data)
    x0, lam, old = f64(state.x0), f64(state.lam), f64(state.server)
    msgs, lams = [], []
    for i in range(n):
        a_i = jax.tree_util.tree_map(lambda t: t[i], x0)
        l_i = jax.tree_util.tree_map(lambda t: t[i], lam)
        g = logreg_grad(a_i, x[i], y[i], int(counts[i]))
        x_i = jax.tree_util.tree_map(lambda a, gg, ll: a - lr * (gg + ll), a_i, g, l_i)  # γ (x - x0) = 0 at x0
        l_new = jax.tree_util.tree_map(lambda ll, xx, a: ll + dual_lr * gamma * (xx - a), l_i, x_i, a_i)
        msgs.append(jax.tree_util.tree_map(lambda xx, ll: xx + ll / gamma, x_i, l_new))
        lams.append(l_new)
        for got, want in zip(jax.tree_util.tree_leaves(new.lam), jax.tree_util.tree_leaves(l_new)):
            np.testing.assert_allclose(np.asarray(got)[i], want, rtol=1e-5, atol=1e-6)
    x0_new = jax.tree_util.tree_map(lambda *ms: np.mean(ms, axis=0), *msgs)
    for got, want in zip(jax.tree_util.tree_leaves(new.server), jax.tree_util.tree_leaves(x0_new)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    bcast = jax.tree_util.tree_map(lambda a, o: a + beta * (a - o), x0_new, old)
    for got, want in zip(jax.tree_util.tree_leaves(new.x0), jax.tree_util.tree_leaves(bcast)):
        for i in range(n):
            np.testing.assert_allclose(np.asarray(got)[i], want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- FedSGLD §3.3 privacy


def _np_sgm_rdp(q, z, alpha):
    """RDP at integer order α of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019):
    log Σ_k C(α, k) (1-q)^(α-k) q^k exp((k² - k) / (2 z²)) / (α - 1), in float64 log space."""
    k = np.arange(alpha + 1)
    logc = np.array([math.lgamma(alpha + 1) - math.lgamma(i + 1) - math.lgamma(alpha - i + 1) for i in k])
    terms = logc + (alpha - k) * np.log1p(-q) + k * np.log(q) + (k * k - k) / (2 * z * z)
    top = terms.max()
    return (top + np.log(np.sum(np.exp(terms - top)))) / (alpha - 1)


def test_privacy_epsilon_matches_a_numpy_rdp_accountant_at_integer_orders():
    """(ε, δ) of T rounds of Q oracle steps, each a Poisson(q)-subsampled Gaussian with
    z_q = ε_noise / (2 C sqrt(η_q)) (batch clipping, Δ = 2C): RDP composes additively and
    converts by ε = min_α [RDP(α) + log((α-1)/α) - (log δ + log α) / (α - 1)]
    (Canonne, Kamath, Steinke 2020), recomputed here without dp-accounting."""
    pytest.importorskip("dp_accounting")
    C, lr, noise, q, Q, Q0, delta, T = 1.0, 0.01, 0.3, 0.05, 5, 2, 1e-5, 3
    cfg = SGLDConfig(steps=Q, burn_in=Q0, lr=lr, noise=noise, clip_norm=C, sampling_rate=q)
    orders = list(range(2, 33))
    rep = privacy.account(cfg, T, delta=delta, orders=orders)
    etas = [lr] * Q0 + [lr * (t - Q0) ** (-1 / 3) for t in range(Q0 + 1, Q + 1)]
    zs = np.array([noise / (2 * C * math.sqrt(e)) for e in etas])
    np.testing.assert_allclose(rep.noise_multipliers, zs, rtol=1e-12)
    one_round = np.array([sum(_np_sgm_rdp(q, z, a) for z in zs) for a in orders])
    for r in range(1, T + 1):
        a = np.array(orders, np.float64)
        eps = r * one_round + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
        assert rep.epsilon[r - 1] == pytest.approx(eps.min(), rel=1e-6)
        assert rep.order[r - 1] == orders[int(np.argmin(eps))]


# --------------------------------------------------------------------------- bad configuration values


@pytest.mark.parametrize("make,match", [
    (lambda: FedCBOConfig(gamma=-0.1), "gamma"),
    (lambda: FedCBOConfig(lambda1=-1.0), "lambda1"),
    (lambda: FedCBOConfig(alpha=-1.0), "alpha"),
    (lambda: FedCBOConfig(eps0=1.5), "eps0"),
    (lambda: FedCBOConfig(eps_min=-0.1), "eps_min"),
    (lambda: FedCBOConfig(eps_decay=-0.01), "eps_decay"),
    (lambda: FedCBOConfig(kappa=-1.0), "kappa"),
    (lambda: FedCBOConfig(zeta=0.0), "zeta"),
    (lambda: FedCBOConfig(zeta=1.5), "zeta"),
    (lambda: FedCB2OConfig(gamma=-0.1), "gamma"),
    (lambda: FedCB2OConfig(kappa=-2.0), "kappa"),
    (lambda: FedCB2OConfig(zeta=1.01), "zeta"),
    (lambda: FedCB2OConfig(T_G=-1), "T_G"),
    (lambda: FedSGLDConfig(gamma=-1.0), "gamma"),
    (lambda: FedPDConfig(gamma=0.0), "gamma"),
    (lambda: SGLDConfig(sampling_rate=0.0), "sampling_rate"),
    (lambda: selection.epsilon_greedy(3, eps0=-0.5), "eps0"),
    (lambda: selection.prob_sampling(3, kappa=-1.0), "kappa"),
    (lambda: selection.prob_sampling(3, zeta=2.0), "zeta"),
    (lambda: fedcbo(TINY, FedCBOConfig(M=4), 4), "M"),
    (lambda: selection.draw_uniform(jax.random.key(0), 4, 4), "M"),
])
def test_bad_config_values_are_a_clear_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --------------------------------------------------------------------------- local SGD (Algorithm 1, step 2)


def test_local_sgd_epochs_batches_and_momentum_with_padding_match_numpy():
    """LocalUpdate: τ epochs of mini-batch SGD with heavy-ball momentum (optax: v ← g + μ v,
    θ ← θ - lr v), each epoch a fresh shuffle of the agent's n_i real samples in batches of B,
    the last one partial (DataLoader(shuffle=True, drop_last=False)): n_i = 7 real rows of 12
    padded, B = 3 gives batches of 3, 3, 1 per epoch; each batch's loss is its mean. Checked
    in float64 against the same shuffles."""
    from cbo_jax.federated import local

    model = models.logistic_regression(4, 3)
    rng = np.random.default_rng(5)
    n_max, count, b, lr, mu, epochs = 12, 7, 3, 0.2, 0.5, 2
    x = jnp.asarray(rng.normal(0, 1, (n_max, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, n_max), jnp.int32)
    params = {"params": {"Dense_0": {"kernel": jnp.asarray(rng.normal(0, 0.3, (4, 3)), jnp.float32),
                                     "bias": jnp.zeros(3, jnp.float32)}}}
    cfg = LocalSGDConfig(epochs=epochs, batch_size=b, lr=lr, momentum=mu)
    opt = local.make_optimizer(cfg)
    key = jax.random.key(7)
    got, _, last_loss = local._train_one(model, cfg, opt, params, opt.init(params), x, y, jnp.int32(count), key)

    p = f64(params)
    v = jax.tree_util.tree_map(np.zeros_like, p)
    losses = []
    for ek in jax.random.split(key, epochs):
        u = np.where(np.arange(n_max) < count, np.asarray(jax.random.uniform(ek, (n_max,))), 2.0)
        perm = np.argsort(u, kind="stable")[:count]
        losses = []
        for start in range(0, count, b):  # 3, 3, 1
            rows = perm[start:start + b]
            w, bias = p["params"]["Dense_0"]["kernel"], p["params"]["Dense_0"]["bias"]
            logits = np.asarray(x, np.float64)[rows] @ w + bias
            lse = logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
            losses.append(np.mean(lse - logits[np.arange(len(rows)), np.asarray(y)[rows]]))
            g = logreg_grad(p, np.asarray(x)[rows], np.asarray(y)[rows], len(rows))
            v = jax.tree_util.tree_map(lambda gg, vv: gg + mu * vv, g, v)
            p = jax.tree_util.tree_map(lambda pp, vv: pp - lr * vv, p, v)
    for a, want in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(p)):
        np.testing.assert_allclose(np.asarray(a), want, rtol=1e-5, atol=1e-6)
    assert float(last_loss) == pytest.approx(np.mean(losses), rel=1e-5)  # mean over the last epoch's batches


# --------------------------------------------------------------------------- FedCB²O Algorithm 2 (ProbSampling)


def _prob_draws(P, m, draws=4000):
    keys = jax.random.split(jax.random.key(11), draws)
    return np.asarray(jax.jit(jax.vmap(lambda k: selection.draw_prob_sampling(k, P, m)[0]))(keys))


def test_prob_sampling_without_replacement_pair_probabilities():
    """Algorithm 2, line 4: M agents drawn with probability ∝ P^{j,i} without replacement
    (successive sampling): P(first a, then b) = p_a / S · p_b / (S - p_a)."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    P = jnp.asarray(np.concatenate([[-np.inf], p])[None, :], jnp.float32)
    picks = _prob_draws(P, 2)
    assert not np.any(picks == 0) and np.all(picks[:, 0] != picks[:, 1])
    s = p.sum()
    for a in range(4):
        for b in range(4):
            if a != b:
                want = p[a] / s * p[b] / (s - p[a])
                got = np.mean((picks[:, 0] == a + 1) & (picks[:, 1] == b + 1))
                assert got == pytest.approx(want, abs=0.02), (a, b)


def test_prob_sampling_picks_zero_likelihood_agents_uniformly_not_by_index():
    """Agents with P = 0 (reward exp(-κ L) = 0: a diverged or broken model) are drawn only
    when the agents with P > 0 do not fill the M slots, and then uniformly at random among
    themselves: the selection does not depend on the agents' labels. The old kernel ranked
    them by index (log 0 clipped to -1e30 swallows the float32 Gumbel key), so agents 2 and 3
    were always downloaded and 4 and 5 never."""
    P = jnp.asarray([[-np.inf, 0.5, 0.0, 0.0, 0.0, 0.0]], jnp.float32)
    picks = _prob_draws(P, 3, 2000)
    assert np.all(picks[:, 0] == 1)  # the one agent with P > 0 always, first
    freq = np.array([np.mean(np.any(picks == i, axis=1)) for i in range(2, 6)])
    np.testing.assert_allclose(freq, 0.5, atol=0.05)  # 2 of the 4 zero-P agents, uniformly
