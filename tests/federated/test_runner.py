"""The federated engine: one contract for every algorithm, the runner, users' own models and data.

* the registry test runs every algorithm through the same checks: finite rounds, padded
  equals unpadded, same seed same result, resume equals uninterrupted;
* the regression test compares every pinned run (tests/pinned/federated.npz, whose README
  records how it was made) with the same run through today's API, exactly on the host kind
  each pin was recorded on;
* the import rule: no algorithm knows about padding, sharding or devices;
* a Flax model and a dataset of one's own, built from public names only; bad input.
"""

import ast
import json
import struct
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _federated_variants as fv
import cbo_jax.federated as fl
from cbo_jax.federated import padding
from cbo_jax.writer import read_jsonl

REGISTRY = ("fedcbo_egreedy_iso", "fedavg", "ifca", "local", "fedpd", "fedsgld", "fedcb2o_G", "oracle_max",
            "fedprox", "fedadam", "fedyogi", "ditto", "dfedavg_median", "dfedavg_trimmed_mean", "dfedavg_krum",
            "scaffold", "cfl")


def _float_leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)
            if not jnp.issubdtype(x.dtype, jax.dtypes.prng_key) and jnp.issubdtype(x.dtype, jnp.floating)]


def _poison(tree, n):
    return jax.tree_util.tree_map(lambda a: a.at[n:].set(3.0) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _poison_data(padded, original):
    """Padding agents with data: garbage inputs, label 1, full counts (but still not valid)."""
    if isinstance(padded, fl.AgentData):
        n = original.num_agents
        return padded._replace(x=padded.x.at[n:].set(jnp.asarray(5, padded.x.dtype)), y=padded.y.at[n:].set(1),
                               counts=padded.counts.at[n:].set(padded.x.shape[1]))
    last = "malicious" if original.malicious.num_agents else "benign"
    return padded._replace(**{last: _poison_data(getattr(padded, last), getattr(original, last))})


# Fifteen of them (FedCB²O and DFedAvgM with attackers, the longest; FedPD, FedSGLD, Local, FedAvg
# and IFCA, whose engine paths FedCBO's covers; FedProx, FedYogi and Ditto, whose paths FedAdam's
# and FedAvg's cover but for the proximal term and the personal models; the robust rules, beside
# DFedAvgM's; SCAFFOLD and CFL, v6) run in CI's slow step, for the default run's time budget.
_SLOW_CONTRACT = ("fedcb2o_G", "oracle_max", "fedpd", "fedsgld", "local", "fedavg", "ifca", "fedprox", "fedyogi",
                  "ditto", "dfedavg_median", "dfedavg_trimmed_mean", "dfedavg_krum", "scaffold", "cfl")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_CONTRACT else n
                                  for n in REGISTRY])
