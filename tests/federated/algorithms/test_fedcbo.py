"""Federated algorithms: FedCBO aggregation vs NumPy float64, limits, IFCA, memory planning.

Determinism, resume and padding of every algorithm: tests/test_federated_engine.py."""

import collections
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax import population as pop
from cbo_jax.federated import metrics, run, selection
from cbo_jax.federated.aggregation import consensus_downloads
from cbo_jax.federated.algorithms import AgentData, FedAvgConfig, FedCBOConfig, IFCAConfig, fedavg, fedcbo, ifca
from cbo_jax.federated.algorithms.fedcbo import loss_energy
from cbo_jax.federated.data import FederatedData
from cbo_jax.federated.local import LocalSGDConfig, local_train

TINY = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))


def aggregate(model, cfg, params, idx, data):
    """FedCBO's eq. (19) for every agent: (loss (N, M), own loss (N,), consensus points).

    Jitted, as in a round: one compile instead of some hundred op-by-op ones."""

    def downloads(params, idx, data):
        res = consensus_downloads(loss_energy(model, cfg), params, idx, params, (data.x, data.y, data.counts),
                                  alpha=cfg.alpha, chunk=cfg.eval_chunk)
        return res.loss, res.own_loss, res.consensus

    return jax.jit(downloads)(params, idx, data)


def _run(alg, model, data, rounds, key, **kw):
    kw.setdefault("progress", False)
    rms = [metrics.round_stats, metrics.selection(data.cluster), metrics.cluster_purity(data.cluster)]
    return run(alg, data, rounds, key, round_metrics=rms, metrics=[metrics.test_accuracy(model, data)], **kw)


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


@pytest.mark.parametrize("name", ["fedavg", "ifca"])
def test_a_diverged_agent_gets_weight_zero_in_the_server_average(name):
    """Agent 3's local training diverges (NaN inputs): its NaN model must not reach the
    server models (0 · NaN = NaN in a plain weighted sum); each server model is the
    count-weighted mean of its finite members, computed here in float64."""
    data = _tiny_data(4)
    data = data._replace(x=data.x.at[3].set(jnp.nan))
    loc = LocalSGDConfig(epochs=2, batch_size=4, momentum=0.0)
    alg = fedavg(TINY, FedAvgConfig(local=loc), 4) if name == "fedavg" else ifca(TINY, IFCAConfig(k=2, local=loc), 4)
    state = alg.init(jax.random.key(0))
    new, info = jax.jit(alg.round)(state, data)
    k_local = jax.random.split(state.key, 3)[2]
    if name == "fedavg":
        servers = jax.tree_util.tree_map(lambda a: a[None], state.params)
        assignment = np.zeros(4, int)
        new_servers = jax.tree_util.tree_map(lambda a: a[None], new.params)
    else:
        servers, assignment, new_servers = state.params, np.asarray(info.assignment), new.params
    trained = local_train(TINY, loc, jax.tree_util.tree_map(lambda a: a[assignment], servers), None, data, k_local)
    finite = np.asarray(pop.tree_isfinite_rows(trained.params))
    assert not finite[3] and finite[:3].all()  # the premise: exactly agent 3 diverged
    counts = np.asarray(data.counts, np.float64)
    for k in range(len(jax.tree_util.tree_leaves(servers)[0])):
        w = counts * ((assignment == k) & finite)
        for got, rows, old in zip(jax.tree_util.tree_leaves(new_servers), jax.tree_util.tree_leaves(trained.params),
                                  jax.tree_util.tree_leaves(servers)):
            if w.sum() == 0:  # nothing finite to average: the server model is kept
                np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(old[k]))
                continue
            rows = np.where(finite.reshape((-1,) + (1,) * (rows.ndim - 1)), np.asarray(rows, np.float64), 0.0)
            want = np.tensordot(w / w.sum(), rows, axes=1)
            np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-5, atol=1e-6)


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


