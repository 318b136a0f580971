"""FedCB²O, label-flipping attacks, ProbSampling, DFedAvgM oracles, attack metrics."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.consensus import consensus_weights
import cbo_jax.federated as fl
from cbo_jax.federated import attacks, metrics, selection
from cbo_jax.federated.aggregation import consensus_downloads
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm, group_neighbours
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o, g_energy
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.mnist import MNIST, DataError

from _reference import f64, logreg_loss

C = 4
TINY = models.mlp_mnist(hidden=(3,), num_classes=C, input_shape=(2, 2))
SOURCE, TARGET = 2, 1
FLIP = attacks.LabelFlipConfig(source=SOURCE, target=TARGET, num_classes=C, benign_per_cluster=4, malicious_per_cluster=2,
                               benign_samples=10, val_samples=5, malicious_samples=12)
LOCAL = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.9)


def aggregate(model, cfg, params, idx, val, use_G, num_classes):
    """Steps b, d, e for the benign agents (the first idx.shape[0] rows): (loss, w, w_self, m)."""
    own = jax.tree_util.tree_map(lambda a: a[:idx.shape[0]], params)
    res = consensus_downloads(g_energy(model, num_classes, use_G), params, idx, own, (val.x, val.y, val.counts),
                              alpha=cfg.alpha, include_self=cfg.include_self, chunk=cfg.eval_chunk)
    return res.loss, res.weights, res.self_weight, res.consensus


_aggregate = jax.jit(aggregate, static_argnums=(0, 1, 6))


def _images(n_train=200, n_test=40, seed=0):
    rng = np.random.default_rng(seed)
    return MNIST(rng.integers(0, 256, (n_train, 2, 2)).astype(np.uint8), rng.integers(0, C, n_train).astype(np.int32),
                 rng.integers(0, 256, (n_test, 2, 2)).astype(np.uint8), rng.integers(0, C, n_test).astype(np.int32), "fake")


@pytest.fixture(scope="module")
def ds():
    return attacks.label_flip_rotated(_images(), FLIP, seed=3)


@pytest.fixture(scope="module")
def cb2o(ds):
    """FedCB²O on the tiny attacked data (T_G = 1) and its jitted round, compiled once."""
    alg = fedcb2o(TINY, FedCB2OConfig(M=5, T_G=1, local=LOCAL), ds.cluster, ds.malicious)
    return alg, jax.jit(alg.round)


# --- data and attackers -----------------------------------------------------------------------

def test_flipped_labels_touch_only_the_source_class(ds):
    assert ds.x_train.shape == (8, 5, 2, 2) and ds.x_val.shape == (8, 5, 2, 2) and ds.x_mal.shape == (4, 12, 2, 2)
    changed = ds.y_mal != ds.y_mal_clean
    assert changed.any(), "the fixture must contain source-class images"
    assert np.array_equal(changed, ds.y_mal_clean == SOURCE)
    assert np.all(ds.y_mal[changed] == TARGET) and not np.any(ds.y_mal == SOURCE)
    assert np.any(ds.y_train == SOURCE)  # benign labels are untouched
    y = np.array([0, 2, 2, 3, 1])
    assert attacks.flip_labels(y, 2, 1).tolist() == [0, 1, 1, 3, 1]
    assert ds.cluster.tolist() == [0] * 4 + [1] * 4 + [0] * 2 + [1] * 2
    assert ds.malicious.tolist() == [False] * 8 + [True] * 4
    # cluster 1 sees the images rotated by 180 degrees
    assert np.array_equal(ds.test_x[1], np.rot90(ds.test_x[0], 2, axes=(1, 2)))


def test_attackers_download_attackers_then_benign_of_their_cluster():
    cluster = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1])
    malicious = np.array([False] * 6 + [True] * 6)
    idx, valid = attacks.attacker_selection(jax.random.key(0), cluster, malicious, 4)
    idx, valid = np.asarray(idx), np.asarray(valid)
    for a, agent in enumerate(np.nonzero(malicious)[0]):
        row = idx[a].tolist()
        assert agent not in row and len(set(row)) == 4 and valid[a].all()
        assert all(cluster[i] == cluster[agent] for i in row)
        others = [i for i in np.nonzero(malicious & (cluster == cluster[agent]))[0] if i != agent]
        assert sorted(row[:2]) == sorted(others) and all(not malicious[i] for i in row[2:])
    # a budget the cluster cannot fill: the extra slots are invalid
    _, valid = attacks.attacker_selection(jax.random.key(0), cluster, malicious, 8)
    assert np.asarray(valid).sum(1).tolist() == [5] * 6


def test_attacker_average_is_data_size_weighted():
    params = {"w": jnp.arange(5.0)[:, None] * jnp.ones((5, 2))}
    sizes = jnp.array([1.0, 2.0, 3.0, 4.0, 10.0])
    new = attacks.attacker_average(params, jnp.array([4]), jnp.array([[0, 2]]), jnp.array([[True, True]]), sizes)
    expected = (1 * 0 + 3 * 2 + 10 * 4) / 14
    np.testing.assert_allclose(np.asarray(new["w"]), expected, rtol=1e-6)


def test_too_little_data_is_a_clear_error():
    with pytest.raises(DataError, match="needs 35500 training images per cluster"):
        attacks.label_flip_rotated(_images(), attacks.LabelFlipConfig())


# --- ProbSampling -----------------------------------------------------------------------------

def test_prob_sampling_explores_every_agent_first_and_never_duplicates():
    n, m = 11, 3
    P = selection.init_prob_likelihood(n)
    rng = np.random.default_rng(0)
    seen = np.eye(n, dtype=bool)
    sample = jax.jit(selection.draw_prob_sampling, static_argnums=2)
    update = jax.jit(selection.update_prob_likelihood)
    for r in range(8):
        idx = np.asarray(sample(jax.random.key(r), P, m))
        for j in range(n):
            row = idx[j].tolist()
            assert j not in row and len(set(row)) == m
            unexplored = int((~seen[j]).sum())
            # the first min(M, #unexplored) picks are never-selected agents
            assert all(not seen[j, i] for i in row[: min(m, unexplored)])
            if unexplored < m:
                assert all(seen[j, i] for i in row[unexplored:])
        loss = jnp.asarray(rng.uniform(0, 2, idx.shape), jnp.float32)
        P = update(P, jnp.asarray(idx), loss, 2.0, 0.5)
        seen[np.repeat(np.arange(n), m), idx.ravel()] = True
    assert seen.all() and not np.isnan(np.asarray(P)).any()


def test_prob_sampling_draws_proportionally_to_P():
    """Each frequency within 4.5 binomial standard errors sqrt(p (1-p) / N) of its probability.
    N = 100000 draws: the standard error is 0.0009-0.0015, so a 10 % bias of any entry (0.01 on
    the 0.1) is over 10 standard errors and fails; an atol of 0.03 let it pass."""
    p_row = np.array([-np.inf, 0.1, 0.2, 0.3, 0.4], np.float32)
    P = jnp.asarray(np.tile(p_row, (1, 1)))
    n = 100_000
    picks = np.asarray(jax.jit(jax.vmap(lambda k: selection.draw_prob_sampling(k, P, 1)[0, 0]))(
        jax.random.split(jax.random.key(0), n)))
    freq = np.bincount(picks, minlength=5) / n
    assert freq[0] == 0
    p = p_row[1:].astype(np.float64)
    se = np.sqrt(p * (1 - p) / n)
    assert np.min(0.1 * p / se) > 10  # a 10 % bias of any entry is over 10 standard errors
    z = (freq[1:] - p) / se
    assert np.abs(z).max() < 4.5, z


def test_prob_likelihood_update():
    P = selection.init_prob_likelihood(2, 3)
    idx = jnp.array([[1], [2]])
    P1 = selection.update_prob_likelihood(P, idx, jnp.array([[0.5], [jnp.nan]]), kappa=2.0, zeta=0.25)
    assert float(P1[0, 1]) == pytest.approx(np.exp(-1.0)) and float(P1[1, 2]) == 0.0  # first observation sets it
    P2 = selection.update_prob_likelihood(P1, idx, jnp.array([[0.0], [0.0]]), kappa=2.0, zeta=0.25)
    assert float(P2[0, 1]) == pytest.approx(0.75 * np.exp(-1.0) + 0.25) and float(P2[1, 2]) == pytest.approx(0.25)
    assert np.isnan(float(P2[0, 2])) and np.isneginf(float(P2[1, 1]))


def test_prob_likelihood_from_the_papers_zero_start():
    """``start="zero"``: eq. (3.12) from Algorithm 1's ``P_0 = 0``. An agent observed twice
    and one observed once, both with loss 0.5 (κ = 2, ζ = 0.5), hold P = 0.75 e⁻¹ and
    0.5 e⁻¹, so ProbSampling draws them 0.6 : 0.4 (the default start gives both e⁻¹)."""
    P = selection.init_prob_likelihood(1, 3)
    half = jnp.array([[0.5]])
    P = selection.update_prob_likelihood(P, jnp.array([[1]]), half, 2.0, 0.5, start="zero")
    assert float(P[0, 1]) == pytest.approx(0.5 * np.exp(-1.0))
    P = selection.update_prob_likelihood(P, jnp.array([[1]]), half, 2.0, 0.5, start="zero")
    P = selection.update_prob_likelihood(P, jnp.array([[2]]), half, 2.0, 0.5, start="zero")
    np.testing.assert_allclose(np.asarray(P[0, 1:]), [0.75 * np.exp(-1.0), 0.5 * np.exp(-1.0)], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(P[0, 1:]) / float(P[0, 1:].sum()), [0.6, 0.4], rtol=1e-6)
    with pytest.raises(ValueError, match="start"):
        selection.update_prob_likelihood(P, jnp.array([[1]]), half, 2.0, 0.5, start="ones")
    # the configurations pass it to the rule
    rule = fl.FedCB2OConfig(P_start="zero")
    assert rule.P_start == "zero"
    with pytest.raises(ValueError, match="P_start"):
        fl.FedCBOConfig(selection="prob_sampling", P_start="one")
    zero = fl.FedCBOConfig(selection="prob_sampling", P_start="zero").rule()
    got = zero.update(selection.init_prob_likelihood(1, 3), jnp.array([[1]]), half)
    assert float(got[0, 1]) == pytest.approx(0.5 * np.exp(-1.0))


# --- the robustness criterion G against NumPy float64 -----------------------------------------

def _np_class_losses(p, x, y, count):
    h = np.maximum(x.reshape(len(x), -1).astype(np.float64) / 255.0 @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
    logits = h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]
    mx = logits.max(1, keepdims=True)
    per = (np.log(np.exp(logits - mx).sum(1)) + mx[:, 0] - logits[np.arange(len(y)), y])[:count]
    yc = y[:count]
    return np.array([per[yc == c].mean() if np.any(yc == c) else np.nan for c in range(C)]), per.mean()


@pytest.mark.parametrize("use_G,include_self", [(True, False), (True, True), (False, False)])
def test_G_weights_and_consensus_match_numpy_float64(use_G, include_self):
    rng = np.random.default_rng(1)
    n, nb, m, alpha = 7, 4, 3, 3.0
    params = models.init_population(TINY, jax.random.key(2), n)
    x = rng.integers(0, 256, (nb, 9, 2, 2)).astype(np.uint8)
    y = rng.integers(0, C, (nb, 9)).astype(np.int32)
    y[:, :3] = 3  # class 3 always present, class 0 absent for agent 0 below
    y[0][y[0] == 0] = 1
    counts = np.array([9, 7, 8, 9], np.int32)
    idx = np.asarray(selection.draw_prob_sampling(jax.random.key(3), selection.init_prob_likelihood(nb, n), m))
    cfg = FedCB2OConfig(M=m, alpha=alpha, include_self=include_self, eval_chunk=2, local=LOCAL)
    loss, w, w_self, mcons = _aggregate(TINY, cfg, params, jnp.asarray(idx), AgentData(jnp.asarray(x), jnp.asarray(y),
                                       jnp.asarray(counts)), jnp.asarray(use_G), C)
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)["params"]
    row = lambda i: jax.tree_util.tree_map(lambda a: a[i], p64)  # noqa: E731
    for j in range(nb):
        own_c, own_mean = _np_class_losses(row(j), x[j], y[j], counts[j])
        present = ~np.isnan(own_c)
        G, L = [], []
        for i in idx[j]:
            lc, lm = _np_class_losses(row(i), x[j], y[j], counts[j])
            G.append(np.max((lc - own_c)[present]))
            L.append(lm)
        G, L = np.array(G), np.array(L)
        np.testing.assert_allclose(np.asarray(loss[j]), L, rtol=1e-5)
        e = G if use_G else L
        e_self = 0.0 if use_G else own_mean
        if include_self:
            e = np.append(e, e_self)
        ref = np.exp(-alpha * (e - e.min()))
        ref /= ref.sum()
        got = np.append(np.asarray(w[j]), float(w_self[j])) if include_self else np.asarray(w[j])
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-7)
        for name in ("kernel", "bias"):
            leaf = p64["Dense_0"][name]
            stack = np.concatenate([leaf[idx[j]], leaf[j][None]]) if include_self else leaf[idx[j]]
            np.testing.assert_allclose(np.asarray(mcons["params"]["Dense_0"][name][j]), np.tensordot(ref, stack, 1),
                                       rtol=2e-4, atol=1e-6)


# --- robust numerics: NaN/inf models never poison a benign agent -------------------------------

def _poison(params, rows, value):
    return jax.tree_util.tree_map(lambda a: a.at[rows].set(value), params)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_nonfinite_malicious_models_get_zero_weight(ds, cb2o):
    data = ds.attack_data()
    params = models.init_population(TINY, jax.random.key(0), ds.num_agents)
    bad = np.nonzero(ds.malicious)[0]
    # every benign agent downloads all four attackers and one benign agent
    idx = jnp.asarray([[*bad, (j + 1) % ds.num_benign] for j in range(ds.num_benign)])
    alg, step = cb2o
    for value in (jnp.nan, jnp.inf, 1e30):  # NaN/inf parameters; finite parameters with non-finite losses
        poisoned = _poison(params, bad, value)
        for include_self in (False, True):
            cfg = FedCB2OConfig(M=5, include_self=include_self, local=LOCAL)
            for use_G in (True, False):
                _, w, _, m = _aggregate(TINY, cfg, poisoned, idx, data.val, jnp.asarray(use_G), C)
                assert np.all(np.asarray(w[:, :4]) == 0.0)
                assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree_util.tree_leaves(m))
        # whole rounds (mean loss in round 0, G in round 1) with the attackers' models broken:
        # the benign models stay finite and the attackers get no weight
        state = alg.init(jax.random.key(1))
        for _ in range(2):
            state = state._replace(params=_poison(state.params, bad, value))
            state, info = step(state, data)
            for leaf in jax.tree_util.tree_leaves(state.params):
                assert np.isfinite(np.asarray(leaf)[: ds.num_benign]).all()
            w = np.asarray(info.weights)
            assert np.all(w[np.isin(np.asarray(info.idx), bad)] == 0.0)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_all_downloads_broken_keeps_own_model(ds):
    data = ds.attack_data()
    params = models.init_population(TINY, jax.random.key(0), ds.num_agents)
    bad = np.nonzero(ds.malicious)[0]
    poisoned = _poison(params, bad, jnp.nan)
    idx = jnp.asarray(np.tile(bad, (ds.num_benign, 1)))
    _, w, w_self, m = _aggregate(TINY, FedCB2OConfig(M=4, local=LOCAL), poisoned, idx, data.val, jnp.asarray(True), C)
    assert np.all(np.asarray(w) == 0) and np.all(np.asarray(w_self) == 1.0)
    for a, b in zip(jax.tree_util.tree_leaves(m), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[: ds.num_benign])


# --- whole rounds: determinism, T_G switch, oracles ---------------------------------------------

def _run(alg, data, rounds, key, step=None):
    state = alg.init(key)
    step = step or jax.jit(alg.round)
    infos = []
    for _ in range(rounds):
        state, info = step(state, data)
        infos.append(info)
    return state, infos


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_fedcb2o_rounds_are_deterministic_and_G_switches_at_T_G(ds, cb2o):
    data = ds.attack_data()
    alg, step = cb2o
    s1, i1 = _run(alg, data, 2, jax.random.key(5), step)
    s2, i2 = _run(alg, data, 2, jax.random.key(5), step)
    for a, b in zip(jax.tree_util.tree_leaves((s1, i1)), jax.tree_util.tree_leaves((s2, i2))):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # round 0 (< T_G): weights are exp(-α L) of the mean validation losses it reports
    np.testing.assert_allclose(np.asarray(i1[0].weights), np.asarray(consensus_weights(i1[0].loss, 10.0)), rtol=1e-5,
                               atol=1e-7)
    # ProbSampling explored 2 x M = 10 of each benign agent's 11 others, never itself
    P = np.asarray(s1.P)
    assert int(s1.round) == 2 and P.shape == (ds.num_benign, ds.num_agents)
    observed = ~np.isnan(P) & np.isfinite(P)
    assert observed.sum(axis=1).tolist() == [10] * ds.num_benign
    assert np.all(np.isneginf(P[np.arange(ds.num_benign), np.arange(ds.num_benign)]))
    assert np.all((P[observed] > 0) & (P[observed] <= 1))


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_dfedavgm_neighbours_stay_in_their_group_and_average_by_size(ds):
    groups = np.array([0, 0, 0, 1, 1, 1, 1])
    idx = np.asarray(group_neighbours(jax.random.key(0), groups, 2))
    for j, row in enumerate(idx):
        assert j not in row and len(set(row.tolist())) == 2 and all(groups[i] == groups[j] for i in row)
    alg = dfedavgm(TINY, DFedAvgMConfig(M=3, local=LOCAL), ds.cluster)
    state, infos = _run(alg, ds.attack_data(honest=True), 1, jax.random.key(0))
    info = infos[0]
    sizes = np.where(ds.malicious, 12, 5).astype(float)
    idx = np.asarray(info.idx)
    assert np.all(ds.cluster[idx] == ds.cluster[:, None])
    expected = sizes[idx] / (sizes[idx].sum(1) + sizes)[:, None]
    np.testing.assert_allclose(np.asarray(info.weights), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="M"):
        dfedavgm(TINY, DFedAvgMConfig(M=6), ds.cluster)  # clusters have 6 agents: at most 5 neighbours


def test_data_split_otherwise_than_the_algorithm_was_built_for_is_named_at_trace_time(ds):
    data, key = ds.attack_data(), jax.random.key(0)  # 8 benign agents, 4 attackers
    alg = fedcb2o(TINY, FedCB2OConfig(M=5, local=LOCAL), ds.cluster, ds.malicious)
    jax.eval_shape(alg.round, alg.init(key), data)  # the split it was built for traces
    mask = np.r_[[False] * 9, [True] * 3]  # the same 12 agents: 9 benign, 3 attackers
    alg = fedcb2o(TINY, FedCB2OConfig(M=5, local=LOCAL), ds.cluster, mask)
    with pytest.raises(ValueError, match=r"holds 8 benign agents \(8 validation splits\) and 4 attackers, but fedcb2o "
                                         r"was built for 9 benign agents and 3 attackers"):
        jax.eval_shape(alg.round, alg.init(key), data)
    oracle_min = dfedavgm(TINY, DFedAvgMConfig(M=3, local=LOCAL), ds.cluster)  # groups of all 12 agents
    with pytest.raises(ValueError, match=r"holds 8 agents \(8 benign, 0 attackers\), but dfedavgm was built for "
                                         r"groups of 12 agents"):
        jax.eval_shape(oracle_min.round, oracle_min.init(key), ds.attack_data(attackers=False))


# --- metrics ------------------------------------------------------------------------------------

def test_attack_metrics_and_fig5_categories():
    def apply(p, x):
        return jax.nn.one_hot(jnp.broadcast_to(p["pred"], x.shape[:1]), C) * 10.0

    constant = models.Model(init=lambda k: {"pred": jnp.int32(0)}, apply=apply, name="constant", num_classes=C)
    test_y = jnp.asarray([[0, 1, 2, 2, 3], [2, 2, 2, 1, 0]])
    test_x = jnp.zeros((2, 5, 2, 2))
    params = {"pred": jnp.asarray([TARGET, SOURCE])}  # agent 0 always says 'target', agent 1 'source'
    out = metrics.attack_metrics(constant, params, test_x, test_y, jnp.asarray([0, 1]), SOURCE, TARGET, test_batch=2)
    assert out["overall_acc"] == pytest.approx((20 + 60) / 2)
    assert out["source_acc"] == pytest.approx(50.0) and out["asr"] == pytest.approx(50.0)
    assert out["asr_per_cluster"] == [pytest.approx(100.0), pytest.approx(0.0)]
    cluster = jnp.asarray([0, 0, 1, 0, 1])
    malicious = jnp.asarray([False, False, False, True, True])
    idx = jnp.asarray([[1, 3, 4, 2], [0, 2, 3, 4]])
    w = jnp.asarray([[0.5, 0.0, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]])
    freq, weight = metrics.category_stats(idx, w, cluster, malicious)
    np.testing.assert_allclose(np.asarray(freq), [0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(np.asarray(weight), [0.75, 0.0, 0.125, 0.125])


# --- models and data sources ---------------------------------------------------------------------

def test_paper_cnn_shapes():
    cnn = models.cnn_emnist(num_classes=47)
    p = jax.eval_shape(cnn.init, jax.random.key(0))["params"]
    assert p["Conv_0"]["kernel"].shape == (5, 5, 1, 32) and p["Conv_1"]["kernel"].shape == (5, 5, 32, 64)
    assert p["Dense_0"]["kernel"].shape == (7 * 7 * 64, 2048) and p["Dense_1"]["kernel"].shape == (2048, 47)
    out = jax.eval_shape(cnn.apply, {"params": p}, jax.ShapeDtypeStruct((3, 28, 28), jnp.uint8))
    assert out.shape == (3, 47)


def test_emnist_through_tfds_mock_data(tfds):
    from cbo_jax.federated import emnist

    with tfds.testing.mock_data(num_examples=6):
        up = emnist.load_emnist_tfds()
    with tfds.testing.mock_data(num_examples=6):
        raw = emnist.load_emnist_tfds(transpose=False)
    assert up.train_images.shape == (6, 28, 28) and up.train_images.dtype == np.uint8
    assert up.test_labels.shape == (6,) and up.train_labels.max() < emnist.EMNIST_BALANCED_CLASSES
    np.testing.assert_array_equal(up.train_images, np.swapaxes(raw.train_images, 1, 2))
    assert up.source == "tfds:emnist/balanced"


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make,match", [
    (lambda: FedCB2OConfig(zeta=0.0), "zeta"),
    (lambda: FedCB2OConfig(kappa=-1.0), "kappa"),
    (lambda: FedCB2OConfig(T_G=-1), "T_G"),
    (lambda: FedCB2OConfig(criterion="mean"), "criterion"),
    (lambda: FedCB2OConfig(alpha=float("nan")), "alpha"),
    (lambda: FedCB2OConfig(M=0), "M"),
    (lambda: attacks.LabelFlipConfig(source=1, target=1), "source and target"),
    (lambda: attacks.LabelFlipConfig(target=10), "target"),
    (lambda: attacks.LabelFlipConfig(val_samples=500), "val_samples"),
    (lambda: attacks.LabelFlipConfig(malicious_per_cluster=(1, 2, 3)), "malicious_per_cluster"),
    (lambda: attacks.LabelFlipConfig(num_clusters=3), "num_clusters"),
    (lambda: DFedAvgMConfig(M=0), "M"),
    (lambda: selection.draw_prob_sampling(jax.random.key(0), selection.init_prob_likelihood(4), 4), "M="),
    (lambda: fedcb2o(TINY, FedCB2OConfig(M=12), FLIP_CLUSTER, FLIP_MAL), "M="),
])
def test_bad_input_names_the_parameter(make, match):
    with pytest.raises(ValueError, match=match):
        make()


FLIP_CLUSTER = np.array([0] * 4 + [1] * 4 + [0] * 2 + [1] * 2)
FLIP_MAL = np.array([False] * 8 + [True] * 4)


def test_registry_and_scaled_T_G():
    from cbo_jax.experiments import fedcb2o_attack, registry

    reg = registry()
    assert "fedcb2o-attack" in reg and "fedcb2o-tg" in reg
    assert fedcb2o_attack.tg_values(150) == {"T_G=0": 0, "T_G=20": 20, "T_G=30": 30, "T_G=40": 40}
    assert fedcb2o_attack.tg_values(20) == {"T_G=0": 0, "T_G=20": 3, "T_G=30": 4, "T_G=40": 5}


def test_cli_refuses_the_bundled_subset_clearly(tmp_path, capsys):
    from cbo_jax.cli import main

    rc = main(["reproduce", "fedcb2o-attack", "--source", "bundled", "--output", str(tmp_path), "--no-progress"])
    assert rc == 2
    assert "needs 35500 training images per cluster" in capsys.readouterr().err


def test_an_attack_runs_config_json_records_its_variant_algorithm_and_model(tmp_path, monkeypatch, capsys):
    """Each run's config.json held the scale alone: not the variant's algorithm config
    (criterion, T_G, α), the data or attack settings, nor the model. It now holds them, a
    resume reads the finished run back, also from a record written before (the scale alone),
    and a resume with more seeds reads the finished seeds back."""
    import argparse
    import json
    import shutil

    from cbo_jax.experiments import fedcb2o_attack as fa

    monkeypatch.setattr(fa, "_images", lambda args: (_images(), FLIP))
    monkeypatch.setattr(fa, "_model", lambda scale, num_classes: TINY)
    scale = fa.Scale(rounds=1, epochs=1, batch_size=4, lr=0.1, model="mlp", seeds=1, M=2, T_G=1, eval_chunk=4)
    args = argparse.Namespace(output=str(tmp_path / "out"), no_progress=True, resume=False, include_self=False,
                              reference_form=False, dataset="mnist", scale="small", per_cluster_images=False)
    variants = {"fedcb2o": fa._cb2o_builder(fa._cb2o_cfg(scale, "G", scale.T_G, args), "fedcb2o")}
    first = fa._run_variants("fedcb2o-tg", variants, scale, 1, args)["fedcb2o"][0]
    out = tmp_path / "out" / "fedcb2o" / "seed0"
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["experiment"] == "fedcb2o-tg" and recorded["variant"] == "fedcb2o" and recorded["seed"] == 0
    assert recorded["algorithm"] == "fedcb2o" and recorded["model"]["name"] == TINY.name
    assert {k: recorded["config"][k] for k in ("criterion", "T_G", "alpha", "M")} == {
        "criterion": "G", "T_G": 1, "alpha": 2.0, "M": 2}
    assert recorded["settings"]["shared_images"] is True and "seeds" not in recorded["settings"]
    # resumed (with a second seed): seed 0 is read back, seed 1 runs
    earlier = tmp_path / "earlier"
    shutil.copytree(tmp_path / "out", earlier, ignore=shutil.ignore_patterns(".lock"))
    real, ran = fa.run, []
    monkeypatch.setattr(fa, "run", lambda alg, data, rounds, key, **k: ran.append(k["out"]) or real(
        alg, data, rounds, key, **k))
    args.resume = True
    again = fa._run_variants("fedcb2o-tg", variants, scale, 2, args)["fedcb2o"]
    assert ran == [tmp_path / "out" / "fedcb2o" / "seed1"]
    assert again[0].history == json.loads(json.dumps(first.history))
    # a record written before this change (the scale alone) is the same finished run
    (earlier / "fedcb2o" / "seed0" / "config.json").write_text(json.dumps(dataclasses.asdict(scale)))
    args.output, ran[:] = str(earlier), []
    fa._run_variants("fedcb2o-tg", variants, scale, 1, args)
    assert ran == []
    assert "finished earlier, its results read back" in capsys.readouterr().out


def test_fedcbo_prob_sampling_option():
    from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo

    rng = np.random.default_rng(0)
    data = AgentData(jnp.asarray(rng.integers(0, 256, (6, 5, 2, 2)).astype(np.uint8)),
                     jnp.asarray(rng.integers(0, C, (6, 5)).astype(np.int32)), jnp.full((6,), 5, jnp.int32))
    alg = fedcbo(TINY, FedCBOConfig(M=2, selection="prob_sampling", local=LOCAL), 6)
    state = alg.init(jax.random.key(0))
    assert np.isnan(np.asarray(state.P)[~np.eye(6, dtype=bool)]).all()
    state, info = jax.jit(alg.round)(state, data)
    idx, P = np.asarray(info.idx), np.asarray(state.P)
    assert np.asarray(info.is_random).all()  # round 0 explores
    rows = np.repeat(np.arange(6), 2)
    assert np.all((P[rows, idx.ravel()] > 0) & (P[rows, idx.ravel()] <= 1))
    assert np.isnan(P).sum() == 30 - 12
    with pytest.raises(ValueError, match="zeta"):
        FedCBOConfig(selection="prob_sampling", zeta=2.0)


def test_prob_sampling_downloads_only_the_unobserved_when_at_most_M_are_left():
    """Algorithm 2: 'randomly pick M agents in S uniformly if |S| > M else pick set S'."""
    P = selection.init_prob_likelihood(1, 6)  # agent 0; 5 others never observed
    P = P.at[0, 1:4].set(0.5)  # 3 observed, 2 (agents 4, 5) left
    valid = np.asarray(selection.prob_sampling_valid(P, 3))
    idx = np.asarray(selection.draw_prob_sampling(jax.random.key(0), P, 3))
    assert valid.tolist() == [[True, True, False]] and sorted(idx[0, :2].tolist()) == [4, 5]
    P2 = selection.update_prob_likelihood(P, jnp.asarray(idx), jnp.zeros((1, 3)), 2.0, 0.5, valid=jnp.asarray(valid))
    assert float(P2[0, idx[0, 2]]) == 0.5  # the empty slot's agent is not updated
    assert np.asarray(selection.prob_sampling_valid(P.at[0, 4:].set(0.1), 3)).all()  # all observed: M downloads
    assert np.asarray(selection.prob_sampling_valid(selection.init_prob_likelihood(1, 6), 3)).all()  # |S| = 5 > M


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_reference_form_shared_init_and_own_model_largest_after_T_G(ds):
    cfg = FedCB2OConfig.reference_code(M=5, T_G=1, local=LOCAL)
    assert cfg.include_self and cfg.self_largest and cfg.shared_init and cfg.step == 1.0
    alg = fedcb2o(TINY, cfg, ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(0))
    for leaf in jax.tree_util.tree_leaves(state.params):
        assert np.all(np.asarray(leaf) == np.asarray(leaf)[:1])  # one shared initial model
    step = jax.jit(alg.round)
    state, before = step(state, ds.attack_data())  # round 0 < T_G: own energy = own mean loss
    state, after = step(state, ds.attack_data())  # round 1 >= T_G: the own model weighs most
    w, s = np.asarray(after.weights), np.asarray(after.self_weight)
    assert np.all(s[:, None] >= w - 1e-7) and np.all(s > 0)
    assert not np.all(np.asarray(before.self_weight)[:, None] >= np.asarray(before.weights) - 1e-7)
    with pytest.raises(ValueError, match="self_largest needs include_self"):
        FedCB2OConfig(self_largest=True)


def test_label_flip_config_changes_one_field_at_a_time():
    """Found by the property test in random mode: the per-cluster counts were stored expanded
    to the default two clusters, so changing ``num_clusters`` alone (CLI overrides,
    ``dataclasses.replace``) failed on ``benign_per_cluster``; and a smaller ``num_classes``
    was refused naming only ``source``."""
    cfg = attacks.LabelFlipConfig()
    one = dataclasses.replace(cfg, num_clusters=1)
    assert one.benign_counts == (35,) and one.malicious_counts == (15,)
    assert dataclasses.replace(cfg, num_clusters=4).images_per_cluster == (35 * 500 + 15 * 1200,) * 4
    with pytest.raises(ValueError, match="num_clusters = 4"):
        attacks.LabelFlipConfig(benign_per_cluster=(3, 4), num_clusters=4)
    with pytest.raises(ValueError, match="num_classes"):
        dataclasses.replace(cfg, num_classes=2)


def test_builders_refuse_non_integral_cluster_ids():
    # fedcb2o and dfedavgm cast the ids with np.asarray(..., np.int32): 0.5 became cluster 0
    # silently (and a negative id failed deep in np.bincount, or not at all).
    half = FLIP_CLUSTER.astype(float)
    half[3] = 0.5
    cfg, dcfg = FedCB2OConfig(M=5, local=LOCAL), DFedAvgMConfig(M=3, local=LOCAL)
    with pytest.raises(ValueError, match=r"cluster ids must be integers.*agent 3.*0\.5"):
        fedcb2o(TINY, cfg, half, FLIP_MAL)
    with pytest.raises(ValueError, match=r"groups ids must be integers.*agent 3.*0\.5"):
        dfedavgm(TINY, dcfg, half)
    negative = np.where(np.arange(12) == 2, -1, FLIP_CLUSTER)
    with pytest.raises(ValueError, match=r"cluster ids must be >= 0.*agent 2.*-1"):
        fedcb2o(TINY, cfg, negative, FLIP_MAL)
    with pytest.raises(ValueError, match=r"groups ids must be >= 0.*agent 2.*-1"):
        dfedavgm(TINY, dcfg, negative)
    with pytest.raises(ValueError, match=r"cluster must be a 1-D array of ids"):
        fedcb2o(TINY, cfg, FLIP_CLUSTER[:, None], FLIP_MAL)
    with pytest.raises(ValueError, match=r"cluster ids must be integers"):
        fedcb2o(TINY, cfg, np.where(np.arange(12) == 0, np.nan, FLIP_CLUSTER), FLIP_MAL)
    # integral floats (1.0) are the same ids
    fedcb2o(TINY, cfg, FLIP_CLUSTER.astype(float), FLIP_MAL)
    dfedavgm(TINY, dcfg, FLIP_CLUSTER.astype(np.float32))
    # the round metrics that close over the true ids truncated them the same way
    with pytest.raises(ValueError, match=r"cluster ids must be integers.*agent 3"):
        metrics.attack_selection(half, FLIP_MAL)


def test_run_refuses_attack_labels_outside_the_model_classes(ds):
    from cbo_jax.federated import run

    alg = fedcb2o(TINY, FedCB2OConfig(M=5, local=LOCAL), ds.cluster, ds.malicious)
    data = ds.attack_data()
    bad_val = data._replace(val=data.val._replace(y=data.val.y.at[2, 1].set(C)))
    with pytest.raises(ValueError, match=rf"val\.y holds labels outside \[0, {C}\) .*: agent 2 has label {C} "):
        run(alg, bad_val, 1, jax.random.key(0), progress=False)
    bad_mal = data._replace(malicious=data.malicious._replace(y=data.malicious.y.at[1, 0].set(-3)))
    # attacker 1 of 4 is agent 9 (after the 8 benign agents)
    with pytest.raises(ValueError, match=r"malicious\.y holds .*: agent 9 has label -3 "):
        run(alg, bad_mal, 1, jax.random.key(0), progress=False)


def test_clusters_rotate_one_shared_subset_of_the_images():
    """The paper (§3.5, and its authors' reference code) rotates one subset of the
    training images for both clusters; each cluster drew its own subset before
    (``shared_images=False`` keeps that). Within a cluster the agents' images stay disjoint."""
    images = _images(n_train=200)
    cfg = attacks.LabelFlipConfig(source=SOURCE, target=TARGET, num_classes=C, benign_per_cluster=4,
                                  malicious_per_cluster=2, benign_samples=10, val_samples=5, malicious_samples=12)
    for shared in (True, False):
        ds = attacks.label_flip_rotated(images, dataclasses.replace(cfg, shared_images=shared), seed=3)
        per_cluster = []
        for k, degrees in enumerate(attacks.ROTATIONS[2]):
            x = np.concatenate([ds.x_train[ds.cluster[:8] == k].reshape(-1, 2, 2),
                                ds.x_val[ds.cluster[:8] == k].reshape(-1, 2, 2),
                                ds.x_mal[ds.cluster[8:] == k].reshape(-1, 2, 2)])
            back = np.rot90(x, k=-degrees // 90, axes=(1, 2))  # undo the cluster's rotation
            keys = {a.tobytes() for a in back}
            assert len(keys) == len(back) == 4 * 10 + 2 * 12  # disjoint within the cluster
            per_cluster.append(keys)
        assert (per_cluster[0] == per_cluster[1]) is shared


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

def _np_logreg_class_losses(theta, x, y, count, num_classes):
    """(L_c with NaN for absent classes, L): float64 class-wise and mean cross-entropies."""
    per = np.array([logreg_loss(theta, x[i:i + 1], y[i:i + 1], 1) for i in range(count)])
    l_c = np.array([per[y[:count] == c].mean() if np.any(y[:count] == c) else np.nan for c in range(num_classes)])
    return l_c, per.mean()


@functools.lru_cache(maxsize=None)
def _fedcb2o_round_at_T_G():
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


@pytest.mark.reference
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
        own_c, _ = _np_logreg_class_losses(row(j), vx[j], vy[j], vc[j], 3)
        present = ~np.isnan(own_c)
        g, loss = [], []
        for i in idx[j, :2]:
            l_c, l_mean = _np_logreg_class_losses(row(i), vx[j], vy[j], vc[j], 3)
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


# Mutation-testing gaps in FedCB²O and its attackers (cbo_jax.federated.algorithms.fedcb2o,
# cbo_jax.federated.attacks). Tiny sizes, float64 NumPy references or closed forms.

FLIP_REF = attacks.LabelFlipConfig(source=2, target=1, num_classes=C, benign_per_cluster=3, malicious_per_cluster=2,
                               benign_samples=8, val_samples=4, malicious_samples=6)
LOCAL_REF = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0)
# The reference code's form (include_self, self_largest, shared_init, α = 2) with a step λ1γ = 0.35, not 1.
CFG_REF = FedCB2OConfig.reference_code(M=3, T_G=1, lambda1=3.5, gamma=0.1, local=LOCAL_REF)


def _dataset():
    rng = np.random.default_rng(0)
    images = MNIST(rng.integers(0, 256, (120, 2, 2)).astype(np.uint8), rng.integers(0, C, 120).astype(np.int32),
                   rng.integers(0, 256, (20, 2, 2)).astype(np.uint8), rng.integers(0, C, 20).astype(np.int32), "fake")
    return attacks.label_flip_rotated(images, FLIP_REF, seed=1)


@functools.lru_cache(maxsize=None)
def _round_zero():
    """One round (round 0 < T_G) of CFG, and the models after its local training, recomputed
    from the round's key split (as the FedCBO round tests do): one compilation for both tests."""
    ds = _dataset()
    data = ds.attack_data()
    nb = ds.num_benign
    alg = fedcb2o(TINY, CFG_REF, ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(7))
    _, k_local, _, _ = jax.random.split(state.key, 4)
    val = data.val

    @jax.jit
    def trained_and_val_losses(state, data):
        trained = attacks.grouped_local_train(TINY, LOCAL_REF, state.params, state.opt_state, data.groups, k_local).params
        benign = jax.tree_util.tree_map(lambda a: a[:nb], trained)
        return trained, jax.vmap(lambda p, x, y: TINY.loss(TINY.apply(p, x), y))(benign, val.x, val.y)

    trained, per = trained_and_val_losses(state, data)
    new, info = jax.jit(alg.round)(state, data)
    f64 = lambda t: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), t)  # noqa: E731
    return nb, np.asarray(val.counts), f64(trained), np.asarray(per, np.float64), info, f64(new.params)


