"""CFL (Sattler et al. 2021, Algorithm 1): one round without a split against a float64 NumPy reference
(FedAvg in every cluster, the split criterion's norms), a split of a cluster whose agents' updates point
in opposite directions (the two groups exactly), and the jitted bipartition against a brute-force NumPy
agglomerative clustering (and, for single linkage, against the exhaustive min-max bipartition)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated.algorithms.cfl import bipartition, cosine_similarities
from cbo_jax.federated.local import LocalSGDConfig, local_train

MODEL = models.mlp_mnist(hidden=(4,), num_classes=3, input_shape=(2, 2))
LOCAL = LocalSGDConfig(epochs=2, batch_size=4, lr=0.1, momentum=0.5)


def _leaves(tree):
    return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(tree)]


def _groups(sim, members, linkage):
    """Agglomerative clustering into two groups, by its definition (lists of sets)."""
    groups = [{i} for i in np.flatnonzero(members)]
    pick = min if linkage == "complete" else max
    while len(groups) > 2:
        link = {(a, b): pick(sim[i, j] for i in groups[a] for j in groups[b])
                for a in range(len(groups)) for b in range(a + 1, len(groups))}
        a, b = max(link, key=link.get)
        groups[a] |= groups.pop(b)
    return {frozenset(g) for g in groups}


def _cross(sim, g1, g2):
    return max(sim[i, j] for i in g1 for j in g2)


@pytest.mark.parametrize("linkage", ["complete", "single"])
def test_bipartition_is_agglomerative_clustering(linkage):
    rng = np.random.default_rng(0)
    n = 8
    split = jax.jit(lambda s, m: bipartition(s, m, linkage))
    for trial in range(12):
        a = rng.normal(size=(n, 3))
        sim = np.corrcoef(a) if trial % 2 else rng.uniform(-1, 1, (n, n))
        sim = (sim + sim.T) / 2
        members = rng.random(n) < 0.7
        members[rng.choice(n, 2, replace=False)] = True
        second = np.asarray(split(jnp.asarray(sim, jnp.float32), jnp.asarray(members)))
        assert not (second & ~members).any()
        got = {frozenset(np.flatnonzero(members & ~second)), frozenset(np.flatnonzero(second))}
        assert got == _groups(sim, members, linkage)
        assert min(np.flatnonzero(members)) not in np.flatnonzero(second)  # the first group keeps the lowest index
        if linkage == "single":  # the paper's optimum: no bipartition has a lower largest cross similarity
            idx = list(np.flatnonzero(members))
            best = min(_cross(sim, [idx[0], *c], [i for i in idx[1:] if i not in c])
                       for r in range(len(idx) - 1) for c in itertools.combinations(idx[1:], r))
            g1, g2 = got
            assert _cross(sim, g1, g2) == best


def _data(n=5, m=6):
    rng = np.random.default_rng(0)
    return fl.FederatedData.from_arrays(rng.normal(size=(n, m, 2, 2)).astype(np.float32),
                                        rng.integers(0, 3, (n, m)).astype(np.int32), counts=np.array([6, 5, 3, 6, 4]))


def test_one_round_against_numpy_without_a_split():
    data = _data()
    alg = fl.cfl(MODEL, fl.CFLConfig(eps1=0.0, eps2=0.0, max_clusters=3, warmup=0, participation=0.8, local=LOCAL), 5)
    s0 = alg.init(jax.random.key(4))
    rng = np.random.default_rng(1)
    params = jax.tree_util.tree_map(lambda p: p + jnp.asarray(0.3 * rng.normal(size=p.shape), p.dtype), s0.params)
    cluster = np.array([0, 1, 0, 1, 1])
    s0 = s0._replace(params=params, cluster=jnp.asarray(cluster, jnp.int32), num_clusters=jnp.asarray(2, jnp.int32))
    s1, info = jax.jit(alg.round)(s0, data.train)
    active = np.asarray(info.active)
    assert active.sum() == 4 and not bool(info.split) and int(s1.num_clusters) == 2
    np.testing.assert_array_equal(np.asarray(s1.cluster), cluster)
    _, _, k_local = jax.random.split(s0.key, 3)
    start = jax.tree_util.tree_map(lambda p: p[cluster], params)
    trained = _leaves(local_train(MODEL, LOCAL, start, None, data.train, k_local).params)
    counts = np.array([6, 5, 3, 6, 4], np.float64)
    sq_mean, sq_max = np.zeros(3), np.zeros((3, 5))
    for p0, st, tr, p1 in zip(_leaves(params), _leaves(start), trained, _leaves(s1.params)):
        delta = (tr - st).reshape(5, -1)
        want = p0.copy()
        for c in (0, 1):
            w = counts * active * (cluster == c)
            mean = (w / w.sum()) @ delta
            want[c] += mean.reshape(p0.shape[1:])
            sq_mean[c] += mean @ mean
            sq_max[c] += np.where(w > 0, (delta ** 2).sum(1), 0)
        np.testing.assert_allclose(p1, want, rtol=1e-5, atol=1e-6)  # slot 2 (unused) unchanged
    np.testing.assert_allclose(np.asarray(info.mean_norm), np.sqrt(sq_mean), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(info.max_norm), np.sqrt(sq_max.max(1)), rtol=1e-4, atol=1e-6)
    kind, models_ = alg.eval_models(s1)  # the unused slot is given cluster 0's model
    assert kind == "server"
    for m, p in zip(_leaves(models_), _leaves(s1.params)):
        np.testing.assert_array_equal(m[:2], p[:2])
        np.testing.assert_array_equal(m[2], p[0])


def test_split_separates_agents_whose_updates_point_in_opposite_directions():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 20, 2)).astype(np.float32)
    x = np.repeat(x, 2, axis=0)  # agents 2i and 2i+1 hold the same inputs, with opposite labelling rules
    y = (x[:, :, 0] > 0).astype(np.int32)
    y[1::2] = 1 - y[1::2]
    x[1::2] *= 1.5  # and larger inputs (no tie of update norms between the two halves)
    data = fl.FederatedData.from_arrays(x, y)
    model = models.logistic_regression(num_features=2, num_classes=2)  # zero start: opposite first gradients
    local = LocalSGDConfig(epochs=1, batch_size=20, lr=0.5, momentum=0.0)
    alg = fl.cfl(model, fl.CFLConfig(eps1=1e3, eps2=0.0, max_clusters=3, warmup=1, local=local), 8)
    round_fn = jax.jit(alg.round)
    s0 = alg.init(jax.random.key(0))
    s1, info = round_fn(s0, data.train)  # round 0 < warmup: no split, one FedAvg step
    assert not bool(info.split) and int(s1.num_clusters) == 1 and not np.asarray(s1.cluster).any()
    assert float(info.mean_norm[0]) < 0.3 * float(info.max_norm[0])
    s1 = s1._replace(params=jax.tree_util.tree_map(lambda p: p.at[1:].set(7.0), s1.params))  # unused: anything
    sim, _ = cosine_similarities(jax.tree_util.tree_map(lambda p: p[:8] * 0, s0.params))
    assert not np.asarray(sim).any()  # zero updates: similarity 0, not NaN
    strict = fl.cfl(model, fl.CFLConfig(eps1=1e3, eps2=1e3, max_clusters=3, warmup=1, local=local), 8)
    assert not bool(jax.jit(strict.round)(s1, data.train)[1].split)  # no update norm above ε2
    s2, info = round_fn(s1, data.train)
    assert bool(info.split) and int(s2.num_clusters) == 2
    np.testing.assert_array_equal(np.asarray(s2.cluster), [0, 1] * 4)
    _, _, k_local = jax.random.split(s1.key, 3)
    start = jax.tree_util.tree_map(lambda p: jnp.broadcast_to(p[0], (8,) + p.shape[1:]), s1.params)
    trained = _leaves(local_train(model, local, start, None, data.train, k_local).params)
    for p1, tr, p2 in zip(_leaves(s1.params), trained, _leaves(s2.params)):
        for c in (0, 1):  # each half: the old model plus its own agents' mean update
            np.testing.assert_allclose(p2[c], p1[0] + (tr[c::2] - p1[0]).mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(p2[2], p1[2])
    s3, info = round_fn(s2._replace(num_clusters=jnp.asarray(3, jnp.int32)), data.train)
    assert not bool(info.split)  # max_clusters reached
    wrong = jax.tree_util.tree_map(lambda p: p.at[1].set(p[0]), s2.params)  # odd agents start from the even ones' model
    s3, info = round_fn(s2._replace(params=wrong), data.train)  # both qualify: the one with the largest update splits
    assert int(np.argmax(np.asarray(info.max_norm))) == 1
    assert bool(info.split) and int(s3.num_clusters) == 3
    assert set(np.flatnonzero(np.asarray(s3.cluster) == 2)) < {3, 5, 7}
    # the agent with the largest update alone in cluster 1 (a copy of cluster 0's model): one member never splits
    j = int(np.argmax(sum(((tr - p1[0]) ** 2).reshape(8, -1).sum(1) for p1, tr in zip(_leaves(s1.params), trained))))
    lone = s1._replace(cluster=s1.cluster.at[j].set(1), num_clusters=jnp.asarray(2, jnp.int32),
                       params=jax.tree_util.tree_map(lambda p: p.at[1].set(p[0]), s1.params))
    s3, info = round_fn(lone, data.train)
    assert int(np.argmax(np.asarray(info.max_norm))) == 1 and bool(info.split)
    assert np.flatnonzero(np.asarray(s3.cluster) == 1).tolist() == [j] and (np.asarray(s3.cluster) == 2).any()


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_runs_in_the_engine():
    data = _data()
    res = fl.run(fl.cfl(MODEL, fl.CFLConfig(warmup=0, local=LocalSGDConfig(epochs=1, batch_size=4)), 5), data, 2,
                 jax.random.key(0), progress=False)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(res.state.params))


def test_bad_config_is_named():
    for kw, match in [({"max_clusters": 0}, "max_clusters"), ({"linkage": "average"}, "linkage"),
                      ({"warmup": -1}, "warmup"), ({"eps1": -1.0}, "eps1")]:
        with pytest.raises(ValueError, match=match):
            fl.CFLConfig(**kw)
