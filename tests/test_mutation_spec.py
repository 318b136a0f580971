"""Specification tests for federated mutants that only the pinned runs caught.

docs/development.md ("Mutation testing"): some single-point mutants of cbo_jax/federated were
caught only by the bitwise comparison with the pinned runs (tests/pinned/), which says that a
result changed but not which equation broke. Each test here names the equation it checks and
compares with a float64 NumPy reference, a closed form or an exact property on tiny inputs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.sde import per_particle_normal

from _reference import f64, logreg_grad, logreg_loss

LOGREG = models.logistic_regression(3, 2)
LOCAL = LocalSGDConfig(epochs=1, batch_size=5, lr=0.5, momentum=0.0)


def _agents(n=5, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


# --------------------------------------------------------------------------- FedCBO


@functools.lru_cache(maxsize=None)
def _fedcbo_noisy_round():
    n = 5
    cfg = FedCBOConfig(M=2, lambda1=4.0, gamma=0.1, alpha=3.0, noise="isotropic", sigma1=0.7, local=LOCAL)
    alg = fedcbo(LOGREG, cfg, n)
    data = _agents(n)
    state = alg.init(jax.random.key(11))
    round_fn = jax.jit(alg.round)
    new, info = round_fn(state, data)
    _, _, k_local, _, k_noise = jax.random.split(state.key, 5)
    trained = jax.jit(lambda p, o: local_train(LOGREG, cfg.local, p, o, data, k_local).params)(state.params,
                                                                                              state.opt_state)
    return cfg, data, k_noise, trained, new, info, round_fn, state


def test_fedcbo_isotropic_aggregation_noise_is_sigma1_sqrt_gamma_times_the_global_norm():
    """FedCBO eq. (20) with the Appendix E noise (JMLR eq. (70)), isotropic form:
    ``θ_j ← θ_j - λ1γ (θ_j - m_j) + σ1 √γ |θ_j - m_j| z_j``, ``|·|`` the Euclidean norm of
    agent j over all parameters, ``z_j`` from agent j's own stream ``fold_in(k_noise, j)``,
    ``m_j`` the Gibbs average of eq. (19) over the downloads. Float64 NumPy reference from
    the round's locally trained models (recomputed from its key split). The existing noise
    test is slow; a mutant dropping the √ of γ (or using the anisotropic form) was caught
    only by the pinned runs."""
    cfg, data, k_noise, trained, new, info, _, _ = _fedcbo_noisy_round()
    t64, idx = f64(trained), np.asarray(info.idx)
    x, y, counts = np.asarray(data.x, np.float64), np.asarray(data.y), np.asarray(data.counts)
    row = lambda i: jax.tree_util.tree_map(lambda a: a[i], t64)  # noqa: E731
    leaves = jax.tree_util.tree_leaves(t64)
    diff = []
    for j in range(idx.shape[0]):
        e = np.array([logreg_loss(row(i), x[j], y[j], counts[j]) for i in idx[j]])
        mu = np.exp(-cfg.alpha * (e - e.min()))
        mu /= mu.sum()
        diff.append([leaf[j] - np.tensordot(mu, leaf[idx[j]], axes=1) for leaf in leaves])
    diff_tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(trained),
                                             [np.stack([d[k] for d in diff]).astype(np.float32)
                                              for k in range(len(leaves))])
    z = [np.asarray(a, np.float64) for a in
         jax.tree_util.tree_leaves(per_particle_normal(k_noise, diff_tree, jnp.arange(idx.shape[0])))]
    step, scale = 4.0 * 0.1, 0.7 * np.sqrt(0.1)  # λ1γ and σ1√γ of the config above
    for j in range(idx.shape[0]):
        norm = np.sqrt(sum(np.sum(d ** 2) for d in diff[j]))
        assert norm > 1e-3  # the noise term is not negligible
        for k, (leaf, got) in enumerate(zip(leaves, jax.tree_util.tree_leaves(new.params))):
            want = leaf[j] - step * diff[j][k] + scale * norm * z[k][j]
            np.testing.assert_allclose(np.asarray(got[j]), want, rtol=1e-4, atol=1e-5)


def test_fedcbo_round_n_draws_floor_eps_n_times_M_at_random():
    """FedCBO Remark 3 in round ``n`` (counted from 0, as ``FedCBOState.round``): ε-greedy
    draws ``⌊ε(n) M⌋`` of the ``M`` downloads uniformly at random, ``ε(n) = max(ε0 - 0.01 n,
    ε_min)``. With ``M = 2``: one random pick at ``n = 0`` (ε = 0.5), none from ``n = 1``
    (ε = 0.49). The rule itself is tested alone; this checks the round index the algorithm
    passes it (a schedule read one round late gives no random pick in round 0)."""
    from cbo_jax.federated.selection import epsilon_schedule

    cfg, data, _, _, _, info, round_fn, state = _fedcbo_noisy_round()
    for n, n_random in ((0, 1), (1, 0), (7, 0)):
        if n:
            _, info = round_fn(state._replace(round=jnp.asarray(n, jnp.int32)), data)
        eps = max(0.5 - 0.01 * n, 0.1)  # the defaults ε0, decay, ε_min
        assert float(info.eps) == float(epsilon_schedule(n, cfg.eps0, cfg.eps_decay, cfg.eps_min))
        np.testing.assert_allclose(float(info.eps), eps, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(info.is_random).sum(axis=1), n_random)
        assert int(np.floor(eps * 2 + 1e-6)) == n_random


# --------------------------------------------------------------------------- FedCB²O


def _np_class_losses(theta, x, y, count, num_classes):
    """(L_c with NaN for absent classes, L): float64 class-wise and mean cross-entropies."""
    per = np.array([logreg_loss(theta, x[i:i + 1], y[i:i + 1], 1) for i in range(count)])
    l_c = np.array([per[y[:count] == c].mean() if np.any(y[:count] == c) else np.nan for c in range(num_classes)])
    return l_c, per.mean()


@functools.lru_cache(maxsize=None)
def _fedcb2o_round_at_T_G():
    from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o
    from cbo_jax.federated.attacks import AttackData, grouped_local_train
    from cbo_jax.federated.selection import init_prob_likelihood

    n, C = 5, 3
    model = models.logistic_regression(3, C)
    rng = np.random.default_rng(2)
    tx = [rng.normal(size=(6, 3)).astype(np.float32) for _ in range(n)]
    ty = [rng.integers(0, C, 6).astype(np.int32) for _ in range(n)]
    vx = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(n)]
    vy = [np.array([0, 1, 2, 0, 1], np.int32), np.array([0, 0, 1, 1, 0], np.int32),
          np.array([2, 1, 2, 0, 0], np.int32), np.array([1, 2, 1, 2, 2], np.int32), np.array([0, 2, 2, 0, 1], np.int32)]
    data = AttackData.from_lists(tx, ty, vx, vy)
    cfg = FedCB2OConfig(M=3, T_G=1, alpha=3.0, kappa=1.5, zeta=0.3, lambda1=5.0, gamma=0.1,
                        local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.5, momentum=0.0))
    alg = fedcb2o(model, cfg, np.zeros(n, np.int32), np.zeros(n, bool))
    state = alg.init(jax.random.key(4))
    # Round T_G, with each agent's row of P observed but for two other agents: ProbSampling
    # downloads only those two (Algorithm 2), so slot 3 is empty (FedCB2OInfo.valid).
    P = np.asarray(init_prob_likelihood(n, n)).copy()
    for j in range(n):
        for i in range(n):
            if i != j and i not in ((j + 1) % n, (j + 2) % n):
                P[j, i] = 0.2 + 0.1 * i
    state = state._replace(round=jnp.asarray(cfg.T_G, jnp.int32), P=jnp.asarray(P))
    new, info = jax.jit(alg.round)(state, data)
    _, k_local, _, _ = jax.random.split(state.key, 4)
    trained = jax.jit(lambda p, o: grouped_local_train(model, cfg.local, p, o, data.groups, k_local).params)(
        state.params, state.opt_state)
    return cfg, data, P, trained, new, info


def test_fedcb2o_uses_G_from_round_T_G_and_updates_P_on_filled_slots_only():
    """FedCB²O Algorithm 1 at round ``n = T_G`` (the first round with the robustness
    criterion, step f): the weights are ``μ_i ∝ exp(-α G^i)``, eq. (3.13), with ``G^i`` of
    eq. (3.15) over the classes present in agent j's validation split; and ProbSampling's
    eq. (3.12) ``P^{j,i} ← (1-ζ) P^{j,i} + ζ exp(-κ L_j^i)`` changes only the downloaded
    entries: the one never-observed agent (first observation: ``exp(-κ L)``), not the agent
    in an empty slot (Algorithm 2 downloads only the unobserved one). Float64 NumPy reference
    from the round's trained models. Mutants starting G one round late, or updating P on the
    empty slots, were caught only by the pinned runs."""
    cfg, data, P, trained, new, info = _fedcb2o_round_at_T_G()
    t64 = f64(trained)
    row = lambda i: jax.tree_util.tree_map(lambda a: a[i], t64)  # noqa: E731
    vx, vy, vc = np.asarray(data.val.x, np.float64), np.asarray(data.val.y), np.asarray(data.val.counts)
    idx, valid = np.asarray(info.idx), np.asarray(info.valid)
    want_P = P.astype(np.float64)
    n = idx.shape[0]
    for j in range(n):
        assert sorted(idx[j, :2].tolist()) == sorted([(j + 1) % n, (j + 2) % n]) and valid[j].tolist() == [1, 1, 0]
        own_c, _ = _np_class_losses(row(j), vx[j], vy[j], vc[j], 3)
        present = ~np.isnan(own_c)
        g, loss = [], []
        for i in idx[j, :2]:
            l_c, l_mean = _np_class_losses(row(i), vx[j], vy[j], vc[j], 3)
            g.append(np.max((l_c - own_c)[present]))
            loss.append(l_mean)
            want_P[j, i] = np.exp(-cfg.kappa * l_mean)  # first observation (P_start="first")
        g, loss = np.array(g), np.array(loss)
        np.testing.assert_allclose(np.asarray(info.loss[j, :2]), loss, rtol=1e-5)
        mu = np.exp(-cfg.alpha * (g - g.min()))
        mu /= mu.sum()
        mu_loss = np.exp(-cfg.alpha * (loss - loss.min()))
        assert np.max(np.abs(mu - mu_loss / mu_loss.sum())) > 1e-3  # G and L give different weights here
        np.testing.assert_allclose(np.asarray(info.weights[j]), np.append(mu, 0.0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new.P), want_P, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- selection


def test_prob_likelihood_update_leaves_the_rows_of_non_participants():
    """FedCB²O eq. (3.12) ``P^{j,i} ← (1-ζ) P^{j,i} + ζ exp(-κ L_j^i)`` is applied only by the
    agents that took part in the round (FedCBO with ProbSampling and participation < 1,
    Algorithm 2's ``G_n``): a row with ``active`` False keeps every entry, NaN included."""
    from cbo_jax.federated import selection

    P = np.array([[-np.inf, 0.4, np.nan, 0.2], [0.3, -np.inf, 0.6, np.nan], [0.5, 0.1, -np.inf, 0.7]], np.float32)
    idx = np.array([[1, 2], [0, 3], [3, 1]])
    loss = np.array([[0.5, 1.0], [0.2, 0.3], [0.9, 0.4]], np.float32)
    active = np.array([True, False, True])
    kappa, zeta = 2.0, 0.3
    got = np.asarray(selection.update_prob_likelihood(jnp.asarray(P), jnp.asarray(idx), jnp.asarray(loss), kappa, zeta,
                                                      active=jnp.asarray(active)))
    want = P.astype(np.float64)
    for j in np.nonzero(active)[0]:
        for t, i in enumerate(idx[j]):
            r = np.exp(-kappa * loss[j, t])
            want[j, i] = r if np.isnan(want[j, i]) else (1 - zeta) * want[j, i] + zeta * r
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- FedSGLD round


def _logreg_grad(theta, x, y, count):
    """:func:`_reference.logreg_grad` for a ``(kernel, bias)`` pair: the same pair of gradients."""
    g = logreg_grad({"params": {"Dense_0": {"kernel": theta[0], "bias": theta[1]}}}, x, y, count)
    return g["params"]["Dense_0"]["kernel"], g["params"]["Dense_0"]["bias"]


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
    from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, fedpd, fedsgld
    from cbo_jax.federated.langevin import SGLDConfig

    n, steps, burn_in, lr, gamma = 3, 4, 1, 0.3, 0.5
    dual_lr = 0.5 if name == "fedsgld" else 1.0  # FedPD: λ ← λ + γ (x - x0)
    data = _agents(n, seed=4)
    if name == "fedsgld":
        oracle = SGLDConfig(steps=steps, burn_in=burn_in, lr=lr, noise=0.0, clip_norm=None, sampling_rate=1.0)
        cfg = FedSGLDConfig(oracle=oracle, gamma=gamma, dual_lr=dual_lr, warm_start=True)
        alg = fedsgld(LOGREG, cfg, n)
    else:
        cfg = FedPDConfig(local_steps=steps, lr=lr, gamma=gamma, sampling_rate=1.0)
        alg = fedpd(LOGREG, cfg, n)
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


# --------------------------------------------------------------------------- DFedAvgM


def test_dfedavgm_averages_self_and_neighbours_weighted_by_data_size():
    """DFedAvgM (Sun, Li and Wang; the FedCB²O paper's Oracle baselines): after local
    training, agent j becomes ``(n_j θ_j + Σ_{i ∈ N_j} n_i θ_i) / (n_j + Σ_{i ∈ N_j} n_i)``
    over its ``M`` neighbours of its own group, ``n_i`` the training-set sizes. Float64
    NumPy reference from the round's trained models (recomputed from its key split); the
    only other check of the weights is a slow test."""
    from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm
    from cbo_jax.federated.attacks import AttackData, grouped_local_train

    n = 5
    rng = np.random.default_rng(6)
    sizes = [3, 6, 4, 5, 2]
    tx = [rng.normal(size=(s, 3)).astype(np.float32) for s in sizes]
    ty = [rng.integers(0, 2, s).astype(np.int32) for s in sizes]
    data = AttackData.from_lists(tx, ty, tx, ty)
    cfg = DFedAvgMConfig(M=2, local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.5, momentum=0.0))
    alg = dfedavgm(LOGREG, cfg, np.zeros(n, np.int32))
    state = alg.init(jax.random.key(3))
    new, info = jax.jit(alg.round)(state, data)
    _, k_local, _ = jax.random.split(state.key, 3)
    trained = f64(jax.jit(lambda p, o: grouped_local_train(LOGREG, cfg.local, p, o, data.groups, k_local).params)(
        state.params, state.opt_state))
    idx, w = np.asarray(info.idx), np.asarray(sizes, np.float64)
    for leaf, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new.params)):
        for j in range(n):
            rows = np.append(idx[j], j)
            want = np.tensordot(w[rows] / w[rows].sum(), leaf[rows], axes=1)
            assert np.max(np.abs(want - leaf[j])) > 1e-4  # the average moves the model
            np.testing.assert_allclose(np.asarray(got[j]), want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- participation


def _check_non_participants_keep_their_state(alg, data):
    state = alg.init(jax.random.key(5))
    rng = np.random.default_rng(0)  # a momentum trace left by an earlier round
    state = state._replace(opt_state=jax.tree_util.tree_map(
        lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
        state.opt_state))
    new, info = jax.jit(alg.round)(state, data)
    active = np.asarray(info.active)
    assert 0 < active.sum() < active.size
    _, _, k_local = jax.random.split(state.key, 5 if alg.name == "fedcbo" else 3)[:3]
    trained = jax.jit(lambda p, o: local_train(LOGREG, alg.config.local, p, o, data, k_local))(state.params,
                                                                                                state.opt_state)
    for old, got, tr in zip(*(jax.tree_util.tree_leaves(t) for t in (state.opt_state, new.opt_state,
                                                                       trained.opt_state))):
        old, got, tr = np.asarray(old), np.asarray(got), np.asarray(tr)
        np.testing.assert_array_equal(got[~active], old[~active])
        np.testing.assert_allclose(got[active], tr[active], rtol=1e-6, atol=1e-7)
        if np.issubdtype(old.dtype, np.floating):
            assert np.max(np.abs(tr[~active] - old[~active])) > 1e-3  # training would have changed them


def test_local_only_non_participants_keep_their_momentum():
    """Partial participation (``G_n``, FedCBO Algorithm 1 step 1, used by every baseline) with
    ``reset_optimizer=False``: only the agents of ``G_n`` train, so a non-participant keeps its
    optimizer state (momentum trace) as well as its model; a participant's becomes the one its
    local SGD left. Exact property of one ``local_only`` round."""
    from cbo_jax.federated.algorithms import LocalConfig, local_only

    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.2, momentum=0.9, reset_optimizer=False)
    _check_non_participants_keep_their_state(local_only(LOGREG, LocalConfig(local=loc, participation=0.5), 5),
                                             _agents(5, seed=7))


