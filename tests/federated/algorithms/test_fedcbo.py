"""FedCBO (cbo_jax.federated.algorithms.fedcbo): the aggregation against NumPy float64, its
limits, whole rounds by hand, partial participation.

Determinism, resume and padding of every algorithm: tests/federated/test_runner.py."""


import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import metrics as fm
from cbo_jax.federated import selection
from cbo_jax.federated.aggregation import consensus_downloads
from cbo_jax.federated.algorithms import AgentData, FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.fedcbo import group_loss, loss_energy
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.models import Model
from cbo_jax.sde import per_particle_normal

from _reference import f64, logreg_loss

TINY = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))


def aggregate(model, cfg, params, idx, data):
    """FedCBO's eq. (19) for every agent: (loss (N, M), own loss (N,), consensus points).

    Jitted, as in a round: one compile instead of some hundred op-by-op ones."""

    def downloads(params, idx, data):
        res = consensus_downloads(loss_energy(model, cfg), params, idx, params, (data.x, data.y, data.counts),
                                  alpha=cfg.alpha, chunk=cfg.eval_chunk)
        return res.loss, res.own_loss, res.consensus

    return jax.jit(downloads)(params, idx, data)


def _tiny_data(n=6, n_max=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 2, 2)).astype(np.float32)
    y = rng.integers(0, 4, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


def _np_forward(p, x):
    h = np.maximum(x.reshape(len(x), -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
    return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def _np_loss(p, x, y, count, reduction, b):
    logits = _np_forward(p, x.astype(np.float64))
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    per = (logz - logits[np.arange(len(y)), y])[:count]
    if reduction == "mean":
        return per.mean()
    return sum(per[s : s + b].mean() for s in range(0, count, b))


@pytest.mark.parametrize("reduction", ["mean", "sum_of_batch_means"])
def test_fedcbo_aggregation_matches_numpy_float64(reduction):
    n, m, alpha, step = 6, 3, 4.0, 0.7
    data = _tiny_data(n)
    params = jax.jit(models.init_population, static_argnums=(0, 2))(TINY, jax.random.key(0), n)
    idx = selection.draw_uniform(jax.random.key(1), n, m)
    cfg = FedCBOConfig(M=m, alpha=alpha, lambda1=1.0, gamma=step, loss_reduction=reduction, eval_chunk=4,
                       local=LocalSGDConfig(batch_size=2))
    loss, own, mcons = aggregate(TINY, cfg, params, idx, data)
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)["params"]
    x, y, c = (np.asarray(a) for a in data[:3])
    idx = np.asarray(idx)
    for j in range(n):
        pj = lambda i: jax.tree_util.tree_map(lambda a: a[i], p64)  # noqa: E731
        L = np.array([_np_loss(pj(i), x[j], y[j], c[j], reduction, 2) for i in idx[j]])
        np.testing.assert_allclose(np.asarray(loss[j]), L, rtol=1e-5)
        assert float(own[j]) == pytest.approx(_np_loss(pj(j), x[j], y[j], c[j], reduction, 2), rel=1e-5)
        w = np.exp(-alpha * (L - L.min()))
        w /= w.sum()
        for name in ("Dense_0", "Dense_1"):
            for leaf in ("kernel", "bias"):
                ref = np.tensordot(w, p64[name][leaf][idx[j]], axes=1)
                np.testing.assert_allclose(np.asarray(mcons["params"][name][leaf][j]), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_large_alpha_full_download_picks_best_loss_model():
    n = 5
    data = _tiny_data(n)
    params = models.init_population(TINY, jax.random.key(3), n)
    cfg = FedCBOConfig(M=n - 1, alpha=1e12)
    idx = selection.draw_uniform(jax.random.key(4), n, n - 1)
    loss, _, mcons = aggregate(TINY, cfg, params, idx, data)
    best = np.asarray(idx)[np.arange(n), np.asarray(loss).argmin(1)]
    k = params["params"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(np.asarray(mcons["params"]["Dense_0"]["kernel"]), np.asarray(k)[best])


def test_nan_model_never_poisons_a_consensus():
    n = 5
    data = _tiny_data(n)
    params = jax.jit(lambda key: jax.tree_util.tree_map(  # one compile for the init and the NaN model
        lambda a: a.at[2].set(jnp.nan), models.init_population(TINY, key, n)))(jax.random.key(5))
    assert all(np.isnan(np.asarray(leaf[2])).all() for leaf in jax.tree_util.tree_leaves(params))
    idx = jnp.asarray([[j for j in range(n) if j != i] for i in range(n)])
    loss, _, mcons = aggregate(TINY, FedCBOConfig(M=n - 1, alpha=1.0), params, idx, data)
    for j in range(n):
        if j == 2:
            continue
        for leaf in jax.tree_util.tree_leaves(mcons):
            assert np.all(np.isfinite(np.asarray(leaf[j])))


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_agent_without_a_usable_download_keeps_its_own_model():
    """Every download of agent 0 is NaN: its consensus point is its own model (weight 1 on
    itself, nothing else), and the round info says so."""
    n = 5
    data = _tiny_data(n)
    params = models.init_population(TINY, jax.random.key(6), n)
    params = jax.tree_util.tree_map(lambda a: a.at[1:3].set(jnp.nan), params)
    idx = jnp.asarray([[1, 2]] + [[j for j in range(n) if j not in (i, 1, 2)][:2] for i in range(1, n)])
    res = consensus_downloads(loss_energy(TINY, FedCBOConfig(M=2)), params, idx, params, (data.x, data.y, data.counts),
                              alpha=1.0)
    assert bool(res.fallback[0]) and not bool(np.any(res.fallback[3:]))
    for m, p in zip(jax.tree_util.tree_leaves(res.consensus), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(m[0]), np.asarray(p[0]))
    assert float(res.self_weight[0]) == 1.0 and np.all(np.asarray(res.weights[0]) == 0)


def test_fedcbo_bad_input():
    with pytest.raises(ValueError, match="M="):
        fedcbo(TINY, FedCBOConfig(M=6), 6)
    with pytest.raises(ValueError, match="participation"):
        FedCBOConfig(participation=1.5)
    with pytest.raises(ValueError, match="noise"):
        FedCBOConfig(noise="pink")
    with pytest.raises(ValueError, match="eval_by"):
        FedCBOConfig(eval_by="download")
    with pytest.raises(ValueError, match="takes no `downloads`"):
        fedcbo(TINY, FedCBOConfig(M=2, eval_by="model"), 6, downloads=lambda *a: None)


@pytest.mark.slow  # the default run's time budget; the kernel's equality tests run by default
def test_fedcbo_rounds_evaluated_model_by_model_equal_agent_by_agent():
    """Three FedCBO rounds with ``eval_by="model"`` against ``eval_by="agent"`` from the same
    state: the same downloads drawn, losses, selections and models equal up to float32
    rounding (only the products' blocking differs)."""
    data = _tiny_data(8, seed=4)
    out = {}
    for by in ("agent", "model"):
        alg = fedcbo(TINY, FedCBOConfig(M=3, alpha=5.0, eval_by=by, eval_chunk=2,
                                        local=LocalSGDConfig(epochs=1, batch_size=4)), 8)
        state = alg.init(jax.random.key(1))
        step = jax.jit(alg.round)
        infos = []
        for _ in range(3):
            state, info = step(state, data)
            infos.append(info)
        out[by] = (state, infos)
    (sa, ia), (sb, ib) = out["agent"], out["model"]
    for a, b in zip(ia, ib):
        np.testing.assert_array_equal(np.asarray(a.idx), np.asarray(b.idx))
        np.testing.assert_array_equal(np.asarray(a.fallback), np.asarray(b.fallback))
    for a, b in zip(jax.tree_util.tree_leaves((sa.params, sa.P)), jax.tree_util.tree_leaves((sb.params, sb.P))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # the default run's time budget (test_nan_model_never_poisons_a_consensus stays)
@pytest.mark.parametrize("m,attackers", [(1, [0]), (2, [0, 1])])
def test_fedcbo_never_spreads_nonfinite_models(m, attackers):
    """Attackers whose models are NaN, +inf or 1e30 every round (M = 1 with one, M = 2 with two
    of 8 agents): no other agent ever becomes non-finite. An agent whose downloads are all
    broken keeps its own model, and its round info says so."""
    data = _tiny_data(8, seed=2)
    alg = fedcbo(TINY, FedCBOConfig(M=m, alpha=5.0, eps0=0.3, local=LocalSGDConfig(epochs=1, batch_size=4)), 8)
    step = jax.jit(alg.round)
    benign = np.setdiff1d(np.arange(8), attackers)
    kept = 0
    for value in (jnp.nan, jnp.inf, 1e30):
        state = alg.init(jax.random.key(0))
        # round 1: every agent's likelihood favours the attackers, so most download only them
        state = state._replace(P=state.P.at[:, np.asarray(attackers)].set(50.0))
        for _ in range(4):
            state = state._replace(params=jax.tree_util.tree_map(lambda a: a.at[np.asarray(attackers)].set(value),
                                                                 state.params))
            state, info = step(state, data)
            for leaf in jax.tree_util.tree_leaves(state.params):
                assert np.isfinite(np.asarray(leaf)[benign]).all(), value
            broken = np.isin(np.asarray(info.idx), attackers).all(axis=1)
            np.testing.assert_array_equal(np.asarray(info.fallback)[benign], broken[benign])
            kept += int(broken[benign].sum())
    assert kept > 0  # an agent with only broken downloads did occur


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_fedcbo_round_by_hand_with_lambda1_not_one():
    """One whole FedCBO round recomputed from its parts: local training, the selection with the
    round's keys, float64 consensus weights exp(-α L) and θ ← θ - λ1 γ (θ - m) with λ1 γ = 0.35
    (the step is λ1·γ, not γ alone)."""
    n, m = 6, 3
    data = _tiny_data(n, seed=4)
    cfg = FedCBOConfig(M=m, lambda1=3.5, gamma=0.1, alpha=2.0, eps0=0.4, eps_decay=0.0, eps_min=0.4,
                       local=LocalSGDConfig(epochs=1, batch_size=3, lr=0.05))
    alg = fedcbo(TINY, cfg, n)
    state = alg.init(jax.random.key(1))
    new, info = jax.jit(alg.round)(state, data)
    _, _, k_local, k_sel, _ = jax.random.split(state.key, 5)
    trained = local_train(TINY, cfg.local, state.params, state.opt_state, data, k_local)
    idx, _ = selection.draw_epsilon_greedy(k_sel, state.P, m, 0.4)
    np.testing.assert_array_equal(np.asarray(info.idx), np.asarray(idx))
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), trained.params)["params"]
    x, y, c = (np.asarray(a) for a in data[:3])
    for j in range(n):
        pj = lambda i: jax.tree_util.tree_map(lambda a: a[i], p64)  # noqa: E731
        L = np.array([_np_loss(pj(i), x[j], y[j], c[j], "mean", 3) for i in np.asarray(idx)[j]])
        w = np.exp(-2.0 * (L - L.min()))
        w /= w.sum()
        for name in ("Dense_0", "Dense_1"):
            for leaf in ("kernel", "bias"):
                theta = p64[name][leaf][j]
                mj = np.tensordot(w, p64[name][leaf][np.asarray(idx)[j]], axes=1)
                np.testing.assert_allclose(np.asarray(new.params["params"][name][leaf][j]),
                                           theta - 0.35 * (theta - mj), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make,match", [
    (lambda: FedCBOConfig(alpha=1e39), "alpha .*overflows float32"),
    (lambda: FedCBOConfig(lambda1=1e30), "aggregation step"),
    (lambda: FedCBOConfig(lambda1=20.0, gamma=0.1), "aggregation step"),
    (lambda: FedCBOConfig(eps0=2.0), "eps0 must lie in"),
    (lambda: FedCBOConfig(sigma1=float("nan")), "sigma1 must be finite"),
    (lambda: LocalSGDConfig(lr="0.1"), "lr must be float"),
    (lambda: LocalSGDConfig(reset_optimizer="no"), "reset_optimizer must be bool"),
    (lambda: FedCBOConfig(M=True), "M must be int, got True"),
])
def test_federated_config_values_are_checked_on_the_host(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------------------------------------ partial participation
# Partial participation in FedCBO: downloads come from the participating agents ``G_n``.
#
# FedCBO's Algorithm 2 draws ``A_n ← ε-greedySampling(P_n^j, G_n, M)``: ``⌊εM⌋`` random
# picks from ``G_n`` and the rest the top-``P`` agents of ``G_n \ A_n^1``, never the agent
# itself. With ``participation < 1`` the downloads of a participating agent are therefore
# participants; when fewer than ``M`` other agents participate, the slots left over hold no
# download (``Selection.valid``), weigh nothing in the consensus point (19) and leave the
# likelihood matrix (21) unchanged. ``participation = 1`` (the paper's experiments) is
# unchanged bitwise (tests/federated/test_runner.py's pinned runs; here: an all-True
# candidate mask draws exactly what no mask draws).

def _linear_model(d=3):
    """``y ≈ x·w + b`` with squared error: eq. (19)'s losses are easy to recompute in NumPy."""
    def init(key):
        kw, kb = jax.random.split(key)
        return {"w": jax.random.normal(kw, (d,)), "b": jax.random.normal(kb, ())}

    return Model(init, lambda p, x: x @ p["w"] + p["b"], "linear", None, loss=lambda o, y: (o - y) ** 2)


def _data(n, n_max=10, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, d)).astype(np.float32)
    y = (x @ rng.normal(size=d) * np.where(np.arange(n) % 2, 1.0, -1.0)[:, None]).astype(np.float32)
    counts = rng.integers(6, n_max + 1, n).astype(np.int32)
    return fl.AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


def _check_downloads(info, m, exact=True):
    """Every participating agent's downloads are other participants, distinct, in the first
    ``min(M, |G_n| - 1)`` slots (``exact=False``, ProbSampling: at least one and at most
    that many, the never-observed ones first); a non-participant downloads nothing."""
    active = np.asarray(info.active)
    idx = np.asarray(info.idx)
    assert info.valid is not None, "participation < 1 must mark the filled slots"
    valid = np.asarray(info.valid)
    others = int(active.sum()) - 1
    for j in range(idx.shape[0]):
        if not active[j]:
            assert not valid[j].any(), (j, valid[j])
            continue
        got = idx[j][valid[j]]
        k = int(valid[j].sum()) if not exact and 1 <= valid[j].sum() <= min(m, others) else min(m, others)
        assert valid[j].tolist() == [s < k for s in range(m)], (j, valid[j])
        assert active[got].all(), (j, got, np.nonzero(active)[0])  # participants only
        assert j not in got.tolist()  # never itself
        assert len(set(got.tolist())) == got.size  # no duplicates


@pytest.mark.parametrize("sel,eps", [("epsilon_greedy", 0.5),
                                     pytest.param("epsilon_greedy", 0.0, marks=pytest.mark.slow),
                                     pytest.param("uniform", 1.0, marks=pytest.mark.slow), ("prob_sampling", 0.0)])
def test_downloads_of_a_participant_are_participants(sel, eps):
    n, m = 13, 3
    cfg = FedCBOConfig(M=m, selection=sel, eps0=eps, eps_min=eps, eps_decay=0.0, participation=0.6, alpha=5.0,
                       local=fl.LocalSGDConfig(epochs=1, batch_size=5, lr=0.05))
    alg = fedcbo(_linear_model(), cfg, n)
    data = _data(n)
    step = jax.jit(alg.round)
    state = alg.init(jax.random.key(0))
    sizes = set()
    for _ in range(12):
        state, info = step(state, data)
        sizes.add(int(np.sum(info.active)))
        _check_downloads(info, m, exact=sel != "prob_sampling")
    assert sizes == {8}  # round(0.6 · 13) participants every round


def _kernel_cases(rows, n, seed):
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(rows, n)).astype(np.float32)
    P[rng.random((rows, n)) < 0.1] = -np.inf  # eq. (21) after an infinite loss
    np.fill_diagonal(P, -np.inf)
    Q = np.where(rng.random((rows, n)) < 0.4, np.nan, rng.random((rows, n))).astype(np.float32)  # ProbSampling
    Q[rng.random((rows, n)) < 0.1] = 0.0
    np.fill_diagonal(Q, -np.inf)
    return jnp.asarray(P), jnp.asarray(Q)


@pytest.mark.parametrize("rule", ["epsilon_greedy", "prob_sampling"])
def test_selection_kernels_draw_from_the_candidates_only(rule):
    """Over many draws and candidate sets (some with fewer than M others): the filled slots
    hold distinct candidates other than the row itself, ``min(M, #candidates)`` of them
    (ProbSampling: the never-observed candidates only, while there are at most M); the empty
    slots hold other distinct agents, never the row itself."""
    rows, n, m = 9, 12, 4
    P, Q = _kernel_cases(rows, n, 0)
    r = selection.epsilon_greedy(m, eps0=0.5, eps_decay=0.1, eps_min=0.0) if rule == "epsilon_greedy" \
        else selection.prob_sampling(m)
    L = P if rule == "epsilon_greedy" else Q
    rng = np.random.default_rng(1)
    draw = jax.jit(lambda k, c, t: r.select(k, L, t, c))
    for s in range(60):
        cand = rng.random(n) < rng.choice([0.2, 0.5, 0.9])
        sel = draw(jax.random.key(s), jnp.asarray(cand), s % 6)
        idx, valid = np.asarray(sel.idx), np.asarray(sel.valid)
        for j in range(rows):
            others = [i for i in range(n) if cand[i] and i != j]
            k = min(m, len(others))
            if rule == "prob_sampling":
                unexplored = [i for i in others if np.isnan(np.asarray(Q)[j, i])]
                k = len(unexplored) if 0 < len(unexplored) <= m else k
                assert set(idx[j][valid[j]].tolist()) <= set(unexplored or others)
            assert valid[j].tolist() == [t < k for t in range(m)], (s, j, valid[j], k)
            assert set(idx[j][:k].tolist()) <= set(others), (s, j, idx[j], others)
            assert len(set(idx[j].tolist())) == m and j not in idx[j].tolist()


def test_greedy_part_is_the_top_of_the_other_candidates():
    rows, n, m = 9, 12, 5
    P, _ = _kernel_cases(rows, n, 2)
    Pn = np.asarray(P)
    rng = np.random.default_rng(3)
    for s in range(20):
        cand = rng.random(n) < 0.6
        idx, is_rand = selection.draw_epsilon_greedy(jax.random.key(s), P, m, 0.4, candidates=jnp.asarray(cand))
        idx, is_rand = np.asarray(idx), np.asarray(is_rand)
        for j in range(rows):
            others = [i for i in range(n) if cand[i] and i != j]
            k = min(m, len(others))
            rand = idx[j][:k][is_rand[j][:k]]
            greedy = idx[j][:k][~is_rand[j][:k]]
            rest = [i for i in others if i not in rand]
            top = sorted(rest, key=lambda i: -Pn[j, i])[: len(greedy)]
            assert sorted(Pn[j, greedy].tolist()) == sorted(Pn[j, top].tolist()), (s, j)


def test_random_picks_are_uniform_over_the_participants():
    n, m = 10, 3
    cand = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1, 1], bool)
    P = selection.init_likelihood(n)
    counts = np.zeros((n, n))
    draw = jax.jit(lambda k: selection.draw_epsilon_greedy(k, P, m, 1.0, candidates=jnp.asarray(cand))[0])
    for s in range(300):
        np.add.at(counts, (np.repeat(np.arange(n), m), np.asarray(draw(jax.random.key(s))).ravel()), 1)
    for j in range(n):
        others = [i for i in range(n) if cand[i] and i != j]
        assert counts[j][~cand].sum() == 0
        expected = 300 * m / len(others)
        assert np.all(np.abs(counts[j, others] - expected) < 5 * np.sqrt(expected)), (j, counts[j])