def test_registry_contract(name, tmp_path):
    alg, data, round_metrics, metrics, seed = fv.built(name)
    train = data.train if hasattr(data, "test_index") else data
    key = jax.random.key(seed)

    # init -> round -> finite state; padded (poisoned padding agents) equals unpadded
    n = train.num_agents
    lay = padding.Layout(n, n + 3)
    step = jax.jit(alg.round)
    state = jax.jit(alg.init)(key)
    padded = lay.pad_state(state)
    padded = padded._replace(**{f: _poison(getattr(padded, f), n) for f in getattr(type(padded), "agent_fields", ())})
    pdata = _poison_data(lay.pad_data(train), train)
    for _ in range(2):
        state, info = step(state, train)
        padded, pinfo = step(padded, pdata)
        for a, b in zip(jax.tree_util.tree_leaves(info), jax.tree_util.tree_leaves(lay.trim_info(pinfo))):
            np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(x).all() for x in _float_leaves(alg.eval_models(state)[1]))  # the models are finite
    for a, b in zip(_float_leaves(state), _float_leaves(lay.unpad_state(padded))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)

    # same seed, same result; stopped after round 2 and resumed: the uninterrupted run
    full_s, full_h = fv.run_variant(name, out=tmp_path / "full", checkpoint_every=1)
    again_s, _ = fv.run_variant(name)
    fv.run_variant(name, rounds=2, out=tmp_path / "part", checkpoint_every=1)
    res_s, res_h = fv.run_variant(name, out=tmp_path / "part", checkpoint_every=1, resume=True, extend=True)
    for k in full_s:
        np.testing.assert_array_equal(full_s[k], again_s[k])
        np.testing.assert_array_equal(full_s[k], res_s[k])
    for k in full_h:
        np.testing.assert_array_equal(full_h[k], res_h[k])
    rows = lambda d: [{k: v for k, v in json.loads(x).items() if k != "elapsed_s"}  # noqa: E731
                      for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows(tmp_path / "full") == rows(tmp_path / "part")
    env = json.loads((tmp_path / "part" / "summary.json").read_text())["environment"]  # provenance, not fingerprint
    assert env["jax"] == jax.__version__ and env["backend"] == jax.default_backend()


@pytest.mark.slow
@pytest.mark.parametrize("name", [v for v in fv.variants() if v not in REGISTRY])
def test_pinned_runs_equal_the_pinned_code(name, optimized_xla):
    """Every pinned variant on one device equals its pinned run bitwise (the registry
    variants are compared in test_registry_pinned)."""
    _check_pinned(name)


# Where each pinned run was recorded (tests/pinned/README.md): FedCBO's one run with partial
# participation on an Intel Xeon with AVX-512 (v4), the baselines of issue 62 on an AMD CPU with
# AVX-512 (v5, and SCAFFOLD and CFL in v6), the others on the pins' AMD kind (AVX2).
V5_RUNS = ("fedprox", "fedadam", "fedyogi", "ditto", "dfedavg_median", "dfedavg_trimmed_mean", "dfedavg_krum")
V6_RUNS = ("scaffold", "cfl")
RECORDED_ELSEWHERE = {"fedcbo_egreedy_iso": "intel-avx512", **dict.fromkeys(V5_RUNS + V6_RUNS, "amd-avx512")}


def test_the_pins_say_where_each_run_was_recorded():
    pins = np.load(fv.PINNED)
    runs = {k.split("/")[0] for k in pins.files if not k.startswith("meta/")}
    assert {k for k in pins.files if k.startswith("meta/")} == {f"meta/{r}/recorded_on" for r in runs}
    for r in runs:
        assert fv.recorded_on(r) == RECORDED_ELSEWHERE.get(r, "amd-avx2"), r
    assert runs == set(fv.variants())  # every variant has its pin, and every pin its variant


def test_host_kinds():
    from _stack import PINNED_HOST_KIND, host_kind, pinned_host

    zen3 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx fma avx2\n"
    xeon = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx fma avx2 avx512f\n"
    assert host_kind(zen3, "x86_64") == PINNED_HOST_KIND and pinned_host(zen3, "x86_64")
    assert host_kind(xeon, "x86_64") == "intel-avx512" and not pinned_host(xeon, "x86_64")
    assert host_kind(zen3.replace("avx2", "avx2 avx512f"), "x86_64") == "amd-avx512"
    assert host_kind("", "aarch64") == "aarch64"


def _check_pinned(name):
    s, h = fv.run_variant(name)
    c = fv.compare(name, "single", s, h, np.load(fv.PINNED))
    assert c["diffs"], f"{name} has no pinned run in {fv.PINNED.name}"  # else there is nothing to compare
    assert set(c["missing"]) <= fv.DROPPED, c["missing"]
    atol = fv.pinned_atol(fv.recorded_on(name))
    for key, d in c["diffs"].items():
        assert d <= atol, (key, d)  # bitwise on the pinned JAX and the host kind the run was recorded on


@pytest.mark.parametrize("name", REGISTRY)
def test_registry_pinned(name):
    _check_pinned(name)


def test_no_algorithm_imports_sharding_padding_or_devices():
    forbidden = ("cbo_jax.sharding", "cbo_jax.distributed", "cbo_jax.federated.padding", "cbo_jax.federated.exchange",
                 "jax.sharding", "jax.experimental.shard_map", "jax.experimental.mesh_utils")
    root = Path(fl.__file__).parent / "algorithms"
    files = sorted(root.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        tree = ast.parse(path.read_text())
        names = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names += [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute) and node.attr in ("shard_map", "NamedSharding", "PartitionSpec", "Mesh"):
                names.append(node.attr)
        bad = [m for m in names if m.startswith(forbidden) or m in ("shard_map", "NamedSharding", "PartitionSpec", "Mesh")]
        assert not bad, f"{path.name} imports {bad}"
        assert len(path.read_text().splitlines()) <= 250, f"{path.name} is longer than 250 lines"


# ----------------------------------------------------------------------------- users' own problems


class TwoLayer(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.tanh(nn.Dense(6)(x.reshape(x.shape[0], -1))))


def _two_rules(n_per=5, seed=0):
    """Two clusters with opposite labelling rules, as per-agent lists of unequal sizes."""
    rng = np.random.default_rng(seed)
    xs, ys, tx, ty = [], [], [], []
    for j in range(2 * n_per):
        x = rng.normal(size=(int(rng.integers(15, 25)), 3)).astype(np.float32)
        rule = x[:, 0] > 0
        xs.append(x), ys.append((rule if j < n_per else ~rule).astype(np.int32))
        t = rng.normal(size=(int(rng.integers(30, 40)), 3)).astype(np.float32)
        tx.append(t), ty.append(((t[:, 0] > 0) if j < n_per else (t[:, 0] <= 0)).astype(np.int32))
    return xs, ys, tx, ty


def test_own_flax_model_and_data_with_public_names_only(capsys):
    xs, ys, tx, ty = _two_rules()
    data = fl.FederatedData.from_lists(xs, ys, test_x=tx, test_y=ty)  # one test set per agent, no cluster ids
    assert data.test_counts is not None and data.test_index().tolist() == list(range(10))
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    assert model.num_classes == 2 and model.is_classifier
    data.check(model)
    rms, ms = fl.metrics.default_metrics(model, data)
    assert "no cluster ids" in capsys.readouterr().out
    local = fl.LocalSGDConfig(epochs=2, batch_size=8, lr=0.2, momentum=0.5)
    alg = fl.fedcbo(model, fl.FedCBOConfig(M=3, alpha=20.0, eps0=0.2, eps_decay=0.0, eps_min=0.2, local=local),
                    data.num_agents)
    res = fl.run(alg, data, 6, jax.random.key(0), metrics=ms, round_metrics=rms, every=3, progress=False)
    assert "sr" not in res.history[-1] and res.summary["final_test_acc"] > 85
    # per-agent test sets of unequal sizes: only the real samples count
    assert res.history[-1]["test_loss"] < 0.4


def test_regression_model_reports_loss_not_accuracy():
    rng = np.random.default_rng(1)
    w = np.array([[1.0, -2.0], [-1.0, 2.0]], np.float32)  # two clusters, two linear tasks
    xs = [rng.normal(size=(20, 2)).astype(np.float32) for _ in range(8)]
    ys = [x @ w[j // 4] for j, x in enumerate(xs)]
    test = [rng.normal(size=(30, 2)).astype(np.float32) for _ in range(2)]
    data = fl.FederatedData.from_lists(xs, ys, cluster=[0] * 4 + [1] * 4, test_x=np.stack(test),
                                       test_y=np.stack([t @ w[k] for k, t in enumerate(test)]))
    model = fl.from_flax(nn.Dense(1), xs[0][:1], loss="squared_error")
    assert not model.is_classifier
    data.check(model)
    rms, ms = fl.metrics.default_metrics(model, data, log=None)
    local = fl.LocalSGDConfig(epochs=5, batch_size=10, lr=0.05, momentum=0.0)
    alg = fl.fedavg(model, fl.FedAvgConfig(local=local), data.num_agents)
    res = fl.run(alg, data, 2, jax.random.key(0), metrics=ms, round_metrics=rms, progress=False)
    row = res.history[-1]
    assert "test_acc" not in row and np.isfinite(row["test_loss"]) and row["test_loss"] > 0.5  # one model, two tasks


@pytest.mark.parametrize("break_it,match", [
    (lambda d: d._replace(counts=d.counts.copy() * 0 + np.r_[0, np.ones(len(d.counts) - 1, int)]),
     r"agents \[0\] have no samples"),
    (lambda d: d._replace(test_x=d.test_x[..., :2]), "test sets must be"),
    (lambda d: d._replace(y=d.y + 5), "labels outside"),
    (lambda d: d._replace(cluster=np.zeros(3, np.int32)), "cluster must hold"),
    (lambda d: d._replace(counts=d.counts + 100), "exceed the padded size"),
    # These passed check() and failed (or were truncated) only inside the metrics:
    (lambda d: d._replace(test_y=d.test_y.astype(np.float32)), "integer test labels"),
    (lambda d: d._replace(test_of=np.array([0.0, 0.5, 1.0, 1.0])), "test_of must hold integer"),
    (lambda d: d._replace(test_x=d.test_x * np.float32(np.nan)), "test inputs test_x hold NaN"),
])
def test_bad_data_is_named_before_compilation(break_it, match):
    xs, ys, tx, ty = _two_rules(n_per=2)
    data = fl.FederatedData.from_lists(xs, ys, cluster=[0, 0, 1, 1], test_x=np.stack([t[:30] for t in tx[:2]]),
                                       test_y=np.stack([t[:30] for t in ty[:2]]))
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    data.check(model)
    with pytest.raises(ValueError, match=match):
        break_it(data).check(model)


def test_non_finite_regression_targets_are_named():
    xs = [np.ones((4, 2), np.float32)] * 3
    ys = [np.ones(4, np.float32), np.array([1, np.nan, 1, 1], np.float32), np.ones(4, np.float32)]
    model = fl.from_flax(nn.Dense(1), xs[0][:1], loss="squared_error")
    with pytest.raises(ValueError, match="training targets y hold NaN"):
        fl.FederatedData.from_lists(xs, ys).check(model)
    with pytest.raises(ValueError, match="test targets test_y hold NaN"):
        fl.FederatedData.from_lists(xs, [ys[0]] * 3, test_x=xs[0], test_y=ys[1]).check(model)
    fl.FederatedData.from_lists(xs[:2], [ys[0]] * 2).check(model)  # finite targets pass


def test_test_accuracy_refuses_a_bad_test_size_or_chunk():
    xs, ys, tx, ty = _two_rules(n_per=2)
    data = fl.FederatedData.from_lists(xs, ys, test_x=tx, test_y=ty)
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    # test_size=-1 used to drop each test set's last sample silently, 0 to fail in a modulo.
    for kw, match in (({"test_size": -1}, "test_size must be >= 1"), ({"test_size": 0}, "test_size must be >= 1"),
                      ({"chunk": 0}, "chunk must be >= 1")):
        with pytest.raises(ValueError, match=match):
            fl.metrics.test_accuracy(model, data, **kw)


def test_regression_output_that_only_broadcasts_against_the_targets_is_named():
    # check() probed with one sample, where (1, 2) outputs broadcast against (1,) targets:
    # it passed, and training then failed deep in JAX (or, (n, 3) against (n, 1), ran silently).
    xs = [np.ones((4, 2), np.float32)] * 3
    flat, col = [np.ones(4, np.float32)] * 3, [np.ones((4, 1), np.float32)] * 3
    sq = lambda w: fl.from_flax(nn.Dense(w), xs[0][:1], loss="squared_error")  # noqa: E731
    fl.FederatedData.from_lists(xs, flat).check(sq(1))  # a scalar model and (n,) targets: fine
    fl.FederatedData.from_lists(xs, col).check(sq(1))
    with pytest.raises(ValueError, match="squared error needs targets of the same shape"):
        fl.FederatedData.from_lists(xs, flat).check(sq(2))
    with pytest.raises(ValueError, match="squared error needs targets of the same shape"):
        fl.FederatedData.from_lists(xs, col).check(sq(3))
    custom = fl.from_flax(nn.Dense(2), xs[0][:1], loss=lambda o, y: jnp.sum((o - y) ** 2, -1))
    with pytest.raises(ValueError, match="cannot compare"):
        fl.FederatedData.from_lists(xs, flat).check(custom)


def test_model_whose_output_does_not_fit_the_labels():
    xs, ys, _, _ = _two_rules(n_per=2)
    data = fl.FederatedData.from_lists(xs, ys)
    three = fl.from_flax(nn.Dense(3), xs[0][:1])  # 3 logits for labels 0/1: fine
    data.check(three)
    with pytest.raises(ValueError, match="cannot take inputs"):
        data.check(fl.from_flax(nn.Dense(2), np.zeros((1, 5), np.float32)))  # expects 5 features, data has 3
    with pytest.raises(ValueError, match="outputs"):
        data.check(fl.Model(three.init, three.apply, "mislabelled", 7))
    with pytest.raises(ValueError, match=r"must output \(n, classes\) logits"):
        fl.from_flax(nn.Dense(2), np.zeros((1, 2, 3), np.float32))


def test_runner_refuses_a_population_of_another_size():
    alg, data, _, _, _ = fv.built("fedavg")
    local = fv.built("local")[0]
    small = fl.FederatedData.from_arrays(data.x[:5], data.y[:5], counts=data.counts[:5])
    with pytest.raises(ValueError, match="built for 13 agents .* holds 5"):
        fl.run(local, small, 1, jax.random.key(0), progress=False)


def test_metrics_writer_keeps_json_valid(tmp_path):
    from cbo_jax.writer import MetricsWriter, read_jsonl

    with MetricsWriter(tmp_path) as w:
        w.write({"round": 1, "loss": float("nan"), "v": np.float32(2.5), "nested": {"a": [1.0, float("inf")]}})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"round": 1, "loss": None, "v": 2.5, "nested": {"a": [1.0, None]}}]
    with MetricsWriter(tmp_path, keep=[{"round": 1}]) as w:
        w.write({"round": 2})
    assert [r["round"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    # kept rows take what write() takes (NumPy scalars were a TypeError), and a line that is JSON
    # but not a row (an object) is named, as a line that is not JSON is
    with MetricsWriter(tmp_path, keep=[{"round": np.int64(1), "v": np.float32(np.nan)}]) as w:
        w.write({"round": 2})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"round": 1, "v": None}, {"round": 2}]
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n[1, 2]\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a row"):
        read_jsonl(tmp_path / "metrics.jsonl")


def test_padding_the_state_compiles_once_per_layout():
    """A padded (sharded) run pads its state with one compiled program per layout: jitting
    each run's new ``Layout``'s bound method compiled it again on every run."""
    from typing import NamedTuple

    from cbo_jax.federated import runner
    from cbo_jax.federated.algorithms.base import per_agent_fields

    @per_agent_fields("params")
    class State(NamedTuple):
        params: jax.Array
        round: jax.Array

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    state = State(jnp.ones((5, 3)), jnp.zeros((), jnp.int32))
    first = runner._pad_state(state, padding.Layout(5, 6))
    before = len(compiles)
    again = runner._pad_state(state, padding.Layout(5, 6))  # a new, equal layout: the next run's
    assert len(compiles) == before
    assert again.params.shape == (6, 3)
    np.testing.assert_array_equal(first.params, again.params)


def _events(path):
    from tensorboardX.proto import event_pb2

    raw, pos, out = path.read_bytes(), 0, []
    while pos < len(raw):
        (length,) = struct.unpack("<Q", raw[pos:pos + 8])
        out.append(event_pb2.Event.FromString(raw[pos + 12:pos + 12 + length]))
        pos += 12 + length + 4  # length, its crc, the record, its crc
    return out


def test_resumed_tensorboard_file_purges_the_rerun_steps(tmp_path):
    """A resumed run's event file opens with TensorBoard's purge marker at the step after the
    last kept row, so the rounds it writes again replace the first file's, not double them."""
    pytest.importorskip("tensorboardX")
    import time

    from cbo_jax.writer import MetricsWriter

    with MetricsWriter(tmp_path, tensorboard=True) as w:
        for r in range(1, 5):
            w.write({"round": r, "loss": 1.0 / r})
    first = set(tmp_path.glob("events.out.tfevents*"))
    time.sleep(1.1)  # event files are named by the second
    with MetricsWriter(tmp_path, tensorboard=True, keep=[{"round": 1}, {"round": 2}]) as w:
        w.write({"round": 3, "loss": 0.5})
    (second,) = set(tmp_path.glob("events.out.tfevents*")) - first
    starts = [e.step for e in _events(second) if e.session_log.status == e.session_log.START]
    assert starts == [3]
    with MetricsWriter(tmp_path / "new", tensorboard=True) as w:  # a new run purges nothing
        w.write({"round": 1, "loss": 1.0})
    (new,) = (tmp_path / "new").glob("events.out.tfevents*")
    assert not [e for e in _events(new) if e.session_log.status == e.session_log.START]


def _tiny_local_run(seed):
    """4 agents of 8 two-feature samples, 3 classes, local training of a Dense layer."""
    rng = np.random.default_rng(seed)
    data = fl.AgentData(jnp.asarray(rng.normal(size=(4, 8, 2)), jnp.float32),
                        jnp.asarray(rng.integers(0, 3, size=(4, 8)), jnp.int32), jnp.full((4,), 8, jnp.int32))
    alg = fl.local_only(fl.from_flax(nn.Dense(3), np.zeros((1, 2), np.float32)),
                        fl.LocalConfig(local=fl.LocalSGDConfig(epochs=1, batch_size=4)), 4)
    return data, alg


class _Act(nn.Module):
    act: str = "relu"

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(getattr(nn, self.act)(nn.Dense(4)(x)))


def test_a_resume_with_another_model_is_refused_and_the_model_is_recorded(tmp_path):
    """The fingerprint holds the model (name, classes, loss, parameter shapes, a hash of its
    traced apply): the same shapes with another activation are another run."""
    import json

    data, _ = _tiny_local_run(0)
    cfg = fl.LocalConfig(local=fl.LocalSGDConfig(epochs=1, batch_size=4))
    ex = np.zeros((1, 2), np.float32)
    relu, tanh = (fl.local_only(fl.from_flax(_Act(a), ex, name="act-mlp"), cfg, 4) for a in ("relu", "tanh"))
    kw = dict(progress=False, plots=False, checkpoint_every=1)
    fl.run(relu, data, 1, jax.random.key(0), out=tmp_path / "r", **kw)
    fp = json.loads((tmp_path / "r" / "fingerprint.json").read_text())
    assert fp["model"] == "act-mlp" and fp["model.num_classes"] == 3 and len(fp["model.parameters"]) == 4
    with pytest.raises(ValueError, match=r"(?s)cannot resume .* another run.*model.apply_sha256"):
        fl.run(tanh, data, 2, jax.random.key(0), out=tmp_path / "r", resume=True, extend=True, **kw)
    res = fl.run(relu, data, 2, jax.random.key(0), out=tmp_path / "r", resume=True, extend=True, **kw)
    assert res.history[-1]["round"] == 2


def test_a_model_hashed_under_another_jax_is_compared_without_its_hash(tmp_path, monkeypatch):
    """The model's hash is of a printed jaxpr, which a JAX upgrade may print otherwise: a run
    recorded under another JAX version is resumed and read back as finished, with a warning
    that its traced computation was not compared (under the same version, it is: the test
    above)."""
    from cbo_jax.federated import _records, runner

    data, alg = _tiny_local_run(0)
    kw = dict(progress=False, plots=False, checkpoint_every=1)
    fl.run(alg, data, 2, jax.random.key(0), out=tmp_path / "r", **kw)
    monkeypatch.setattr(jax, "__version__", "99.0.0")
    monkeypatch.setattr(_records, "_apply_hash", lambda *a: "printed-otherwise")
    with pytest.warns(UserWarning, match="traced computation is not"):
        assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(0)) is not None
    with pytest.warns(UserWarning, match=r"recorded its model under JAX .* this is JAX 99\.0\.0"):
        res = fl.run(alg, data, 3, jax.random.key(0), out=tmp_path / "r", resume=True, extend=True, **kw)
    assert res.history[-1]["round"] == 3


def test_a_run_recorded_before_the_model_fingerprint_is_still_read_back_and_resumed(tmp_path):
    """Results written before the fingerprint held the model (no model keys) are read back as
    finished, and resumed, as they were: the model keys they lack are not compared."""
    import json

    from cbo_jax.federated import runner

    data, alg = _tiny_local_run(0)
    kw = dict(progress=False, plots=False)
    fl.run(alg, data, 2, jax.random.key(0), out=tmp_path / "r", checkpoint_every=1, **kw)
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(0)) is not None
    fp = json.loads((tmp_path / "r" / "fingerprint.json").read_text())
    old = {k: v for k, v in fp.items() if not k.startswith("model")}
    (tmp_path / "r" / "fingerprint.json").write_text(json.dumps(old))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    summary["fingerprint"] = runner._fingerprint_hash(old)
    (tmp_path / "r" / "summary.json").write_text(json.dumps(summary))
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(0)) is not None