def _two_cluster_data(n_per=6, n=40, seed=0):
    """Two clusters with opposite labelling rules on 2-D inputs: trivially separable."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2 * n_per, n, 2, 1)).astype(np.float32)
    cluster = np.repeat([0, 1], n_per)
    y = (x[:, :, 0, 0] > 0).astype(np.int32)
    y[cluster == 1] = 1 - y[cluster == 1]
    tx = rng.normal(size=(2, 200, 2, 1)).astype(np.float32)
    ty = np.stack([(tx[0, :, 0, 0] > 0), (tx[1, :, 0, 0] <= 0)]).astype(np.int32)
    return FederatedData(x, y, np.full(2 * n_per, n, np.int32), cluster.astype(np.int32), tx, ty)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_ifca_recovers_true_clusters_and_fedcbo_selects_own_cluster():
    data = _two_cluster_data()
    model = models.mlp_mnist(hidden=(8,), num_classes=2, input_shape=(2, 1))
    loc = LocalSGDConfig(epochs=2, batch_size=10, lr=0.1, momentum=0.5)
    alg = ifca(model, IFCAConfig(k=2, local=loc), 12)
    res = _run(alg, model, data, 10, jax.random.key(0), every=5)
    assert res.summary["final_cluster_purity"] == 1.0
    assert res.summary["final_test_acc"] > 90
    cfg = FedCBOConfig(M=4, alpha=10.0, eps0=0.3, eps_decay=0.05, eps_min=0.0, local=loc)
    alg = fedcbo(model, cfg, 12)
    res = _run(alg, model, data, 12, jax.random.key(1), every=6)
    assert res.summary["final_sr"] > 0.9 and res.summary["final_test_acc"] > 90
    freq = np.asarray(res.history[-1]["selection_frequency"])
    assert freq[0, 0] > 0.9 and freq[1, 1] > 0.9


def test_selection_metrics():
    cluster = jnp.asarray([0, 0, 0, 1, 1, 1])
    idx = jnp.asarray([[1, 3], [0, 2], [1, 0], [4, 5], [3, 0], [3, 4]])
    assert float(metrics.selection_rate(idx, cluster)) == pytest.approx(10 / 12)
    assert float(metrics.oracle_selection_rate(0.5, cluster)) == pytest.approx(0.5 + 0.5 * 2 / 5)
    # The ε-greedy draw makes ⌊εM⌋ random picks: the oracle of the draw used (M = 3: 1 of 3, then 0 of 3)
    # (M = 3 against 2 same-cluster peers: capped at 2/3, which a perfect P reaches; the formula gave
    # 2/3 + 1/3 · 2/5 and 1)
    assert float(metrics.oracle_selection_rate(0.5, cluster, 3)) == pytest.approx(2 / 3)
    assert float(metrics.oracle_selection_rate(0.25, cluster, 3)) == pytest.approx(2 / 3)
    assert float(metrics.oracle_selection_rate(0.5, cluster, 2)) == pytest.approx(1 / 2 + 1 / 2 * 2 / 5)
    big = jnp.repeat(jnp.arange(2), 11)  # 10 same-cluster peers of 21 others, M = 10
    assert float(metrics.oracle_selection_rate(0.7, big, 10)) == pytest.approx(0.3 + 0.7 * 10 / 21)  # 0.7 in f32
    # fewer same-cluster peers than downloads: a perfect P reaches (|C(j)| - 1) / M at most (it said 1)
    pairs = jnp.repeat(jnp.arange(4), 2)  # one peer each, M = 3
    assert float(metrics.oracle_selection_rate(0.0, pairs, 3)) == pytest.approx(1 / 3)
    mixed = jnp.asarray([0, 0, 0, 0, 1, 1])  # 3 peers (uncapped at M = 2) and 1 peer (capped at 1/2)
    assert float(metrics.oracle_selection_rate(0.0, mixed, 2)) == pytest.approx((4 * 1.0 + 2 * 0.5) / 6)
    # in the round metric, with the info's M
    Info = collections.namedtuple("Info", "idx eps valid")
    got = metrics.selection(np.asarray(cluster))(Info(idx, jnp.float32(0.5), None))
    assert float(got["sr_oracle"]) == pytest.approx(1 / 2 + 1 / 2 * 2 / 5)  # M = 2: ⌊0.5 · 2⌋ = 1 of 2
    got = metrics.selection(np.asarray(cluster))(Info(idx, jnp.float32(0.4), None))
    assert float(got["sr_oracle"]) == pytest.approx(1.0)  # ⌊0.4 · 2⌋ = 0 random picks (ε itself: 0.76)
    f = np.asarray(metrics.selection_frequency(idx, cluster, 2))
    np.testing.assert_allclose(f, [[5 / 6, 1 / 6], [1 / 6, 5 / 6]])


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


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_eval_chunk_for_memory_budget():
    from cbo_jax.federated.memory import eval_chunk_for_budget, planned_round_bytes

    data = _two_cluster_data(n_per=4, n=12).train
    model = models.mlp_mnist(hidden=(64,), num_classes=2, input_shape=(2, 1))
    cfg = FedCBOConfig(M=6, local=LocalSGDConfig(epochs=1, batch_size=6))
    # eval_chunk=4 is planned once (inside eval_chunk_for_budget), not twice: each plan compiles a round.
    sizes = {1: planned_round_bytes(fedcbo(model, dataclasses.replace(cfg, eval_chunk=1), 8), data)}
    chunk, plan = eval_chunk_for_budget(model, cfg, data, sizes[1], candidates=(4, 1))
    assert list(plan) == [4, 1]  # tried from the largest down
    sizes[4] = plan[4]
    assert sizes[4] > sizes[1]  # bigger chunks plan more memory
    assert chunk == 1 and plan == sizes  # the largest chunk that fits
    with pytest.raises(ValueError, match="even with eval_chunk=1"):
        eval_chunk_for_budget(model, cfg, data, 1024, candidates=(1,))
    by_model = dataclasses.replace(cfg, eval_by="model", eval_chunk=3)  # a group size, kept as given
    chunk, plan = eval_chunk_for_budget(model, by_model, data, 2 * sizes[4], candidates=(4, 1))
    assert chunk == 3 and list(plan) == [3]


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
    from cbo_jax.federated.local import local_train

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


@pytest.mark.parametrize("eps,m,random_picks", [(0.5, 3, 1), (0.3, 3, 0), (0.7, 10, 7), (0.49, 20, 9), (1.0, 4, 4)])
def test_epsilon_greedy_random_share_is_the_floor_of_eps_m(eps, m, random_picks):
    """⌊εM⌋ random picks, the reference code's int(ε·M) (εM need not be an integer; ε = 0.7 is
    0.69999999 in float32 and still gives 7 of 10)."""
    P = selection.init_likelihood(24)
    _, is_random = selection.draw_epsilon_greedy(jax.random.key(0), P, m, jnp.float32(eps))
    assert np.asarray(is_random).sum(axis=1).tolist() == [random_picks] * 24


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


def test_grouped_test_evaluation_equals_the_per_agent_one():
    """Agents sharing a test set are evaluated together (one product over the shared
    inputs per chunk): the same accuracies as each agent on its own copy of the test set,
    and losses up to float32 summation order; uneven groups, an empty group, test counts."""
    rng = np.random.default_rng(0)
    n, t, size = 9, 4, 12
    params = models.init_population(TINY, jax.random.key(1), n)
    x = jnp.asarray(rng.normal(size=(t, size, 2, 2)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, (t, size)), jnp.int32)
    counts = jnp.asarray([12, 7, 12, 5], jnp.int32)
    test_of = np.asarray([2, 0, 0, 1, 2, 2, 0, 1, 2], np.int32)  # test set 3 has no agent
    groups = tuple(tuple(int(j) for j in np.flatnonzero(test_of == k)) for k in range(t))
    for c in (None, counts):
        acc, loss = metrics._grouped_eval(TINY, 2, groups, params, x, y, c)
        acc_ref, loss_ref = metrics._agent_eval(TINY, 2, params, x, y, c, jnp.asarray(test_of))
        np.testing.assert_array_equal(np.asarray(acc), np.asarray(acc_ref))
        np.testing.assert_allclose(np.asarray(loss), np.asarray(loss_ref), rtol=1e-6)
        # and against NumPy: agent j's accuracy on its own test set
        for j in range(n):
            k = test_of[j]
            m = size if c is None else int(counts[k])
            out = np.asarray(TINY.apply(jax.tree_util.tree_map(lambda a: a[j], params), x[k]))[:m]
            assert abs(float(acc[j]) - np.mean(out.argmax(-1) == np.asarray(y[k])[:m])) < 1e-6


class _Info(NamedTuple):
    active: jax.Array
    train_loss: jax.Array


def test_round_stats_train_loss_is_the_mean_over_the_participants():
    """Every agent trains in the vmapped kernel, but only G_n's training is kept: the
    reported training loss is theirs (it was the mean over every agent)."""
    info = metrics.round_stats(_Info(jnp.asarray([True, False, True, False]), jnp.asarray([1.0, 9.0, 3.0, 9.0])))
    assert float(info["train_loss"]) == 2.0 and int(info["participants"]) == 2
    none = metrics.round_stats(_Info(jnp.zeros(2, bool), jnp.asarray([1.0, 2.0])))
    assert np.isnan(float(none["train_loss"]))  # no participant, no training loss
