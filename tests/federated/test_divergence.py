"""One agent's NaN or infinity never spreads, and never goes unreported.

Every algorithm leaves a model that holds a NaN or an infinity (a diverged agent: its data,
its training, its dual) out of every average, reports it in its info (``diverged``), and the
runner counts it in every row (``diverged_agents``), warns naming the round and the agents, or
stops the run (``on_diverged="stop"``) with the rows so far written. FedPD and FedSGLD spread
one node's NaN to every node and the server before (issue 57); FedAvg, IFCA, DFedAvgM, Local,
FedCBO and FedCB²O excluded it silently.
"""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
DivergedError = fl.DivergedError
from cbo_jax.writer import read_jsonl

N, SAMPLES, DIM, CLASSES = 6, 12, 5, 3
LOCAL = fl.LocalSGDConfig(epochs=1, batch_size=4, lr=0.5, momentum=0.0)


def _arrays(seed=0, poisoned=(0,)):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, SAMPLES, DIM)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(N, SAMPLES))
    for j in poisoned:
        x[j] = 1e30  # finite, so the input checks pass; its training overflows to NaN
    return x, y


def _data(**kw):
    x, y = _arrays(**kw)
    rng = np.random.default_rng(1)
    tx = rng.normal(size=(N, 8, DIM)).astype(np.float32)
    ty = rng.integers(0, CLASSES, size=(N, 8))
    return fl.FederatedData.from_arrays(x, y, cluster=np.arange(N) % 2, test_x=tx, test_y=ty)


MODEL = models.logistic_regression(DIM, CLASSES)

ALGORITHMS = {
    "fedpd": lambda: fl.fedpd(MODEL, fl.FedPDConfig(local_steps=4, lr=1.0, sampling_rate=1.0), N),
    "fedsgld": lambda: fl.fedsgld(MODEL, fl.FedSGLDConfig(oracle=fl.SGLDConfig(steps=4, burn_in=2, lr=1.0, clip_norm=None,
                                                                                sampling_rate=1.0)), N),
    "fedavg": lambda: fl.fedavg(MODEL, fl.FedAvgConfig(local=LOCAL), N),
    "ifca": lambda: fl.ifca(MODEL, fl.IFCAConfig(k=2, local=LOCAL), N),
    "local": lambda: fl.local_only(MODEL, fl.LocalConfig(local=LOCAL), N),
    "fedcbo": lambda: fl.fedcbo(MODEL, fl.FedCBOConfig(M=3, local=LOCAL), N),
}


def _attack_data():
    x, y = _arrays()
    return fl.AttackData.from_lists(list(x), list(y), list(x[:, :6] * 0 + 0.1), list(y[:, :6]))


ATTACK = {
    "fedcb2o": lambda: fl.fedcb2o(MODEL, fl.FedCB2OConfig(M=3, local=LOCAL), np.arange(N) % 2, np.zeros(N, bool)),
    "dfedavgm": lambda: fl.dfedavgm(MODEL, fl.DFedAvgMConfig(M=2, local=LOCAL), np.arange(N) % 2),
}


def _finite_rows(tree, rows):
    leaves = [np.asarray(a)[rows] for a in jax.tree_util.tree_leaves(tree)]
    return all(np.isfinite(a).all() for a in leaves)


@pytest.mark.parametrize("name", ["fedpd", "fedsgld"])
def test_a_diverged_node_never_reaches_the_server(name):
    """The issue's case (agent 0's inputs 1e19 there, 1e30 here): before, all 6 nodes and the
    server were NaN."""
    alg = ALGORITHMS[name]()
    data = _data()
    with pytest.warns(RuntimeWarning, match=rf"{name}, round \d+: agent 0 holds a NaN or an infinity"):
        res = fl.run(alg, data, 3, jax.random.key(0), metrics=[fl.metrics.test_accuracy(MODEL, data)],
                     progress=False)
    assert _finite_rows(res.state.server, slice(None))
    for field in ("x", "lam", "x0"):
        assert _finite_rows(getattr(res.state, field), slice(1, None)), field
    assert np.isfinite(res.summary["final_test_acc"])
    assert all(r["diverged_agents"] == 1 for r in res.history[1:]), res.history
    assert res.summary["diverged"] == [0]


@pytest.mark.parametrize("name", ["fedpd", "fedsgld"])
@pytest.mark.parametrize("field", ["x", "lam", "data"])
def test_one_nodes_nan_state_or_data_stays_its_own(name, field):
    """A NaN in one node's iterate, dual or data: its message is left out, the server and the
    others stay finite, and the info marks it."""
    alg = ALGORITHMS[name]()
    x, y = _arrays(poisoned=())
    if field == "data":
        x[2, 3, 1] = np.nan  # past the host checks: the round function itself takes it
    data = fl.AgentData(jnp.asarray(x), jnp.asarray(y), jnp.full((N,), SAMPLES, jnp.int32))
    state = alg.init(jax.random.key(0))
    if field in ("x", "lam"):
        leaf = lambda a: a.at[2].set(jnp.nan)  # noqa: E731
        state = state._replace(**{field: jax.tree_util.tree_map(leaf, getattr(state, field))})
        if field == "x":  # the iterate is where a warm-started chain continues
            alg = fl.fedpd(MODEL, fl.FedPDConfig(local_steps=4, lr=0.1, sampling_rate=1.0, warm_start=True), N) \
                if name == "fedpd" else fl.fedsgld(MODEL, fl.FedSGLDConfig(warm_start=True), N)
    new, info = jax.jit(alg.round)(state, data)
    assert np.asarray(info.diverged).tolist() == [j == 2 for j in range(N)]
    assert _finite_rows(new.server, slice(None))
    assert _finite_rows(new.x0, slice(None))  # the broadcast reaches node 2 too
    others = [j for j in range(N) if j != 2]
    assert _finite_rows(new.lam, others) and _finite_rows(new.x, others)