def test_fedcbo_non_participants_keep_their_momentum():
    """As above for FedCBO (Algorithm 1: only the agents of ``G_n`` run LocalUpdate): with
    ``reset_optimizer=False`` a non-participant's optimizer state is left as it was. The
    pinned FedCBO run that keeps its optimizer state has full participation, the one with
    partial participation resets it every round."""
    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.2, momentum=0.9, reset_optimizer=False)
    cfg = FedCBOConfig(M=2, lambda1=4.0, gamma=0.1, alpha=3.0, participation=0.6, local=loc)
    _check_non_participants_keep_their_state(fedcbo(LOGREG, cfg, 5), _agents(5, seed=7))


def test_fedavg_server_model_averages_only_the_participants():
    """FedAvg (McMahan et al.; the FedCBO paper's baseline) with partial participation: the
    new global model is ``Σ_{j ∈ G_n} n_j θ_j / Σ_{j ∈ G_n} n_j`` over the locally trained
    models of the agents of ``G_n`` only, ``n_j`` their data sizes. Float64 NumPy reference
    from the round's trained models (recomputed from its key split). A mutant averaging every
    agent was caught only by the pinned FedAvg run (the IFCA form is in test_mutation_baselines)."""
    from cbo_jax.federated.algorithms import FedAvgConfig, fedavg
    from cbo_jax.federated.algorithms.base import broadcast

    n = 6
    data = _agents(n, seed=8)
    loc = LocalSGDConfig(epochs=1, batch_size=3, lr=0.3, momentum=0.0)
    alg = fedavg(LOGREG, FedAvgConfig(local=loc, participation=0.5), n)
    state = alg.init(jax.random.key(2))
    new, info = jax.jit(alg.round)(state, data)
    _, _, k_local = jax.random.split(state.key, 3)
    trained = f64(jax.jit(lambda p: local_train(LOGREG, loc, broadcast(p, n), None, data, k_local).params)(
        state.params))
    active = np.asarray(info.active)
    assert 0 < active.sum() < n
    w = np.asarray(data.counts, np.float64) * active
    for leaf, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new.params)):
        want = np.tensordot(w / w.sum(), leaf, axes=1)
        assert np.max(np.abs(want - np.tensordot(np.asarray(data.counts) / np.sum(data.counts), leaf, axes=1))) > 1e-4
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