@pytest.mark.parametrize("rule", ["epsilon_greedy", "prob_sampling"])
def test_all_candidates_draw_exactly_what_no_mask_draws(rule):
    rows, n, m = 9, 12, 4
    P, Q = _kernel_cases(rows, n, 4)
    r = selection.epsilon_greedy(m) if rule == "epsilon_greedy" else selection.prob_sampling(m)
    L = P if rule == "epsilon_greedy" else Q
    for s in range(10):
        a = r.select(jax.random.key(s), L, s)
        b = r.select(jax.random.key(s), L, s, jnp.ones(n, bool))
        np.testing.assert_array_equal(a.idx, b.idx)
        np.testing.assert_array_equal(a.is_random, b.is_random)
        if a.valid is not None:
            np.testing.assert_array_equal(a.valid, b.valid)
        else:
            assert np.asarray(b.valid).all()


def _losses(params, data, j, i):
    """``L_j(θ_i)`` in float64: the mean squared error of model ``i`` on agent ``j``'s real samples."""
    c = int(data.counts[j])
    x, y = np.asarray(data.x[j, :c], np.float64), np.asarray(data.y[j, :c], np.float64)
    w, b = np.asarray(params["w"][i], np.float64), float(params["b"][i])
    return float(np.mean((x @ w + b - y) ** 2))


