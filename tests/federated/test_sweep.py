"""Federated hyperparameter sweeps (``fl.run(..., params=grid)``): one vmapped program whose every
point equals a separate run of its config, results carrying the grid's axes, bad grids refused."""

import dataclasses
import json
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _federated_variants as fv
import cbo_jax.federated as fl
from cbo_jax.federated import sweep

LOC = fl.LocalSGDConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)


def _fedcbo(**kw):
    return fl.fedcbo(fv.MODEL, fl.FedCBOConfig(M=3, local=LOC, **kw), 13)


def _separate(cfg, rounds, seed=0):
    return fl.run(fl.fedcbo(fv.MODEL, cfg, 13), fv.clustered_data(), rounds, jax.random.key(seed), progress=False,
                  round_metrics=[fl.metrics.round_stats])


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_each_point_of_a_sweep_is_the_separate_run_of_its_config():
    """α × momentum (a momentum of 0 builds plain SGD in a separate run; the sweep's traced
    momentum of 0 adds nothing), 2 rounds: every point's final models and round metrics equal
    its own run's within float32 rounding."""
    alg = _fedcbo()
    grid = {"alpha": [1.0, 30.0], "local.momentum": [0.0, 0.9]}
    res = fl.run(alg, fv.clustered_data(), 2, jax.random.key(0), params=grid, round_metrics=[fl.metrics.round_stats],
                 progress=False)
    assert res.summary["sweep"] == {"names": ["alpha", "local.momentum"], "values": [[1.0, 30.0], [0.0, 0.9]],
                                    "shape": [2, 2]}
    assert jax.tree_util.tree_leaves(res.state.params)[0].shape[:3] == (2, 2, 13)
    for i, a in enumerate(grid["alpha"]):
        for j, m in enumerate(grid["local.momentum"]):
            one = _separate(dataclasses.replace(alg.config, alpha=a, local=dataclasses.replace(LOC, momentum=m)), 2)
            point = jax.tree_util.tree_map(lambda leaf: leaf[i, j], res.state)
            assert _max_diff(point.params, one.state.params) <= 1e-5
            np.testing.assert_allclose(point.P, one.state.P, atol=1e-5)  # eq. (21): the same downloads and losses
            for r in range(2):
                assert res.history[r]["train_loss"][i][j] == pytest.approx(one.history[r]["train_loss"], abs=1e-5)
    # different points are different runs
    assert _max_diff(jax.tree_util.tree_map(lambda x: x[0, 0], res.state.params),
                     jax.tree_util.tree_map(lambda x: x[1, 0], res.state.params)) > 1e-3


@pytest.mark.slow
def test_a_sweep_of_the_step_the_noise_and_epsilon_writes_one_results_directory(tmp_path):
    """λ1 (the step λ1 γ), σ1 (0 included: a separate run then adds no noise), ε0: the rows and
    the summary hold the grid's nested lists, config.json records the grid, sweep.png compares."""
    data = fv.clustered_data()
    alg = _fedcbo(noise="isotropic", sigma1=0.01)
    grid = {"lambda1": [2.0, 9.8], "sigma1": [0.0, 0.05], "eps0": [0.2, 0.6]}
    res = fl.run(alg, data, 3, jax.random.key(1), params=grid, every=2, out=tmp_path / "s", progress=True,
                 round_metrics=[fl.metrics.round_stats], metrics=[fl.metrics.test_accuracy(fv.MODEL, data)])
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert "test_acc" not in rows[0] and np.asarray(rows[1]["test_acc"]).shape == (2, 2, 2)
    assert np.asarray(rows[0]["eps"]).shape == (2, 2, 2)
    assert np.asarray(rows[0]["eps"])[:, :, 0].ravel().tolist() == pytest.approx([0.2] * 4)
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["points"] == 8 and summary["final_test_acc"] == rows[-1]["test_acc"]
    assert json.loads((tmp_path / "s" / "config.json").read_text())["sweep"]["shape"] == [2, 2, 2]
    assert (tmp_path / "s" / "sweep.png").stat().st_size > 0
    for idx in [(0, 0, 1), (1, 1, 0)]:
        cfg = dataclasses.replace(alg.config, lambda1=grid["lambda1"][idx[0]], sigma1=grid["sigma1"][idx[1]],
                                  eps0=grid["eps0"][idx[2]])
        one = _separate(cfg, 3, seed=1)
        assert _max_diff(jax.tree_util.tree_map(lambda x: x[idx], res.state.params), one.state.params) <= 1e-5
    assert res.history[-1]["test_acc"] == rows[-1]["test_acc"]