def test_checkpoint_every_is_honoured_between_evaluations_and_a_resume_from_one_equals_the_whole_run(tmp_path,
                                                                                                      monkeypatch):
    from cbo_jax import checkpoint as ckpt
    from cbo_jax.federated import runner

    data, alg = _tiny_local_run(0)
    kw = dict(every=3, metrics=[lambda ev: {"evaluated": ev.round}], round_metrics=[fl.metrics.round_stats],
              progress=False, plots=False)
    whole = fl.run(alg, data, 9, jax.random.key(0), **kw)
    saved, save = [], ckpt.save

    def spy(path, state, *, step, **k):
        saved.append(step)
        return save(path, state, step=step, **k)

    monkeypatch.setattr(runner.ckpt, "save", spy)
    ck = fl.run(alg, data, 9, jax.random.key(0), checkpoint_every=2, out=tmp_path / "ck", **kw)
    assert saved == [2, 4, 6, 8, 9]  # every 2 rounds and after the last, though evaluations come every 3
    strip = lambda h: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in h]  # noqa: E731
    assert strip(ck.history) == strip(whole.history)  # the same rows: evaluated at rounds 3, 6 and 9 only
    assert [r["round"] for r in whole.history if "evaluated" in r] == [3, 6, 9]

    def killed(path, state, *, step, **k):  # the run is killed just after its checkpoint at round 4
        spy(path, state, step=step, **k)
        if step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner.ckpt, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        fl.run(alg, data, 9, jax.random.key(0), checkpoint_every=2, out=tmp_path / "part", **kw)
    monkeypatch.setattr(runner.ckpt, "save", spy)
    saved.clear()
    res = fl.run(alg, data, 9, jax.random.key(0), checkpoint_every=2, out=tmp_path / "part", resume=True, **kw)
    assert saved == [6, 8, 9]
    for a, b, c in zip(jax.tree_util.tree_leaves(whole.state), jax.tree_util.tree_leaves(ck.state),
                       jax.tree_util.tree_leaves(res.state)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b, c = (jax.random.key_data(v) for v in (a, b, c))
        np.testing.assert_array_equal(a, b)  # bitwise, whatever the scan blocks
        np.testing.assert_array_equal(a, c)
    assert strip(read_jsonl(tmp_path / "part" / "metrics.jsonl")) == strip(whole.history)


def test_per_cluster_metrics_with_gaps_in_the_cluster_ids():
    # Clusters {0, 2}, no cluster 1: test_acc_per_cluster[1] was the mean of an empty slice
    # (NaN, with a RuntimeWarning), server_model_per_cluster[1] the model of agent 0's test set,
    # and cluster_purity 0 (the absent cluster's empty vote row 'claimed' estimate 0).
    from cbo_jax.federated.metrics import Evaluation
    from cbo_jax.models import init_population

    xs, ys, tx, ty = _two_rules(n_per=2)
    data = fl.FederatedData.from_lists(xs, ys, cluster=[0, 0, 2, 2], test_x=np.stack([t[:30] for t in tx[:3:2]]),
                                       test_y=np.stack([t[:30] for t in ty[:3:2]]), test_of=[0, 0, 1, 1])
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    data.check(model)
    metric = fl.metrics.test_accuracy(model, data)
    params = init_population(model, jax.random.key(0), 4)
    with np.errstate(all="raise"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")
        agent = metric(Evaluation(1, True, None, "agent", params))
        server = metric(Evaluation(1, True, None, "server", jax.tree_util.tree_map(lambda a: a[:2], params)))
    for out in (agent, server):
        per = out["test_acc_per_cluster"]
        assert len(per) == 3 and per[1] is None and all(np.isfinite(per[k]) for k in (0, 2)), per
    assert server["server_model_per_cluster"][1] is None
    assert all(isinstance(b, int) for b in server["server_model_per_cluster"][::2])
    Info = __import__("collections").namedtuple("Info", "assignment")
    purity = fl.metrics.cluster_purity(data.cluster)(Info(jnp.asarray([0, 0, 1, 1])))
    assert float(purity["cluster_purity"]) == 1.0
    assert float(fl.metrics.cluster_purity(data.cluster)(Info(jnp.asarray([1, 1, 1, 1])))["cluster_purity"]) == 0.0


def test_run_refuses_labels_outside_the_model_classes():
    # run() never validated the data: label 2 for a 2-class model (or -1) trained silently to garbage.
    xs, ys, _, _ = _two_rules(n_per=2)
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    alg = fl.local_only(model, fl.LocalConfig(local=fl.LocalSGDConfig(epochs=1, batch_size=8)), 4)
    for bad, j in ((2, 1), (-1, 3)):
        yb = [y.copy() for y in ys]
        yb[j][4] = bad
        data = fl.FederatedData.from_lists(xs, yb)
        for d in (data, data.train):  # a FederatedData or the AgentData a round takes
            with pytest.raises(ValueError, match=rf"y holds labels outside \[0, 2\) .*: agent {j} has label {bad} "):
                fl.run(alg, d, 1, jax.random.key(0), progress=False)
    # labels in the padding after an agent's real samples are not data
    data = fl.FederatedData.from_lists(xs, ys)
    j = int(np.argmin(data.counts))
    padded = data._replace(y=np.where(data.mask, data.y, 7).astype(data.y.dtype))
    assert (padded.y[j] == 7).any()
    fl.run(alg, padded, 1, jax.random.key(0), progress=False)


def test_test_accuracy_refuses_test_labels_and_test_sets_out_of_range():
    # test_accuracy did not validate what it evaluates on: a test label 5 of a 2-class model
    # never counted as a hit, a test_of index past the test sets was clamped by JAX's gather
    # (the agent measured on another agent's test set), a cluster id list of the wrong length
    # failed in a boolean index or reported the wrong agents.
    xs, ys, tx, ty = _two_rules(n_per=2)
    sets = dict(test_x=np.stack([t[:30] for t in tx[:2]]), test_y=np.stack([t[:30] for t in ty[:2]]))
    model = fl.from_flax(TwoLayer(), xs[0][:1])
    fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, cluster=[0, 0, 1, 1], **sets))
    bad_y = sets["test_y"].copy()
    bad_y[1, 7] = 5
    with pytest.raises(ValueError, match=r"test_y holds labels outside \[0, 2\) .*: test set 1 has label 5 "):
        fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, cluster=[0, 0, 1, 1], test_x=sets["test_x"],
                                                                    test_y=bad_y))
    # only the evaluated samples count: the bad label sits past test_size=5
    fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, cluster=[0, 0, 1, 1], test_x=sets["test_x"],
                                                                test_y=bad_y), test_size=5)
    with pytest.raises(ValueError, match=r"test_of must map each of the 4 agents to one of the 2 test sets"):
        fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, test_of=[0, 0, 1, 2], **sets))
    with pytest.raises(ValueError, match=r"test_of ids must be integers; agent 1 has 0\.5"):
        fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, test_of=[0, 0.5, 1, 1], **sets))
    with pytest.raises(ValueError, match=r"cluster must hold one id per agent \(4\), got 3"):
        fl.metrics.test_accuracy(model, fl.FederatedData.from_lists(xs, ys, test_of=[0, 0, 1, 1], **sets)._replace(
            cluster=np.zeros(3, int)))


