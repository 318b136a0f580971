"""Partial participation in FedCBO: downloads come from the participating agents ``G_n``.

FedCBO's Algorithm 2 draws ``A_n ← ε-greedySampling(P_n^j, G_n, M)``: ``⌊εM⌋`` random
picks from ``G_n`` and the rest the top-``P`` agents of ``G_n \\ A_n^1``, never the agent
itself. With ``participation < 1`` the downloads of a participating agent are therefore
participants; when fewer than ``M`` other agents participate, the slots left over hold no
download (``Selection.valid``), weigh nothing in the consensus point (19) and leave the
likelihood matrix (21) unchanged. ``participation = 1`` (the paper's experiments) is
unchanged bitwise (tests/test_federated_engine.py's pinned runs; here: an all-True
candidate mask draws exactly what no mask draws).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax.federated import metrics as fm
from cbo_jax.federated import selection
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo
from cbo_jax.federated.local import local_train
from cbo_jax.models import Model


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