@pytest.mark.slow
def test_a_sweep_of_fedavg_and_ifca_learning_rates():
    data = fv.clustered_data()
    for alg in (fl.fedavg(fv.MODEL, fl.FedAvgConfig(local=LOC), 13), fl.ifca(fv.MODEL, fl.IFCAConfig(k=2, local=LOC), 13)):
        res = fl.run(alg, data, 2, jax.random.key(2), params={"local.lr": [0.05, 0.2]}, progress=False)
        for i, lr in enumerate([0.05, 0.2]):
            one = fl.run(alg.build(dataclasses.replace(alg.config, local=dataclasses.replace(LOC, lr=lr))), data, 2,
                         jax.random.key(2), progress=False)
            assert _max_diff(jax.tree_util.tree_map(lambda x: x[i], res.state.params), one.state.params) <= 1e-5


def test_bad_grids_are_refused_naming_the_field_or_the_point(tmp_path):
    alg, data, key = _fedcbo(), fv.clustered_data(), jax.random.key(0)
    with pytest.raises(ValueError, match=r"no float field 'M'.*alpha.*local\.lr"):
        fl.run(alg, data, 1, key, params={"M": [2, 3]}, progress=False)
    with pytest.raises(ValueError, match="no float field 'selection'"):
        fl.run(alg, data, 1, key, params={"selection": ["uniform"]}, progress=False)
    with pytest.raises(ValueError, match="non-empty list"):
        fl.run(alg, data, 1, key, params={"alpha": []}, progress=False)
    with pytest.raises(ValueError, match="repeats a value"):
        fl.run(alg, data, 1, key, params={"alpha": [1.0, 1.0]}, progress=False)
    with pytest.raises(ValueError, match=r"grid point \(1, 0\) \(eps0=0.05, eps_min=0.1\): eps_min=0.1 is above"):
        fl.run(alg, data, 1, key, params={"eps0": [0.5, 0.05], "eps_min": [0.1]}, progress=False)
    with pytest.raises(ValueError, match=r"\(local\.lr=0\): lr must be > 0"):
        fl.run(alg, data, 1, key, params={"local.lr": [0.1, 0.0]}, progress=False)
    with pytest.raises(ValueError, match="without checkpoints.*checkpoint_every"):
        fl.run(alg, data, 1, key, params={"alpha": [1.0]}, out=tmp_path, checkpoint_every=1, progress=False)
    assert not list(tmp_path.iterdir())  # refused before anything is written
    with pytest.raises(ValueError, match="fedcbo cannot be rebuilt"):  # an Algorithm of one's own without `build`
        fl.run(alg._replace(build=None), data, 1, key, params={"alpha": [1.0]}, progress=False)


def test_a_field_that_chooses_the_program_is_refused_naming_it():
    """participation < 1 draws G_n on the host's say-so: it cannot be a traced number."""
    with pytest.raises(sweep.NotSweepableError, match="participation"):
        fl.run(_fedcbo(), fv.clustered_data(), 1, jax.random.key(0), params={"participation": [0.5, 1.0]},
               progress=False)