def test_as_many_test_sets_as_clusters_and_agents_needs_test_of():
    # Three agents in three clusters, one test set each: per cluster and per agent are two readings.
    # The per-cluster one was taken silently, and with cluster=[2, 0, 1] every agent was scored on
    # another agent's test set.
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(6, 4)).astype(np.float32) for _ in range(3)]
    ys = [rng.integers(0, 2, 6).astype(np.int32) for _ in range(3)]
    with pytest.raises(ValueError, match=r"one per cluster or one per agent .*pass test_of"):
        fl.FederatedData.from_lists(xs, ys, cluster=[2, 0, 1], test_x=xs, test_y=ys).test_index()
    given = fl.FederatedData.from_lists(xs, ys, cluster=[2, 0, 1], test_x=xs, test_y=ys, test_of=[0, 1, 2])
    assert given.test_index().tolist() == [0, 1, 2]
    same = fl.FederatedData.from_lists(xs, ys, cluster=[0, 1, 2], test_x=xs, test_y=ys)  # the readings agree
    assert same.test_index().tolist() == [0, 1, 2]
    by_cluster = fl.FederatedData.from_lists(xs + xs[:1], ys + ys[:1], cluster=[2, 0, 1, 2], test_x=xs, test_y=ys)
    assert by_cluster.test_index().tolist() == [2, 0, 1, 2]