@pytest.mark.parametrize("sel,eval_by", [("epsilon_greedy", "agent"),
                                         pytest.param("epsilon_greedy", "model", marks=pytest.mark.slow),
                                         pytest.param("uniform", "agent", marks=pytest.mark.slow),
                                         ("prob_sampling", "agent")])
def test_fewer_participants_than_m(sel, eval_by):
    """|G_n| = 3 of 6 agents, M = 4: each participant downloads the 2 other participants,
    the 2 remaining slots are empty; the consensus point is eq. (19) over the 2 downloads
    (a float64 NumPy reference) and eq. (21) updates only the downloaded entries."""
    n, m, alpha = 6, 4, 5.0
    cfg = FedCBOConfig(M=m, selection=sel, participation=0.5, alpha=alpha, eps0=0.0, eps_min=0.0, eval_by=eval_by,
                       local=fl.LocalSGDConfig(epochs=1, batch_size=5, lr=0.05))
    alg = fedcbo(_linear_model(), cfg, n)
    data = _data(n, seed=1)
    state = alg.init(jax.random.key(2))
    step = jax.jit(alg.round)
    for _ in range(3):
        # The round's models after local training, as round_fn computes them (same key split).
        _, _, k_local, _, _ = jax.random.split(state.key, 5)
        trained = local_train(alg.model, cfg.local, state.params, state.opt_state, data, k_local).params
        new, info = step(state, data)
        active = np.asarray(info.active)
        G = np.nonzero(active)[0].tolist()
        assert len(G) == 3
        _check_downloads(info, m, exact=sel != "prob_sampling")
        params = jax.tree_util.tree_map(lambda t, o: np.where(active.reshape((-1,) + (1,) * (t.ndim - 1)), t, o),
                                        trained, state.params)
        P_old, P_new = np.asarray(state.P, np.float64), np.asarray(new.P, np.float64)
        touched = np.zeros_like(P_old, bool)
        for j in range(n):
            th_w, th_b = np.asarray(params["w"][j], np.float64), float(params["b"][j])
            if not active[j]:  # a non-participant keeps its model and its likelihoods
                np.testing.assert_array_equal(np.asarray(new.params["w"][j]), np.asarray(state.params["w"][j]))
                assert not bool(info.fallback[j])  # it downloaded nothing: not a fallback to its own model
                continue
            A = [i for i in G if i != j]
            unexplored = [i for i in A if np.isnan(P_old[j, i])]
            if sel == "prob_sampling" and 0 < len(unexplored) <= m:  # never-observed participants first
                A = unexplored
            assert sorted(np.asarray(info.idx)[j][np.asarray(info.valid)[j]].tolist()) == A
            L = np.array([_losses(params, data, j, i) for i in A])
            mu = np.exp(-alpha * (L - L.min()))
            m_w = sum(mu_i * np.asarray(params["w"][i], np.float64) for mu_i, i in zip(mu, A)) / mu.sum()
            m_b = sum(mu_i * float(params["b"][i]) for mu_i, i in zip(mu, A)) / mu.sum()
            lam_gamma = cfg.lambda1 * cfg.gamma  # eq. (20)'s λ1 γ from the parameters, not the config's own property
            np.testing.assert_allclose(np.asarray(new.params["w"][j]), th_w - lam_gamma * (th_w - m_w),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(float(new.params["b"][j]), th_b - lam_gamma * (th_b - m_b), rtol=1e-5, atol=1e-5)
            own = _losses(params, data, j, j)
            for i, l_ji in zip(A, L):
                touched[j, i] = True
                if sel == "prob_sampling":
                    prev = P_old[j, i]
                    want = np.exp(-cfg.kappa * l_ji) if np.isnan(prev) else \
                        (1 - cfg.zeta) * prev + cfg.zeta * np.exp(-cfg.kappa * l_ji)
                else:
                    want = P_old[j, i] + own - l_ji  # eq. (21)
                np.testing.assert_allclose(P_new[j, i], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(P_new[~touched], P_old[~touched])  # nothing else moved
        state = new


def test_likelihood_update_skips_empty_slots():
    P = selection.init_likelihood(3, 5)
    idx = jnp.asarray([[1, 2, 3], [0, 2, 4], [0, 1, 3]])
    valid = jnp.asarray([[True, True, False], [True, False, False], [False, False, False]])
    loss = jnp.where(valid, jnp.asarray([[0.5, 1.0, 2.0]] * 3), jnp.inf)  # an empty slot's loss is inf
    own = jnp.asarray([1.0, 1.0, 1.0])
    rule = selection.epsilon_greedy(3)
    got = np.asarray(rule.update(P, idx, loss, own, jnp.ones(3, bool), valid))
    want = np.asarray(P).copy()
    want[0, 1] += 0.5
    want[0, 2] += 0.0
    want[1, 0] += 0.5
    np.testing.assert_array_equal(got, want)


def test_selection_rate_averages_over_the_agents_that_downloaded():
    cluster = jnp.asarray([0, 0, 1])
    idx = jnp.asarray([[1, 2], [0, 2], [0, 1]])
    valid = jnp.asarray([[True, True], [False, False], [True, False]])
    # row 0: 1 of 2 in its cluster; row 1 downloaded nothing (a non-participant); row 2: 0 of 1
    assert float(fm.selection_rate(idx, cluster, valid)) == pytest.approx(0.25)
    full = jnp.ones((3, 2), bool)
    assert float(fm.selection_rate(idx, cluster, full)) == float(fm.selection_rate(idx, cluster))


@pytest.mark.parametrize("eval_by", ["agent", "model"])
def test_full_participation_never_downloads_an_agent_the_data_marks_invalid(eval_by):
    """``AgentData.valid`` False: not an agent (never trained, never in ``G_n``). With
    ``participation=1`` the draw had no candidate mask, and such an agent's untrained model
    was downloaded into the others' consensus points. An all-True ``valid`` runs exactly as
    ``valid=None``."""
    n, m = 5, 3
    data = _data(n)
    invalid = data._replace(valid=jnp.asarray(np.arange(n) != 2), counts=data.counts.at[2].set(0))
    local = fl.LocalSGDConfig(epochs=1, batch_size=4, lr=0.05, momentum=0.0)
    alg = fedcbo(_linear_model(), FedCBOConfig(M=m, local=local, eps0=1.0, eps_min=1.0, eval_by=eval_by), n)
    step = jax.jit(alg.round)
    state = alg.init(jax.random.key(0))
    for _ in range(4):
        state, info = step(state, invalid)
        valid = np.ones(info.idx.shape, bool) if info.valid is None else np.asarray(info.valid)
        active = np.asarray(info.active)
        assert not active[2]
        assert not ((np.asarray(info.idx) == 2) & valid & active[:, None]).any()
        assert valid[active].all()  # four real agents: three others for every M = 3 slots
    runs = []
    for d in (data, data._replace(valid=jnp.ones(n, bool))):
        s = alg.init(jax.random.key(0))
        for _ in range(3):
            s, _ = step(s, d)
        runs.append(s)
    for a, b in zip(jax.tree_util.tree_leaves(runs[0]), jax.tree_util.tree_leaves(runs[1])):
        a, b = (jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v for v in (a, b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in FedCBO (cbo_jax.federated.algorithms.fedcbo).

@pytest.mark.reference
@pytest.mark.parametrize("reduction", ["mean", "sum_of_batch_means"])
def test_model_by_model_energy_honours_the_loss_reduction(reduction):
    """``eval_by="model"``'s energy L_j(θ) of eq. (19) (``group_loss``) reduces each agent's
    per-sample losses as ``loss_reduction`` says: the mean over its real samples (paper) or
    the reference code's sum over mini-batches of B of each batch's mean. Float64 NumPy
    reduction of the model's per-sample losses; a mutant that always took the mean survived
    the default suite (the by-model-equals-by-agent test for this reduction is slow)."""
    model = models.logistic_regression(3, 2)
    rng = np.random.default_rng(0)
    g, n_max, b = 3, 7, 3
    x = rng.normal(size=(g, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (g, n_max)).astype(np.int32)
    counts = np.array([7, 5, 1], np.int32)
    theta = model.init(jax.random.key(0))
    cfg = FedCBOConfig(M=1, loss_reduction=reduction, local=LocalSGDConfig(batch_size=b))
    got = np.asarray(jax.jit(group_loss(model, cfg))(theta, jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts)))
    for j in range(g):
        per = np.asarray(model.loss(model.apply(theta, jnp.asarray(x[j])), jnp.asarray(y[j])), np.float64)[:counts[j]]
        want = per.mean() if reduction == "mean" else sum(per[s:s + b].mean() for s in range(0, counts[j], b))
        assert got[j] == pytest.approx(want, rel=1e-5)


LOGREG = models.logistic_regression(3, 2)
LOCAL = LocalSGDConfig(epochs=1, batch_size=5, lr=0.5, momentum=0.0)


def _agents(n=5, n_max=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 3)).astype(np.float32)
    y = rng.integers(0, 2, (n, n_max)).astype(np.int32)
    counts = rng.integers(3, n_max + 1, n).astype(np.int32)
    return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))


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


@pytest.mark.reference
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


@pytest.mark.reference
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