def test_a_diverged_point_is_named_and_the_others_go_on():
    data = fl.AgentData(jnp.asarray(1e3 * np.random.default_rng(0).normal(size=(4, 8, 2)), jnp.float32),
                        jnp.zeros((4, 8), jnp.int32), jnp.full((4,), 8, jnp.int32))
    alg = fl.local_only(fl.from_flax(nn.Dense(3), np.zeros((1, 2), np.float32)),
                        fl.LocalConfig(local=fl.LocalSGDConfig(epochs=1, batch_size=4, momentum=0.0)), 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fl.run(alg, data, 1, jax.random.key(0), params={"local.lr": [0.1, 1e38]}, progress=False)
    assert res.history[-1]["diverged_agents"] == [0, 4]
    assert res.summary["diverged_points"] == [1]
    assert [str(w.message) for w in caught if "grid point local.lr=1e+38" in str(w.message)]
    with pytest.raises(fl.DivergedError, match="local.lr=1e\\+38"):
        fl.run(alg, data, 1, jax.random.key(0), params={"local.lr": [0.1, 1e38]}, progress=False, on_diverged="stop")


def test_grid_order_labels_and_the_sweepable_fields():
    g = sweep.grid(_fedcbo(), {"alpha": [1, 10], "local.lr": [0.1, 0.2, 0.3]})
    assert g.shape == (2, 3) and g.size == 6
    assert g.points()[1] == {"alpha": 1.0, "local.lr": 0.2} and g.label(3) == "alpha=10, local.lr=0.1"
    assert g.configs[5].alpha == 10 and g.configs[5].local.lr == 0.3
    assert [np.asarray(a).tolist() for a in g.arrays()] == [[1, 1, 1, 10, 10, 10], pytest.approx([0.1, 0.2, 0.3] * 2)]
    fields = sweep.sweepable_fields(fl.FedCBOConfig())
    assert {"alpha", "lambda1", "gamma", "eps0", "sigma1", "noise_gamma", "local.lr", "local.momentum"} <= set(fields)
    assert not {"M", "selection", "eval_chunk", "local.epochs"} & set(fields)
    assert sweep.nested([1, 2, 3, 4, 5, 6], (2, 3)) == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.slow
def test_a_sweep_of_fedcb2o_under_attack():
    """FedCB²O (an AttackData round, ProbSampling's κ and the criterion's α swept): each point is
    its own run."""
    ds = fv.attack_dataset()
    cfg = fl.FedCB2OConfig(M=5, T_G=1, alpha=2.0, gamma=0.1, local=fv.ALOC)
    alg = fl.fedcb2o(fv.TINY4, cfg, ds.cluster, ds.malicious)
    grid = {"alpha": [2.0, 20.0], "kappa": [0.5, 2.0]}
    res = fl.run(alg, ds.attack_data(), 2, jax.random.key(3), params=grid, progress=False)
    for idx in [(0, 1), (1, 0)]:
        one = fl.run(fl.fedcb2o(fv.TINY4, dataclasses.replace(cfg, alpha=grid["alpha"][idx[0]],
                                                               kappa=grid["kappa"][idx[1]]), ds.cluster, ds.malicious),
                     ds.attack_data(), 2, jax.random.key(3), progress=False)
        assert _max_diff(jax.tree_util.tree_map(lambda x: x[idx], res.state.params), one.state.params) <= 1e-5


@pytest.mark.slow
def test_a_sweep_of_fedsgld_and_fedpd():
    """FedSGLD's γ and its oracle's step and noise (ε = 0 included: a separate run then draws no
    noise), FedPD's γ and step: each point is its own run."""
    data = fv.synthetic_data()
    cfg = fl.FedSGLDConfig(oracle=fv.ORACLE, gamma=2.0, server_momentum=0.3, warm_start=True)
    alg = fl.fedsgld(fv.LR_MODEL, cfg, 13)
    grid = {"gamma": [1.0, 2.0], "oracle.lr": [0.02, 0.05], "oracle.noise": [0.0, 0.3]}
    res = fl.run(alg, data, 2, jax.random.key(4), params=grid, progress=False)
    for idx in [(0, 1, 0), (1, 0, 1)]:
        point = dataclasses.replace(cfg, gamma=grid["gamma"][idx[0]], oracle=dataclasses.replace(
            cfg.oracle, lr=grid["oracle.lr"][idx[1]], noise=grid["oracle.noise"][idx[2]]))
        one = fl.run(fl.fedsgld(fv.LR_MODEL, point, 13), data, 2, jax.random.key(4), progress=False)
        assert _max_diff(jax.tree_util.tree_map(lambda x: x[idx], res.state.server), one.state.server) <= 1e-5
    pd_cfg = fl.FedPDConfig(local_steps=5, lr=0.05, gamma=2.0, sampling_rate=0.5)
    pd = fl.fedpd(fv.LR_MODEL, pd_cfg, 13)
    res = fl.run(pd, data, 2, jax.random.key(5), params={"gamma": [1.0, 3.0], "lr": [0.05]}, progress=False)
    one = fl.run(fl.fedpd(fv.LR_MODEL, dataclasses.replace(pd_cfg, gamma=3.0), 13), data, 2, jax.random.key(5),
                 progress=False)
    assert _max_diff(jax.tree_util.tree_map(lambda x: x[1, 0], res.state.server), one.state.server) <= 1e-5
    with pytest.raises(sweep.NotSweepableError, match="sampling_rate"):  # q >= 1 chooses the full batch
        fl.run(pd, data, 1, jax.random.key(5), params={"sampling_rate": [0.5, 1.0]}, progress=False)