def test_progress_bar_moves_every_round_and_changes_no_result(monkeypatch):
    """With ``progress=True`` every round is its own scan call and the bar moves after each
    (it moved only at the evaluations before); the rounds, rows and state are bitwise those
    of a run without the bar (scans of ``every`` rounds)."""
    import tqdm.auto

    data, alg = _tiny_local_run(1)
    kw = dict(every=4, metrics=[lambda ev: {"evaluated": ev.round}], round_metrics=[fl.metrics.round_stats],
              plots=False)
    updates: list = []

    class Bar:
        def __init__(self, *, total, initial, **_):
            updates.append(("start", total, initial))

        def update(self, n):
            updates.append(n)

        def set_postfix(self, shown, refresh=True):
            assert not refresh  # drawn with the next move: never more often than the bar
            updates.append("postfix")
            postfixes.append(shown)

        def close(self):
            updates.append("close")

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    postfixes: list = []
    quiet = fl.run(alg, data, 6, jax.random.key(0), progress=False, **kw)
    assert updates == []
    shown = fl.run(alg, data, 6, jax.random.key(0), progress=True, **kw)
    # the numbers after every round (the local loss) and after each evaluation
    assert updates == [("start", 6, 0), *["postfix", 1] * 4, "postfix", *["postfix", 1] * 2, "postfix", "close"]
    strip = lambda h: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in h]  # noqa: E731
    assert strip(shown.history) == strip(quiet.history)
    row = quiet.history
    assert postfixes[0] == {"train_loss": f"{row[0]['train_loss']:.4g}"}  # before any evaluation: the local loss
    assert postfixes[-1] == {"evaluated": "6", "train_loss": f"{row[5]['train_loss']:.4g}"}
    for a, b in zip(jax.tree_util.tree_leaves(quiet.state), jax.tree_util.tree_leaves(shown.state)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_json_names_the_model_and_an_earlier_record_without_it_is_still_finished(tmp_path):
    """Without ``config``, ``config.json`` records the model that was trained (its name,
    classes, loss and parameter count) next to the algorithm's config; results written
    before it did (no ``"model"`` key) are still read back as this finished run."""
    import json

    from cbo_jax.federated import runner

    data, alg = _tiny_local_run(0)
    fl.run(alg, data, 2, jax.random.key(7), out=tmp_path / "r", progress=False, plots=False)
    recorded = json.loads((tmp_path / "r" / "config.json").read_text())
    assert recorded["model"] == {"name": alg.model.name, "num_classes": 3, "loss": "cross_entropy",
                                 "parameters": 2 * 3 + 3}
    # the key too: config.json alone says how to run it again (before, fingerprint.json alone held it)
    assert recorded["key"] == [0, 7] and recorded["rounds"] == 2
    assert np.array_equal(jax.random.key_data(jax.random.wrap_key_data(np.asarray(recorded["key"], np.uint32))),
                          jax.random.key_data(jax.random.key(7)))
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(7)) is not None
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(0)) is None
    for earlier in ({k: v for k, v in recorded.items() if k != "key"},  # written before the key, before the model
                    {k: v for k, v in recorded.items() if k not in ("key", "model")}):
        (tmp_path / "r" / "config.json").write_text(json.dumps(earlier))
        assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(7)) is not None
    other = dict(recorded, model=dict(recorded["model"], parameters=1))  # a record of another model
    (tmp_path / "r" / "config.json").write_text(json.dumps(other))
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(7)) is None
    (tmp_path / "r" / "config.json").write_text(json.dumps(dict(recorded, key=[0, 8])))  # another key's record
    assert runner.finished(tmp_path / "r", alg, data, 2, jax.random.key(7)) is None
