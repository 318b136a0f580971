"""Federated algorithms: FedCBO aggregation vs NumPy float64, limits, IFCA, determinism."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.federated import metrics, selection
from cbo_jax.federated.algorithms import (AgentData, FedAvgConfig, FedCBOConfig, IFCAConfig, LocalConfig, fedavg,
                                          fedcbo, ifca, local_only)
from cbo_jax.federated.algorithms.fedcbo import aggregate
from cbo_jax.federated.data import FederatedData
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax import checkpoint
from cbo_jax.federated.run import run_federated

TINY = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))


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
    params = models.init_population(TINY, jax.random.key(0), n)
    idx = selection.uniform(jax.random.key(1), n, m)
    cfg = FedCBOConfig(M=m, alpha=alpha, lambda1=1.0, gamma=step, loss_reduction=reduction, eval_chunk=4,
                       local=LocalSGDConfig(batch_size=2))
    loss, own, mcons = aggregate(TINY, cfg, params, idx, data)
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)["params"]
    x, y, c = (np.asarray(a) for a in data)
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


def test_large_alpha_full_download_picks_best_loss_model():
    n = 5
    data = _tiny_data(n)
    params = models.init_population(TINY, jax.random.key(3), n)
    cfg = FedCBOConfig(M=n - 1, alpha=1e12)
    idx = selection.uniform(jax.random.key(4), n, n - 1)
    loss, _, mcons = aggregate(TINY, cfg, params, idx, data)
    best = np.asarray(idx)[np.arange(n), np.asarray(loss).argmin(1)]
    k = params["params"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(np.asarray(mcons["params"]["Dense_0"]["kernel"]), np.asarray(k)[best])


def test_nan_model_never_poisons_a_consensus():
    n = 5
    data = _tiny_data(n)
    params = models.init_population(TINY, jax.random.key(5), n)
    params = jax.tree_util.tree_map(lambda a: a.at[2].set(jnp.nan), params)
    idx = jnp.asarray([[j for j in range(n) if j != i] for i in range(n)])
    loss, _, mcons = aggregate(TINY, FedCBOConfig(M=n - 1, alpha=1.0), params, idx, data)
    for j in range(n):
        if j == 2:
            continue
        for leaf in jax.tree_util.tree_leaves(mcons):
            assert np.all(np.isfinite(np.asarray(leaf[j])))


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


def test_ifca_recovers_true_clusters_and_fedcbo_selects_own_cluster():
    data = _two_cluster_data()
    model = models.mlp_mnist(hidden=(8,), num_classes=2, input_shape=(2, 1))
    loc = LocalSGDConfig(epochs=2, batch_size=10, lr=0.1, momentum=0.5)
    res = run_federated(ifca(model, IFCAConfig(k=2, local=loc), 12), model, data, 10, jax.random.key(0),
                        eval_every=5, progress=False)
    assert res.summary["final_cluster_purity"] == 1.0
    assert res.summary["final_test_acc"] > 90
    cfg = FedCBOConfig(M=4, alpha=10.0, eps0=0.3, eps_decay=0.05, eps_min=0.0, local=loc)
    res = run_federated(fedcbo(model, cfg, 12), model, data, 12, jax.random.key(1), eval_every=6, progress=False)
    assert res.summary["final_sr"] > 0.9 and res.summary["final_test_acc"] > 90
    freq = np.asarray(res.history[-1]["selection_frequency"])
    assert freq[0, 0] > 0.9 and freq[1, 1] > 0.9


@pytest.mark.parametrize("build", ["fedcbo", "fedavg", "ifca", "local"])
def test_same_seed_same_result_and_partial_participation(build, tmp_path):
    data = _two_cluster_data(n_per=4, n=12)
    model = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2, 1))
    loc = LocalSGDConfig(epochs=1, batch_size=6)
    algs = {
        "fedcbo": lambda: fedcbo(model, FedCBOConfig(M=3, participation=0.5, local=loc, noise="anisotropic", sigma1=0.01), 8),
        "fedavg": lambda: fedavg(model, FedAvgConfig(participation=0.5, local=loc), 8),
        "ifca": lambda: ifca(model, IFCAConfig(k=2, participation=0.5, local=loc), 8),
        "local": lambda: local_only(model, LocalConfig(participation=0.5, local=loc), 8),
    }
    alg = algs[build]()  # built once: the second run reuses the compiled rounds
    a = run_federated(alg, model, data, 3, jax.random.key(7), progress=False, out_dir=tmp_path, checkpoint_every=3)
    b = run_federated(alg, model, data, 3, jax.random.key(7), progress=False)
    for la, lb in zip(jax.tree_util.tree_leaves(a.state.params), jax.tree_util.tree_leaves(b.state.params)):
        np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
    assert [h["participants"] for h in a.history] == [4, 4, 4]
    lines = (tmp_path / "metrics.jsonl").read_text().strip().splitlines()
    assert len(lines) == 3
    state, meta = checkpoint.restore(tmp_path / "checkpoint", alg.init(jax.random.key(0)))
    assert meta["step"] == 3
    np.testing.assert_array_equal(np.asarray(jax.tree_util.tree_leaves(state.params)[0]),
                                  np.asarray(jax.tree_util.tree_leaves(a.state.params)[0]))


def test_selection_metrics():
    cluster = jnp.asarray([0, 0, 0, 1, 1, 1])
    idx = jnp.asarray([[1, 3], [0, 2], [1, 0], [4, 5], [3, 0], [3, 4]])
    assert float(metrics.selection_rate(idx, cluster)) == pytest.approx(10 / 12)
    assert float(metrics.oracle_selection_rate(0.5, cluster)) == pytest.approx(0.5 + 0.5 * 2 / 5)
    f = np.asarray(metrics.selection_frequency(idx, cluster, 2))
    np.testing.assert_allclose(f, [[5 / 6, 1 / 6], [1 / 6, 5 / 6]])


def test_fedcbo_bad_input():
    with pytest.raises(ValueError, match="M="):
        fedcbo(TINY, FedCBOConfig(M=6), 6)
    with pytest.raises(ValueError, match="participation"):
        FedCBOConfig(participation=1.5)
    with pytest.raises(ValueError, match="noise"):
        FedCBOConfig(noise="pink")


@pytest.mark.parametrize("build", ["fedcbo", "ifca"])
def test_checkpoint_resume_equals_uninterrupted_run(build, tmp_path):
    """Stopped after round 2 (of 5), resumed: the same final state and metrics."""
    data = _two_cluster_data(n_per=4, n=12)
    model = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2, 1))
    loc = LocalSGDConfig(epochs=1, batch_size=6)
    alg = (fedcbo(model, FedCBOConfig(M=3, local=loc, noise="isotropic", sigma1=0.01), 8) if build == "fedcbo"
           else ifca(model, IFCAConfig(k=2, local=loc), 8))
    kw = dict(progress=False, eval_every=2, checkpoint_every=1)
    full = run_federated(alg, model, data, 5, jax.random.key(3), out_dir=tmp_path / "full", **kw)
    part = tmp_path / "part"
    run_federated(alg, model, data, 2, jax.random.key(3), out_dir=part, **kw)  # "stopped" after round 2
    resumed = run_federated(alg, model, data, 5, jax.random.key(3), out_dir=part, resume=True, **kw)
    for a, b in zip(jax.tree_util.tree_leaves(full.state), jax.tree_util.tree_leaves(resumed.state)):
        a = jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a
        b = jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key) else b
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert strip(full.history) == strip(resumed.history)
    lines = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert strip(lines(tmp_path / "full")) == strip(lines(part))
    with pytest.raises(ValueError, match="out_dir"):
        run_federated(alg, model, data, 5, jax.random.key(3), resume=True, progress=False)


def test_eval_chunk_for_memory_budget():
    from cbo_jax.federated.algorithms.fedcbo import eval_chunk_for_budget, planned_round_bytes

    data = AgentData.from_federated(_two_cluster_data(n_per=4, n=12))
    model = models.mlp_mnist(hidden=(64,), num_classes=2, input_shape=(2, 1))
    cfg = FedCBOConfig(M=6, local=LocalSGDConfig(epochs=1, batch_size=6))
    sizes = {c: planned_round_bytes(fedcbo(model, dataclasses.replace(cfg, eval_chunk=c), 8), data) for c in (4, 1)}
    assert sizes[4] > sizes[1]  # bigger chunks plan more memory
    chunk, plan = eval_chunk_for_budget(model, cfg, data, sizes[1], candidates=(4, 1))
    assert chunk == 1 and plan == sizes  # the largest chunk that fits
    with pytest.raises(ValueError, match="even with eval_chunk=1"):
        eval_chunk_for_budget(model, cfg, data, 1024, candidates=(1,))