@pytest.mark.reference
def test_attacker_average_ignores_the_slots_its_cluster_cannot_fill():
    """The attackers' strategy (FedCB²O §3.5, attacks.attacker_average): the average of the own
    model and the *valid* downloads, weighted by training-set size. A slot marked invalid
    (attacker_selection: the cluster has fewer than M others) holds some other agent and must
    weigh nothing; a mutant that ignored ``valid`` survived the default suite."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 3))
    sizes = np.array([2.0, 5.0, 1.0, 7.0, 3.0, 4.0])
    attackers = np.array([4, 5])
    idx = np.array([[5, 0, 2], [4, 1, 3]])
    valid = np.array([[True, True, False], [True, False, False]])
    new = attacks.attacker_average({"w": jnp.asarray(w, jnp.float32)}, jnp.asarray(attackers), jnp.asarray(idx),
                                   jnp.asarray(valid), jnp.asarray(sizes, jnp.float32))
    for r, a in enumerate(attackers):
        rows = [a] + [i for i, v in zip(idx[r], valid[r]) if v]
        ref = np.sum(sizes[rows, None] * w[rows], axis=0) / np.sum(sizes[rows])
        np.testing.assert_allclose(np.asarray(new["w"][r]), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.reference
def test_reference_form_weighs_the_own_model_by_its_loss_before_T_G():
    """FedCB2OConfig.reference_code (include_self, self_largest): the own model gets the largest
    weight only from round T_G on, together with G; before T_G the energy of every model,
    the own one included, is its mean validation loss (FedCB²O Algorithm 1, step f), so
    μ_self ∝ exp(-α L_j(θ_j)). Checked at round 0 < T_G against the losses of the trained
    models. A mutant applying self_largest before T_G survived the default suite."""
    nb, counts, _, per, info, _ = _round_zero()
    capped = 0
    for j in range(nb):
        own = per[j, :counts[j]].mean()
        ok = np.asarray(info.valid[j]) if info.valid is not None else np.ones(CFG_REF.M, bool)
        down = np.asarray(info.loss[j], np.float64)[ok]
        capped += own > down.min()
        e = np.append(down, own)
        mu = np.exp(-CFG_REF.alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(info.weights[j])[ok], mu[:-1], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(float(info.self_weight[j]), mu[-1], rtol=1e-4, atol=1e-6)
    assert capped > 0  # some agent's own loss is above its best download's: self_largest would change it


@pytest.mark.reference
def test_loss_criterion_keeps_the_mean_loss_from_round_T_G_on():
    """``criterion="loss"`` (FedCBO with ProbSampling, the attacked baseline) never switches to G
    nor to self_largest: from round T_G on, as before it, every model's energy, the own one
    included, is its mean validation loss. With T_G = 0 its round 0 is past T_G; it trains and
    selects as CFG's round 0 (same key), so the weights are exp(-α L) over the same trained
    models. A mutant that switched the baseline to G at T_G was caught only by a slow pinned run."""
    nb, counts, _, per, _, _ = _round_zero()
    ds = _dataset()
    alg = fedcb2o(TINY, dataclasses.replace(CFG_REF, criterion="loss", T_G=0), ds.cluster, ds.malicious)
    state = alg.init(jax.random.key(7))
    _, info = jax.jit(alg.round)(state, ds.attack_data())
    assert int(state.round) >= alg.config.T_G
    capped = 0
    for j in range(nb):
        own = per[j, :counts[j]].mean()
        ok = np.asarray(info.valid[j]) if info.valid is not None else np.ones(CFG_REF.M, bool)
        down = np.asarray(info.loss[j], np.float64)[ok]
        capped += own > down.min()
        e = np.append(down, own)
        mu = np.exp(-CFG_REF.alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(info.weights[j])[ok], mu[:-1], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(float(info.self_weight[j]), mu[-1], rtol=1e-4, atol=1e-6)
    assert capped > 0  # some agent's own loss is above its best download's: self_largest (with G) would change it


@pytest.mark.reference
def test_benign_update_moves_the_fraction_lambda1_gamma_towards_the_consensus_point():
    """FedCB²O eq. (3.14): θ_j ← θ_j - λ1γ (θ_j - m_j), with m_j = Σ_i μ_i θ_i + μ_self θ_j
    (eq. (3.13), the own model included in the reference form) over the trained models and
    the round's weights. λ1γ = 0.35 here; at the default λ1γ = 1 (θ_j ← m_j) a mutant that
    ignored the step survived the default suite."""
    nb, _, trained, _, info, new = _round_zero()
    step = CFG_REF.lambda1 * CFG_REF.gamma
    idx = np.asarray(info.idx)
    w = np.asarray(info.weights, np.float64)
    w_self = np.asarray(info.self_weight, np.float64)
    for t, got in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(new)):
        for j in range(nb):
            m_j = np.tensordot(w[j], t[idx[j]], axes=1) + w_self[j] * t[j]
            assert np.max(np.abs(t[j] - m_j)) > 1e-4  # the trained model is not its consensus point
            np.testing.assert_allclose(got[j], t[j] - step * (t[j] - m_j), rtol=1e-5, atol=1e-6)