def test_when_every_node_diverged_the_server_keeps_its_model():
    alg = ALGORITHMS["fedpd"]()
    x, y = _arrays(poisoned=())
    data = fl.AgentData(jnp.asarray(x), jnp.asarray(y), jnp.full((N,), SAMPLES, jnp.int32))
    state = alg.init(jax.random.key(0))
    state = state._replace(lam=jax.tree_util.tree_map(lambda a: a.at[:].set(jnp.nan), state.lam))
    new, info = jax.jit(alg.round)(state, data)
    assert np.asarray(info.diverged).all()
    for a, b in zip(jax.tree_util.tree_leaves(new.server), jax.tree_util.tree_leaves(state.server)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", list(ALGORITHMS) + list(ATTACK))
def test_every_algorithm_counts_and_names_a_diverged_agent(name):
    """Every algorithm reports agent 0 (inputs 1e19) as diverged, in the rows and a warning, and
    the other agents' models (or the server models) stay finite."""
    if name in ATTACK:
        alg, data, metrics = ATTACK[name](), _attack_data(), []
    else:
        alg, data = ALGORITHMS[name](), _data()
        metrics = [fl.metrics.test_accuracy(MODEL, data)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fl.run(alg, data, 3, jax.random.key(0), metrics=metrics, progress=False)
    named = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "agent 0 holds" in
             str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]  # once, the first time agent 0 diverges
    assert max(r["diverged_agents"] for r in res.history) == 1, res.history
    assert res.summary["diverged"] == [0]
    kind, params = alg.eval_models(res.state)
    rows = slice(None) if kind == "server" else slice(1, None)
    assert _finite_rows(params, rows), name
    if kind == "server":  # (a diverged agent's own model scores a NaN accuracy, as documented)
        assert np.isfinite(res.summary["final_test_acc"])


def test_a_healthy_run_counts_no_diverged_agent():
    data = _data(poisoned=())
    res = fl.run(ALGORITHMS["fedavg"](), data, 2, jax.random.key(0), progress=False)
    assert [r["diverged_agents"] for r in res.history] == [0, 0]
    assert "diverged" not in res.summary


def test_stop_names_the_round_and_agent_and_keeps_the_rows(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(DivergedError, match=r"fedavg, round 1: agent 0 holds a NaN.*rows up to round 1 are written"):
        fl.run(ALGORITHMS["fedavg"](), _data(), 5, jax.random.key(0), out=out, on_diverged="stop", progress=False)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1] and rows[0]["diverged_agents"] == 1
    assert not (out / "summary.json").exists()  # the run did not finish
    json.loads((out / "config.json").read_text())


def test_on_diverged_is_checked():
    with pytest.raises(ValueError, match="on_diverged must be one of"):
        fl.run(ALGORITHMS["fedavg"](), _data(), 1, jax.random.key(0), on_diverged="ignore", progress=False)


def test_a_runner_metric_may_not_take_the_diverged_count_name():
    with pytest.raises(ValueError, match="diverged_agents.*the runner writes into every row"):
        fl.run(ALGORITHMS["fedavg"](), _data(poisoned=()), 1, jax.random.key(0), progress=False,
               round_metrics=[lambda info: {"diverged_agents": jnp.zeros(())}])


def test_an_algorithm_of_ones_own_without_diverged_is_checked_by_its_models():
    """An info without ``diverged``: the runner reads the per-agent models themselves."""
    base = ALGORITHMS["local"]()

    def round_fn(state, data):
        state, info = base.round(state, data)
        return state, {"train_loss": info.train_loss}

    alg = base._replace(name="mine", round=round_fn)
    with pytest.warns(RuntimeWarning, match="mine, round 1: agent 0 holds"):
        res = fl.run(alg, _data(), 2, jax.random.key(0), progress=False)
    assert [r["diverged_agents"] for r in res.history] == [1, 1]


def test_an_ifca_cluster_whose_members_all_diverged_keeps_its_server_model():
    """Cluster 1's only members (agents 2 and 3) diverge: its server model stays as it was, and
    cluster 0's is averaged from its finite members."""
    alg = fl.ifca(MODEL, fl.IFCAConfig(k=2, local=fl.LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.0)),
                  4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, SAMPLES, DIM)).astype(np.float32)
    x[:, :, 0] = 0.0
    x[2:, :, 0] = 1e30  # agents 2 and 3: feature 0 huge, which server model 1 ignores
    y = rng.integers(0, CLASSES, size=(4, SAMPLES))
    data = fl.AgentData(jnp.asarray(x), jnp.asarray(y), jnp.full((4,), SAMPLES, jnp.int32))
    state = alg.init(jax.random.key(0))
    kernel = state.params["params"]["Dense_0"]["kernel"]  # (k, DIM, CLASSES)
    kernel = kernel.at[1, 0].set(0.0).at[0, 0].set(jnp.asarray([1.0, 0.0, 0.0]))  # model 1 ignores feature 0:
    # agents 2 and 3 pick it (model 0's logits differ by 1e30 on them)
    state = state._replace(params={"params": {"Dense_0": {**state.params["params"]["Dense_0"], "kernel": kernel}}})
    new, info = jax.jit(alg.round)(state, data)
    assert np.asarray(info.assignment)[2:].tolist() == [1, 1]
    assert np.asarray(info.diverged).tolist() == [False, False, True, True]
    for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a)[1], np.asarray(b)[1])  # kept
        assert np.isfinite(np.asarray(a)).all()
