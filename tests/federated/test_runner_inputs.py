"""A researcher's own model and data meeting the federated public API: bad inputs are named.

``fl.run`` validates the training side it is given on the host, before anything is
compiled: shapes and counts, integer labels for a classifier (in range), finite inputs
and targets, and the model's output and per-sample loss against the labels (an abstract
probe, ``jax.eval_shape``). Each case here used to crash deep inside JAX or optax, or to
run silently to a wrong number.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import runner


class Classifier(nn.Module):
    classes: int = 3

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes)(x.reshape(x.shape[0], -1).astype(jnp.float32))


class Squeezed(nn.Module):
    """A scalar regression model that outputs ``(n,)``."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)[:, 0]


LOCAL = fl.LocalSGDConfig(epochs=1, batch_size=4, lr=0.05, momentum=0.0)


def _lists(sizes=(5, 1, 7, 3), dim=4, classes=3, seed=0):
    """Unequal per-agent data sets (one agent with a single sample), int64 labels."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, dim)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, classes, n) for n in sizes]
    return xs, ys


def _targets(xs, seed=1, shape=()):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(len(x),) + shape).astype(np.float32) for x in xs]


def _local(model, n=4):
    return fl.local_only(model, fl.LocalConfig(local=LOCAL), n)


def _refused(alg, data, match, monkeypatch):
    """``run`` raises ``ValueError(match)`` and never reaches the compiled rounds."""
    def never(*a, **k):
        raise AssertionError("the compiled rounds were reached")

    monkeypatch.setattr(runner, "_scan_rounds", never)
    with pytest.raises(ValueError, match=match):
        fl.run(alg, data, 1, jax.random.key(0), progress=False)


# --- labels of a classifier -----------------------------------------------------------------------

@pytest.mark.parametrize("kind,hint", [("float", r"astype\(int\)"), ("one_hot", r"one-hot labels: pass their class "
                                       r"ids, y.argmax\(-1\)"), ("column", r"a column of labels: pass y\[..., 0\]")])
def test_run_names_labels_a_classifier_cannot_take(kind, hint, monkeypatch):
    # Float or one-hot labels for a cross-entropy classifier failed inside optax's trace with
    # "Expected the input to have a dtype that is a subdtype of integer", naming nothing; a
    # column of labels (n, 1) failed in optax's shape check.
    xs, ys = _lists()
    ys = {"float": [y.astype(np.float32) for y in ys], "one_hot": [np.eye(3, dtype=np.float32)[y] for y in ys],
          "column": [y[:, None] for y in ys]}[kind]
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys)
    match = r"a classifier needs integer labels of shape \(N, n_max\), got .*" + hint
    for d in (data, data.train):
        _refused(_local(model), d, match, monkeypatch)


def test_boolean_labels_are_class_ids():
    # Binary labels as booleans (y = x[:, 0] > 0) were kept as bool: check() refused them and
    # run() failed inside optax. They are the class ids 0 and 1.
    xs, ys = _lists(classes=2)
    yb = [y.astype(bool) for y in ys]
    data = fl.FederatedData.from_lists(xs, yb, test_x=xs, test_y=yb)
    assert data.y.dtype == np.int32 and data.test_y.dtype == np.int32
    np.testing.assert_array_equal(data.y[0, :5], ys[0])
    model = fl.from_flax(Classifier(classes=2), xs[0][:1])
    data.check(model)
    res = fl.run(_local(model), data, 1, jax.random.key(0), metrics=[fl.metrics.test_accuracy(model, data)],
                 progress=False)
    assert 0 <= res.summary["final_test_acc"] <= 100


def test_test_accuracy_names_float_test_labels_of_a_classifier():
    # Integer training labels but float test labels: the metric failed inside optax at the
    # first evaluation, after the training rounds had run.
    xs, ys = _lists()
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys, test_x=xs, test_y=[y.astype(np.float32) for y in ys])
    with pytest.raises(ValueError, match="integer test labels test_y"):
        fl.metrics.test_accuracy(model, data)


# --- the model against the data ---------------------------------------------------------------------

def test_run_names_a_regression_output_that_does_not_fit_the_targets(monkeypatch):
    # A 3-output model for scalar targets failed in JAX's broadcasting ("Incompatible shapes
    # for broadcasting: shapes=[(4, 3), (4,)]") while tracing the rounds.
    xs, _ = _lists()
    data = fl.FederatedData.from_lists(xs, _targets(xs))
    model = fl.from_flax(nn.Dense(3), xs[0][:1], loss="squared_error")
    for d in (data, data.train):
        _refused(_local(model), d, r"outputs \(3,\) per sample, but the squared error needs targets", monkeypatch)
    # (n,) outputs against (n, 1) targets broadcast to (n, n): a silently wrong loss
    squeeze = fl.from_flax(Squeezed(), xs[0][:1], loss="squared_error")
    _refused(_local(squeeze), fl.FederatedData.from_lists(xs, _targets(xs, shape=(1,))),
             "squared error needs targets of the same shape", monkeypatch)


@pytest.mark.parametrize("loss,shape", [(lambda o, y: (o - y[:, None]) ** 2, r"\(3, 1\)"),
                                        (lambda o, y: jnp.mean((o[:, 0] - y) ** 2), r"\(\)")])
def test_run_names_a_loss_that_is_not_one_loss_per_sample(loss, shape, monkeypatch):
    # A loss of shape (n, 1) broadcast against the (n,) sample mask to (n, n), a scalar mean
    # counted the padding rows: both trained silently on wrong losses.
    xs, _ = _lists()
    model = fl.from_flax(nn.Dense(1), xs[0][:1], loss=loss)
    data = fl.FederatedData.from_lists(xs, _targets(xs))
    _refused(_local(model), data, rf"the loss of model Dense gives shape {shape} for 3 samples, not one loss per "
             rf"sample", monkeypatch)


def test_run_names_inputs_the_model_cannot_take(monkeypatch):
    xs, ys = _lists()
    model = fl.from_flax(nn.Dense(3), np.zeros((1, 5), np.float32))  # built for 5 features, the data has 4
    _refused(_local(model), fl.FederatedData.from_lists(xs, ys), r"cannot take inputs of shape \(4,\)", monkeypatch)


def test_run_names_a_classifier_with_fewer_logits_than_the_labels_need(monkeypatch):
    xs, ys = _lists(classes=3)
    model = fl.from_flax(Classifier(classes=2), xs[0][:1])
    _refused(_local(model), fl.FederatedData.from_lists(xs, ys), r"y holds labels outside \[0, 2\)", monkeypatch)


# --- counts and values ---------------------------------------------------------------------------------

def test_run_names_an_agent_without_samples(monkeypatch):
    # A client with 0 samples trained on nothing (its loss is 0 under every model), yet its 0
    # entered the mean training loss; check() refused it, run() did not.
    xs, ys = _lists()
    xs[2], ys[2] = xs[2][:0], ys[2][:0]
    data = fl.FederatedData.from_lists(xs, ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    for d in (data, data.train):
        _refused(_local(model), d, r"agents \[2\] have no samples", monkeypatch)
    # inactive padding agents (valid False) hold no samples by design, and whatever they hold is not data
    padded = data.train._replace(counts=jnp.asarray([5, 1, 3, 3], jnp.int32)).pad(6)
    assert padded.counts.tolist()[4:] == [0, 0]
    runner._check_data(fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), 6), padded)
    garbage = padded._replace(x=padded.x.at[4:].set(jnp.nan), y=padded.y.at[4:].set(9),
                              counts=padded.counts.at[4:].set(padded.x.shape[1]))
    runner._check_data(fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), 6), garbage)


@pytest.mark.parametrize("counts,match", [([5, 1, 9, 3], r"counts up to 9 exceed the padded size n_max=7"),
                                          ([5.0, 1.0, 7.0, 3.0], "counts must hold one integer per agent")])
def test_run_names_counts_that_do_not_fit_the_data(counts, match, monkeypatch):
    # counts past n_max weighted FedAvg's average by samples that do not exist; float counts
    # were truncated by the int32 conversion of FederatedData.train.
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)._replace(counts=np.asarray(counts))
    _refused(_local(fl.from_flax(Classifier(), xs[0][:1])), data, match, monkeypatch)


@pytest.mark.parametrize("field", ["x", "y"])
def test_run_names_non_finite_training_data(field, monkeypatch):
    # A NaN input or target made the agent's model NaN (and the mean test loss NaN) without a word.
    xs, _ = _lists()
    ys = _targets(xs)
    (xs if field == "x" else ys)[2][3] = np.nan
    model = fl.from_flax(nn.Dense(1), xs[0][:1], loss="squared_error")
    data = fl.FederatedData.from_lists(xs, ys)
    what = "inputs x" if field == "x" else "targets y"
    for d in (data, data.train):
        _refused(_local(model), d, rf"training {what} hold NaN or infinite values: agent 2, sample 3", monkeypatch)
    # padding rows are not data: NaN after an agent's samples is fine
    xs, _ = _lists()
    clean = fl.FederatedData.from_lists(xs, _targets(xs))
    clean.x[1, 3] = np.nan  # agent 1 has one sample
    runner._check_data(_local(model), clean)


# --- cluster ids in the round metrics ----------------------------------------------------------------

def test_cluster_purity_counts_estimates_beyond_the_number_of_agents():
    # IFCA with more server models than agents (k = 10, N = 4) estimates clusters 0..9; the vote
    # table had one column per agent and dropped the votes for estimates >= 4: clusters
    # recovered exactly scored 0.5 or 0.
    import collections

    Info = collections.namedtuple("Info", "assignment")
    purity = fl.metrics.cluster_purity([0, 0, 1, 1])
    for estimate, want in (([5, 5, 1, 1], 1.0), ([5, 5, 6, 6], 1.0), ([7, 7, 7, 7], 0.0), ([9, 5, 6, 6], 0.75)):
        assert float(purity(Info(jnp.asarray(estimate, jnp.int32)))["cluster_purity"]) == want, estimate
    # in a run: IFCA with 10 server models for 4 agents, against the definition computed here
    xs, ys = _lists(sizes=(6, 6, 6, 6))
    alg = fl.ifca(fl.from_flax(Classifier(), xs[0][:1]), fl.IFCAConfig(k=10, local=LOCAL), 4)
    res = fl.run(alg, fl.FederatedData.from_lists(xs, ys), 3, jax.random.key(0), progress=False,
                 round_metrics=[purity, lambda info: {"estimates": info.assignment}])
    for row in res.history:
        est = np.asarray(row["estimates"])
        majority = [min(v for v in set(est[t]) if list(est[t]).count(v) == max(list(est[t]).count(u) for u in est[t]))
                    for t in (slice(0, 2), slice(2, 4))]
        want = 0.0 if majority[0] == majority[1] else float(np.mean(est == np.repeat(majority, 2)))
        assert row["cluster_purity"] == want, (est, row["cluster_purity"])


@pytest.mark.parametrize("ids", [[0, 0, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
def test_round_metrics_need_one_cluster_id_per_agent(ids):
    # 8 ids for 6 agents gave a silently wrong SR_n oracle (computed for 8 agents); 3 failed in
    # JAX's broadcasting ("eq got incompatible shapes").
    xs, ys = _lists(sizes=(5, 2, 7, 3, 4, 4))
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys)
    cbo = fl.fedcbo(model, fl.FedCBOConfig(M=2, local=LOCAL), 6)
    ifca = fl.ifca(model, fl.IFCAConfig(k=2, local=LOCAL), 6)
    for alg, metric, name in ((cbo, fl.metrics.selection(ids), "selection"),
                              (ifca, fl.metrics.cluster_purity(ids), "cluster_purity")):
        with pytest.raises(ValueError, match=rf"{name}\(cluster\): cluster holds {len(ids)} ids but the run has 6 "
                                             rf"agents"):
            fl.run(alg, data, 1, jax.random.key(0), round_metrics=[metric], progress=False)


# --- what run() is given ------------------------------------------------------------------------------

def test_run_refuses_metrics_that_are_not_functions_before_training(monkeypatch):
    # metrics=default_metrics(...) (the pair, not unpacked) trained every round up to the first
    # evaluation and then failed with "'list' object is not callable".
    xs, ys = _lists()
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys, test_x=xs, test_y=ys)
    alg = _local(model)
    pair = fl.metrics.default_metrics(model, data, log=None)
    monkeypatch.setattr(runner, "_scan_rounds", lambda *a, **k: pytest.fail("the rounds were reached"))
    for kw, match in ((dict(metrics=pair), r"metrics\[0\] must be a function f\(Evaluation\) -> dict, got list; "
                                           r"fl.metrics.default_metrics returns the pair"),
                      (dict(round_metrics=["sr"]), r"round_metrics\[0\] must be a function f\(info\) -> dict, got str"),
                      (dict(metrics=fl.metrics.test_accuracy(model, data)), r"metrics must be a list of functions .*: "
                                                                             r"pass \[metrics\]"),
                      (dict(round_metrics=[Unhashable()]), r"round_metrics\[0\] \(Unhashable\) must be hashable")):
        with pytest.raises(ValueError, match=match):
            fl.run(alg, data, 3, jax.random.key(0), every=3, progress=False, **kw)
    monkeypatch.undo()
    # evaluation metrics run on the host: any callable, hashable or not
    res = fl.run(alg, data, 1, jax.random.key(0), metrics=[Unhashable()], progress=False)
    assert res.history[-1]["round"] == 1


class Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self, info):
        return {}


def test_run_names_data_of_the_wrong_kind():
    xs, ys = _lists()
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys)
    with pytest.raises(ValueError, match="data must be a FederatedData, an AgentData or an AttackData .* got tuple"):
        fl.run(_local(model), (data.x, data.y, data.counts), 1, jax.random.key(0), progress=False)
    # FedCB2O and DFedAvgM take the attack benchmark's groups: an AttributeError ('AgentData' object
    # has no attribute 'benign') before
    cb2o = fl.fedcb2o(model, fl.FedCB2OConfig(M=1, local=LOCAL), [0, 0, 1, 1], [False] * 4)
    with pytest.raises(ValueError, match="fedcb2o takes an AttackData, got FederatedData: .*fl.AttackData.from_lists"):
        fl.run(cb2o, data, 1, jax.random.key(0), progress=False)
    dfed = fl.dfedavgm(model, fl.DFedAvgMConfig(M=1, local=LOCAL), [0, 0, 1, 1])
    with pytest.raises(ValueError, match="dfedavgm takes an AttackData, got FederatedData"):
        fl.run(dfed, data, 1, jax.random.key(0), progress=False)


def test_pooled_metrics_of_a_regression_model_and_of_models_that_are_not_one_server_model():
    # A regression model got train_acc = test_acc = 0.0 (argmax of its one output against float
    # targets); FedCBO's agents were reported as "the server model" (agent 0's numbers).
    xs, _ = _lists()
    ys = _targets(xs)
    data = fl.FederatedData.from_lists(xs, ys, test_x=xs, test_y=ys)
    reg = fl.from_flax(nn.Dense(1), xs[0][:1], loss="squared_error")
    metric = fl.metrics.pooled(reg, data.train, data.test_x, data.test_y, data.test_counts)
    res = fl.run(fl.fedsgld(reg, fl.FedSGLDConfig(), 4), data, 1, jax.random.key(0), metrics=[metric],
                 progress=False)
    row = res.history[-1]
    assert "train_acc" not in row and "test_acc" not in row and np.isfinite(row["train_loss"])
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys, test_x=np.stack([x[:1] for x in xs]),
                                       test_y=np.stack([y[:1] for y in ys]))
    assert data.test_counts is None  # whole test sets: None was a TypeError in jnp.asarray
    clf = fl.from_flax(Classifier(), xs[0][:1])
    metric = fl.metrics.pooled(clf, data.train, data.test_x, data.test_y, data.test_counts)
    row = fl.run(fl.fedavg(clf, fl.FedAvgConfig(local=LOCAL), 4), data, 1, jax.random.key(0), metrics=[metric],
                 progress=False).history[-1]
    assert 0 <= row["train_acc"] <= 100 and 0 <= row["test_acc"] <= 100
    with pytest.raises(ValueError, match="pooled measures one server model .* exposes 4 agent models"):
        fl.run(_local(clf), data, 1, jax.random.key(0), metrics=[metric], progress=False)


def test_fedcb2o_and_dfedavgm_on_your_own_per_agent_arrays():
    """fl.AttackData.from_lists: training and validation splits of unequal sizes, with and
    without attackers, run through fl.run with the public API only."""
    xs, ys = _lists(sizes=(6, 3, 5, 4))
    vxs, vys = _lists(sizes=(2, 3, 1, 2), seed=3)
    mxs, mys = _lists(sizes=(7, 5), seed=4)
    model = fl.from_flax(Classifier(), xs[0][:1])
    attacked = fl.AttackData.from_lists(xs, ys, vxs, vys, mxs, mys)
    assert (attacked.benign.num_agents, attacked.val.num_agents, attacked.malicious.num_agents) == (4, 4, 2)
    np.testing.assert_array_equal(np.asarray(attacked.val.counts), [2, 3, 1, 2])
    cb2o = fl.fedcb2o(model, fl.FedCB2OConfig(M=2, local=LOCAL), [0, 0, 1, 1, 0, 1], [False] * 4 + [True] * 2)
    res = fl.run(cb2o, attacked, 2, jax.random.key(0), progress=False)
    assert res.history[-1]["round"] == 2
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree_util.tree_leaves(res.state.params))
    clean = fl.AttackData.from_lists(xs, ys, vxs, vys)
    assert clean.malicious.num_agents == 0 and clean.num_agents == 4
    fl.run(fl.fedcb2o(model, fl.FedCB2OConfig(M=2, local=LOCAL), [0, 0, 1, 1], [False] * 4), clean, 1,
           jax.random.key(0), progress=False)
    fl.run(fl.dfedavgm(model, fl.DFedAvgMConfig(M=1, local=LOCAL), [0, 0, 1, 1]), clean, 1, jax.random.key(0),
           progress=False)
    with pytest.raises(ValueError, match="every benign agent needs a validation split: 4 training splits, 3"):
        fl.AttackData.from_lists(xs, ys, vxs[:3], vys[:3])
    with pytest.raises(ValueError, match="must pair up"):
        fl.AttackData.from_lists(xs, ys, vxs, vys, mxs, mys[:1])


def test_pooled_metrics_ignore_nan_padding_rows_eager_and_jitted():
    """Padding rows may hold NaN; the pooled loss and accuracy are those of the real rows,
    called eagerly or jitted (0 · NaN made the eager sums NaN)."""
    from cbo_jax.federated.metrics import _pooled, _pooled_jit

    xs, ys = _lists()
    model = fl.from_flax(Classifier(), xs[0][:1])
    params = model.init(jax.random.key(0))
    counts = jnp.asarray([len(x) for x in xs])
    x = np.full((4, 7, 4), np.nan, np.float32)
    y = np.zeros((4, 7), np.int32)
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        x[i, :len(xi)], y[i, :len(yi)] = xi, yi
    real_x, real_y = np.concatenate(xs), np.concatenate(ys)
    logits = np.asarray(model.apply(params, jnp.asarray(real_x)))
    want_loss = float(np.mean(np.asarray(model.loss(jnp.asarray(logits), jnp.asarray(real_y)))))
    want_acc = float(np.mean(logits.argmax(-1) == real_y))
    for fn in (_pooled, _pooled_jit):
        loss, acc, _ = fn(model, params, jnp.asarray(x), jnp.asarray(y), counts)
        assert float(loss) == pytest.approx(want_loss, rel=1e-6) and float(acc) == pytest.approx(want_acc)


def test_test_accuracy_names_an_empty_test_set():
    # An agent whose own test set was empty scored accuracy 0 and loss 0 into the means.
    xs, ys = _lists()
    txs, tys = _lists(sizes=(4, 0, 3, 3), seed=2)
    model = fl.from_flax(Classifier(), xs[0][:1])
    data = fl.FederatedData.from_lists(xs, ys, test_x=txs, test_y=tys)
    with pytest.raises(ValueError, match=r"test sets \[1\] have no samples \(test_counts < 1\) but agents \[1\] are "
                                         r"measured on them"):
        fl.metrics.test_accuracy(model, data)
    fl.metrics.test_accuracy(model, data._replace(test_of=np.array([0, 0, 2, 3])))  # nobody uses the empty one


def test_from_flax_hints_at_the_stacked_data_given_as_example_input():
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    with pytest.raises(ValueError, match=r"outputs \(4, 7, 3\) for example_input of shape \(4, 7, 4\) \(if that is the "
                                         r"stacked \(N, n_max, ...\) data, give one batch of samples"):
        fl.from_flax(nn.Dense(3), data.x)
    assert fl.from_flax(nn.Dense(3), data.x[0, :1]).num_classes == 3


def test_metrics_given_as_a_generator_are_kept():
    """The checks of the metric lists used up a generator: the run reported no metric at all."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys, test_x=xs, test_y=ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    res = fl.run(_local(model), data, 1, jax.random.key(0), progress=False,
                 metrics=(m for m in [fl.metrics.test_accuracy(model, data)]))
    assert "final_test_acc" in res.summary


def test_run_refuses_extend_without_resume_and_resume_with_overwrite(tmp_path):
    """Both were ignored: extend=True alone made a new run; resume=True, overwrite=True resumed."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    with pytest.raises(ValueError, match="extend continues a run: it needs resume=True"):
        fl.run(_local(model), data, 1, jax.random.key(0), out=tmp_path / "a", extend=True, progress=False)
    with pytest.raises(ValueError, match="resume continues the results in out and overwrite replaces them"):
        fl.run(_local(model), data, 1, jax.random.key(0), out=tmp_path / "b", resume=True, overwrite=True,
               progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_boolean_labels_given_directly_are_refused_with_the_conversion():
    """``FederatedData.from_arrays`` converts boolean labels; a ``FederatedData(...)`` built
    directly was refused with "got bool" and no way on."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 10, 3)).astype(np.float32)
    y = x[..., 0] > 0
    model = models.logistic_regression(3, 2)
    data = fl.FederatedData(x, y, np.full(4, 10), cluster=np.zeros(4, int), test_x=x[:1], test_y=y[:1])
    with pytest.raises(ValueError, match=r"booleans: pass y.astype\(int\) \(FederatedData.from_arrays converts"):
        data.check(model)
    with pytest.raises(ValueError, match=r"booleans: pass test_y.astype\(int\)"):
        fl.metrics.default_metrics(model, data._replace(y=y.astype(np.int32)), chunk=2)
    with pytest.raises(ValueError, match=r"booleans: pass test_y.astype\(int\)"):
        data._replace(y=y.astype(np.int32)).check(model)


def _leaves_equal(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("target", ["labels", "regression"])
def test_non_finite_padding_rows_change_no_gradient(target):
    """Padding rows are accepted with any values (above), so they must not reach a gradient:
    ``jnp.where`` hid a NaN padding row from the loss value, but the backward pass multiplied
    its zero cotangent by NaN partials and the agent's model became NaN (FedAvg then dropped
    it from the average without a word). Local SGD, FedAvg and FedSGLD's gradients now give
    exactly the clean data's results."""
    from cbo_jax.federated.langevin import poisson_clipped_grad, poisson_grad

    xs, ys = _lists()
    if target == "regression":
        ys = _targets(xs)
        model = fl.from_flax(nn.Dense(1), xs[0][:1], loss="squared_error")
    else:
        model = fl.from_flax(Classifier(), xs[0][:1])
    clean = fl.FederatedData.from_lists(xs, ys)
    dirty = fl.FederatedData.from_lists(xs, ys)
    dirty.x[1, 3:] = np.nan  # agent 1 has one sample: rows 1.. are padding
    dirty.x[3, 5] = np.inf
    if target == "regression":
        dirty.y[1, 2] = np.nan
    for alg in (_local(model), fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), 4)):
        a, b = (fl.run(alg, d, 2, jax.random.key(0), progress=False, plots=False).state.params for d in (clean, dirty))
        _leaves_equal(a, b)
    params = model.init(jax.random.key(1))
    x, y = jnp.asarray(dirty.x[1]), jnp.asarray(dirty.y[1])
    cx, cy = jnp.asarray(clean.x[1]), jnp.asarray(clean.y[1])
    _leaves_equal(poisson_grad(model, params, x, y, 1, jax.random.key(2), 1.0),
                  poisson_grad(model, params, cx, cy, 1, jax.random.key(2), 1.0))
    _leaves_equal(poisson_clipped_grad(model, params, x, y, 1, jax.random.key(2), 1.0, 0.5),
                  poisson_clipped_grad(model, params, cx, cy, 1, jax.random.key(2), 1.0, 0.5))
    mask = jnp.arange(x.shape[0]) < 1
    _leaves_equal(jax.grad(lambda p: models.masked_loss(model, p, x, y, mask))(params),
                  jax.grad(lambda p: models.masked_loss(model, p, cx, cy, mask))(params))


@pytest.mark.parametrize("which,fn,got", [("metrics", lambda ev: 0.5, "float"),
                                          ("round_metrics", lambda info: info.train_loss, r"an array of shape \(4,\)")])
def test_a_metric_that_returns_no_dict_is_named(which, fn, got):
    """A metric returning a number failed with "'float' object is not iterable", a round
    metric returning an array with "iteration over a 0-d array" or "unhashable type:
    'DynamicJaxprTracer'"."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    alg = _local(fl.from_flax(Classifier(), xs[0][:1]))
    what = "the metric" if which == "metrics" else "the round metric"
    with pytest.raises(TypeError, match=rf"{what} '<lambda>' must return a dict .* got {got}"):
        fl.run(alg, data, 1, jax.random.key(0), progress=False, **{which: [fn]})


def test_test_accuracy_checks_the_test_sets_when_built():
    """``test_accuracy`` took test sets of another sample shape, mismatched labels, NaN
    inputs or fractional counts, and failed (or scored NaN) at the first evaluation, after
    the first rounds had trained; ``from_arrays`` took a cluster array of another length and
    the error blamed a ``test_of`` never passed."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    rng = np.random.default_rng(0)
    tx, ty = rng.normal(size=(2, 7, 4)).astype(np.float32), rng.integers(0, 3, (2, 7))
    x, y = data.x, data.y
    cases = [(dict(test_x=tx[..., :3], test_y=ty), r"test sets must be \(T, n_test\) \+ the samples' shape \(4,\)"),
             (dict(test_x=tx, test_y=ty[:, :3]), "test sets must be"),
             (dict(test_x=np.full_like(tx, np.nan), test_y=ty), "test_x hold NaN"),
             (dict(test_x=tx, test_y=ty, test_counts=np.array([3.5, 7.0])), "integer counts"),
             (dict(test_x=tx, test_y=ty + 3), "test_y")]
    cases.append((dict(test_x=np.where(np.arange(7)[None, :, None] == 6, np.nan, tx), test_y=ty,
                       test_counts=np.array([7, 7])), "test_x hold NaN"))
    for kw, match in cases:
        bad = fl.FederatedData.from_arrays(x, y, counts=data.counts, cluster=[0, 0, 1, 1], **kw)
        with pytest.raises(ValueError, match=match):
            fl.metrics.test_accuracy(model, bad)
    # padding past test_counts (and past test_size) is never evaluated: NaN there is fine
    padded = np.where(np.arange(7)[None, :, None] == 6, np.nan, tx).astype(np.float32)
    fl.metrics.test_accuracy(model, fl.FederatedData.from_arrays(x, y, counts=data.counts, cluster=[0, 0, 1, 1],
                                                                 test_x=padded, test_y=ty, test_counts=np.array([6, 6])))
    fl.metrics.test_accuracy(model, fl.FederatedData.from_arrays(x, y, counts=data.counts, cluster=[0, 0, 1, 1],
                                                                 test_x=padded, test_y=ty), test_size=6)
    with pytest.raises(ValueError, match=r"cluster must have one entry per agent \(4\), got shape \(3,\)"):
        fl.FederatedData.from_arrays(x, y, cluster=[0, 1, 0], test_x=tx, test_y=ty)


def test_run_names_a_server_algorithm_built_for_other_agents_and_a_batch_of_keys():
    """FedAvg and IFCA (no agent axis in their state) ran on data of any number of agents;
    a batch of keys failed in jax.random.split, raw key data of the wrong width in JAX."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    for alg in (fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), 100), fl.ifca(model, fl.IFCAConfig(k=2, local=LOCAL), 100)):
        with pytest.raises(ValueError, match=rf"{alg.name} was built for 100 agents \(num_agents\) but the data holds 4"):
            fl.run(alg, data, 1, jax.random.key(0), progress=False)
    alg = _local(model)
    with pytest.raises(ValueError, match=r"key must be a single PRNG key, got a key array of shape \(2,\): run splits"):
        fl.run(alg, data, 1, jax.random.split(jax.random.key(0)), progress=False)
    with pytest.raises(ValueError, match="key must be a PRNG key"):
        fl.run(alg, data, 1, np.zeros(4, np.uint32), progress=False)
    with pytest.raises(ValueError, match="progress must be True or False, got 'no'"):
        fl.run(alg, data, 1, 0, progress="no")
    train = data.train  # counts as a Python list failed inside the compiled round (a pytree of scalars)
    with pytest.raises(ValueError, match=r"counts must be an array, got list: pass np.asarray\(counts\)"):
        fl.run(alg, fl.AgentData(train.x, train.y, [int(c) for c in train.counts]), 1, 0, progress=False)


def test_pooled_and_attack_accuracy_check_their_test_sets_when_built():
    """``pooled`` (FedSGLD's metrics) and ``attack_accuracy`` (FedCB²O's) took test sets of
    another sample shape, NaN inputs, labels past the classes, cluster ids past the test sets
    or an attack class the model does not have, and failed (or scored NaN, or clamped an
    index silently) at the first evaluation, after the first rounds had trained."""
    from _federated_variants import TINY4, attack_dataset

    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    clf = fl.from_flax(Classifier(), xs[0][:1])
    rng = np.random.default_rng(0)
    tx, ty = rng.normal(size=(1, 7, 4)).astype(np.float32), rng.integers(0, 3, (1, 7))
    for (bx, by, counts), match in [((tx[..., :3], ty, None), r"test sets must be \(T, n_test\) \+ the samples' shape"),
                                    ((tx, ty[:, :5], None), "test sets must be"),
                                    ((np.full_like(tx, np.inf), ty, None), "test inputs test_x hold NaN or infinite"),
                                    ((tx, ty + 3, None), r"test_y holds labels outside \[0, 3\)"),
                                    ((tx, ty.astype(np.float32), None), "integer test labels"),
                                    ((tx, ty, np.array([7, 7])), "test_counts must hold integer counts, one per")]:
        with pytest.raises(ValueError, match=match):
            fl.metrics.pooled(clf, data.train, bx, by, counts)
    fl.metrics.pooled(clf, data.train, np.where(np.arange(7)[None, :, None] == 6, np.nan, tx), ty,
                      np.array([6]))  # NaN past the counts is padding, never evaluated

    ds = attack_dataset()
    fl.metrics.attack_accuracy(TINY4, ds)
    k = ds.test_x.shape[0]
    for bad, match in [(dict(source=4), r"the attack's source class must be in \[0, 4\)"),
                       (dict(target=-1), "target class must be in"),
                       (dict(cluster=np.full_like(ds.cluster, k)), rf"a cluster id in \[0, {k}\)"),
                       (dict(test_x=np.full(ds.test_x.shape, np.nan, np.float32)), "test_x hold NaN"),
                       (dict(test_y=ds.test_y + 4), "test_y holds labels outside"),
                       (dict(test_y=ds.test_y[:, :3]), "test sets must be")]:
        with pytest.raises(ValueError, match=match):
            fl.metrics.attack_accuracy(TINY4, ds._replace(**bad))
    with pytest.raises(ValueError, match="cluster id"):
        fl.metrics.attack_accuracy(TINY4, ds, ds.cluster[:2])  # fewer ids than benign agents


# --- extending: a selection rule of one's own, metrics that collide, a metric of other data ------------------


def _cyclic(M):
    """Agent j downloads j+1, ..., j+M (mod N): a deterministic rule of one's own."""
    def init(rows, cols):
        return jnp.zeros((rows, cols))

    def select(key, P, n, candidates=None):
        rows, cols = P.shape
        idx = (jnp.arange(rows)[:, None] + 1 + jnp.arange(M)[None, :]) % cols
        return fl.selection.Selection(idx.astype(jnp.int32), jnp.zeros(idx.shape, bool), jnp.zeros((), jnp.float32))

    def update(P, idx, loss, own_loss=None, active=None, valid=None):
        return P

    return fl.SelectionRule(init, select, update, M, "cyclic")


def test_a_selection_rule_of_ones_own_runs_in_fedcbo_and_fedcb2o():
    """FedCBOConfig.selection takes only the built-in names, and a name added to selection.RULES passed
    the config's check while rule() drew uniformly: fedcbo(..., rule=) runs the rule given (checked
    on the host first); rule() refuses a name it cannot build."""
    xs, ys = _lists(sizes=(5, 4, 6, 3, 5))
    data = fl.FederatedData.from_lists(xs, ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    cfg = fl.FedCBOConfig(M=2, local=LOCAL)
    alg = fl.fedcbo(model, cfg, 5, rule=_cyclic(2))
    assert alg.name == "fedcbo-cyclic"
    state, info = jax.jit(alg.round)(alg.init(jax.random.key(0)), data.train)
    np.testing.assert_array_equal(np.asarray(info.idx), (np.arange(5)[:, None] + 1 + np.arange(2)) % 5)
    fl.run(alg, data, 1, jax.random.key(0), progress=False)
    from cbo_jax.federated import selection

    with pytest.MonkeyPatch.context() as m:
        m.setitem(selection.RULES, "cyclic", _cyclic)
        with pytest.raises(ValueError, match=r"selection='cyclic' is not a built-in rule.*rule=\.\.\."):
            fl.fedcbo(model, fl.FedCBOConfig(M=2, selection="cyclic", local=LOCAL), 5)
    attacked = fl.AttackData.from_lists(xs[:4], ys[:4], xs[:4], ys[:4], xs[4:], ys[4:])
    cb2o = fl.fedcb2o(model, fl.FedCB2OConfig(M=2, local=LOCAL), [0, 0, 1, 1, 0], [False] * 4 + [True], rule=_cyclic(2))
    assert cb2o.name == "fedcb2o-cyclic"
    _, info = jax.jit(cb2o.round)(cb2o.init(jax.random.key(0)), attacked)
    np.testing.assert_array_equal(np.asarray(info.idx), (np.arange(4)[:, None] + 1 + np.arange(2)) % 5)


@pytest.mark.parametrize("broken,match", [
    (lambda r: r._replace(M=3), "draws M=3 downloads, the config M=2"),
    (lambda r: r._replace(select=lambda k, P, n, c=None: r.select(k, P, n)._replace(idx=r.select(k, P, n).idx[:, :1])),
     r"integer downloads idx of shape \(5, 2\)"),
    (lambda r: r._replace(select=lambda k, P, n, c=None: r.select(k, P, n)._replace(
        idx=jnp.stack([jnp.arange(5), (jnp.arange(5) + 1) % 5], 1))), "agent 0 downloads the agent itself"),
    (lambda r: r._replace(select=lambda k, P, n, c=None: r.select(k, P, n)._replace(idx=r.select(k, P, n).idx + 5)),
     r"downloads an agent outside \[0, 5\)"),
    (lambda r: r._replace(select=lambda k, P, n, c=None: r.select(k, P, n)._replace(
        idx=jnp.stack([(jnp.arange(5) + 1) % 5] * 2, 1))), "downloads an agent twice in one row"),
    (lambda r: r._replace(select=lambda k, P, n, c=None: r.select(k, P, n).idx), "must return a Selection"),
    (lambda r: "cyclic", "rule must be a cbo_jax.federated.SelectionRule"),
])
def test_a_selection_rule_that_draws_wrongly_is_refused_before_the_run(broken, match):
    xs, ys = _lists(sizes=(5, 4, 6, 3, 5))
    model = fl.from_flax(Classifier(), xs[0][:1])
    with pytest.raises(ValueError, match=match):
        fl.fedcbo(model, fl.FedCBOConfig(M=2, local=LOCAL), 5, rule=broken(_cyclic(2)))


def test_a_selection_rule_that_ignores_the_candidates_is_refused_under_partial_participation():
    """With participation < 1, select is given the mask of this round's participants; a rule that
    ignored it downloaded agents that did not train this round, marked valid and weighted in full.
    The built-in rules draw from the candidates and pass the same host check."""
    xs, ys = _lists(sizes=(5, 4, 6, 3, 5, 4))
    model = fl.from_flax(Classifier(), xs[0][:1])
    cfg = fl.FedCBOConfig(M=2, participation=0.5, local=LOCAL)
    with pytest.raises(ValueError, match="downloads an agent that is not a candidate this round"):
        fl.fedcbo(model, cfg, 6, rule=_cyclic(2))
    fl.fedcbo(model, fl.FedCBOConfig(M=2, local=LOCAL), 6, rule=_cyclic(2))  # full participation: every agent
    for rule in (fl.selection.epsilon_greedy(2, eps0=0.5), fl.selection.prob_sampling(2)):
        fl.selection.check_rule(rule, 2, 6, 6, "test", candidates=True)


def test_an_attack_data_given_to_an_algorithm_of_agent_data_is_refused():
    # fedcbo given FedCB²O's AttackData failed inside the traced round with an AttributeError
    # ('AttackData' object has no attribute 'agent_mask').
    xs, ys = _lists(sizes=(5, 4, 6, 3))
    model = fl.from_flax(Classifier(), xs[0][:1])
    attacked = fl.AttackData.from_lists(xs, ys, xs, ys)
    for alg in (fl.fedcbo(model, fl.FedCBOConfig(M=2, local=LOCAL), 4), _local(model)):
        with pytest.raises(ValueError, match=r"takes a FederatedData or an AgentData, got an AttackData.*data\.benign"):
            fl.run(alg, attacked, 1, jax.random.key(0), progress=False)
    fl.run(fl.fedcbo(model, fl.FedCBOConfig(M=2, local=LOCAL), 4), attacked.benign, 1, jax.random.key(0), progress=False)


def test_metric_names_that_collide_are_refused():
    """A round metric returning "round" rewrote every row's round; two metrics returning one name kept
    the last one's value (round_stats and attack_selection both returned train_loss)."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    alg = _local(fl.from_flax(Classifier(), xs[0][:1]))

    def loss_again(info):
        return {"train_loss": jnp.mean(info.train_loss)}

    def rounds(info):
        return {"round": jnp.int32(99)}

    def evaluated(ev):
        return {"train_loss": 0.0}

    for kw, match in [({"round_metrics": [rounds]}, "'rounds' returns 'round', which the runner writes"),
                      ({"round_metrics": [fl.metrics.round_stats, loss_again]},
                       "'loss_again' and 'round_stats' both return 'train_loss'"),
                      ({"round_metrics": [fl.metrics.round_stats], "metrics": [evaluated]},
                       "'evaluated' and 'a round metric' both return 'train_loss'")]:
        with pytest.raises(ValueError, match=match):
            fl.run(alg, data, 1, jax.random.key(0), progress=False, **kw)


def test_declared_metric_names_that_collide_are_refused_before_any_round_runs(monkeypatch):
    """An evaluation metric's clash was found at its first evaluation, after `every` rounds had
    trained. The built-in evaluation metrics declare their names (metrics.returning), so a clash
    among them, or with a round metric, is refused before any round runs: pooled and
    test_accuracy both return test_acc, pooled and round_stats both return train_loss."""
    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys, test_x=xs, test_y=ys)
    model = fl.from_flax(Classifier(), xs[0][:1])
    alg = fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), len(xs))
    pooled = fl.metrics.pooled(model, data.train, data.test_x, data.test_y, data.test_counts)
    accuracy = fl.metrics.test_accuracy(model, data)
    assert pooled.__name__ == "pooled" and "test_acc" in pooled.returns and accuracy.__name__ == "test_accuracy"
    ran = []

    def counting(info):
        jax.debug.callback(lambda: ran.append(1))
        return {}

    for kw, match in [({"metrics": [pooled, accuracy]}, "'test_accuracy' and 'pooled' both return 'test_acc'"),
                      ({"metrics": [pooled], "round_metrics": [counting, fl.metrics.round_stats]},
                       "'round_stats' and 'pooled' both return 'train_loss'")]:
        with pytest.raises(ValueError, match=match):
            fl.run(alg, data, 6, jax.random.key(0), every=3, progress=False, **kw)
    assert ran == []  # refused while tracing: no round ran
    res = fl.run(alg, data, 2, jax.random.key(0), progress=False, metrics=[pooled])
    assert {"train_loss", "objective", "test_acc"} <= set(res.history[-1])


def test_test_accuracy_of_other_data_is_refused_and_first_agents_is_explicit():
    """A 4-agent run scored with a 5-agent data's test_accuracy averaged over 5 "agents" (JAX clamps the
    index); agents='first' measures the first agents of a larger run (FedCB²O's benign ones)."""
    xs, ys = _lists(sizes=(5, 1, 7, 3, 4))
    big = fl.FederatedData.from_lists(xs, ys, test_x=[x[:2] for x in xs], test_y=[y[:2] for y in ys])
    small = fl.FederatedData.from_lists(xs[:4], ys[:4], test_x=[x[:2] for x in xs[:4]], test_y=[y[:2] for y in ys[:4]])
    model = fl.from_flax(Classifier(), xs[0][:1])
    with pytest.raises(ValueError, match="built for the 5 agents of its data, but the run's models are 4 agents"):
        fl.run(_local(model, 4), small, 1, jax.random.key(0), metrics=[fl.metrics.test_accuracy(model, big)],
               progress=False)
    with pytest.raises(ValueError, match="agents='first'"):
        fl.run(_local(model, 5), big, 1, jax.random.key(0), metrics=[fl.metrics.test_accuracy(model, small)],
               progress=False)
    res = fl.run(_local(model, 5), big, 1, jax.random.key(0), progress=False,
                 metrics=[fl.metrics.test_accuracy(model, small, agents="first")])
    whole = fl.metrics.test_accuracy(model, big)(fl.metrics.Evaluation(1, True, None, "agent", res.state.params))
    first = fl.metrics.test_accuracy(model, small)(fl.metrics.Evaluation(
        1, True, None, "agent", jax.tree_util.tree_map(lambda a: a[:4], res.state.params)))
    assert res.history[-1]["test_acc"] == pytest.approx(first["test_acc"]) and whole["test_acc"] != first["test_acc"]


def test_a_diverged_model_scores_a_nan_accuracy():
    """NaN logits have argmax 0: a diverged model scored the share of class 0 as its accuracy."""
    xs, ys = _lists(sizes=(6, 6))
    data = fl.FederatedData.from_lists(xs, ys, test_x=[x for x in xs], test_y=[np.zeros_like(y) for y in ys])
    model = fl.from_flax(Classifier(), xs[0][:1])
    params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 2))
    broken = jax.tree_util.tree_map(lambda a: a.at[0].set(jnp.nan), params)
    out = fl.metrics.test_accuracy(model, data)(fl.metrics.Evaluation(1, True, None, "agent", broken))
    assert np.isnan(out["test_acc"]) and np.isnan(out["test_loss"])
    ok = fl.metrics.test_accuracy(model, data)(fl.metrics.Evaluation(1, True, None, "agent", params))
    assert 0.0 <= ok["test_acc"] <= 100.0


def test_a_function_in_a_config_does_not_stop_a_resume(tmp_path):
    """The fingerprint held str(function), whose memory address differs in every process: a run with a
    function in its config could never be resumed. Functions are recorded by module and name."""
    from cbo_jax.writer import stable_text

    def schedule(step):
        return 0.1

    assert stable_text(schedule) == f"{__name__}.test_a_function_in_a_config_does_not_stop_a_resume.<locals>.schedule"
    assert stable_text(object()).startswith("<object object") and " at 0x" not in stable_text(object())
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Scheduled:  # an algorithm of one's own whose config holds a function
        lr_schedule: object = schedule

    xs, ys = _lists()
    data = fl.FederatedData.from_lists(xs, ys)
    alg = _local(fl.from_flax(Classifier(), xs[0][:1]))._replace(config=Scheduled())
    fp = runner.fingerprint(alg, data.train, jax.random.key(0), 2, 1)
    assert fp["config.lr_schedule"] == stable_text(schedule)  # was "<function ... at 0x7f...>"


def test_extenders_mistakes_are_named():
    """Uneven per-agent arrays given to from_arrays (NumPy's "inhomogeneous shape"), one sample
    without its batch axis as from_flax's example, FederatedData given to FedCB²O ("built for 5
    agents but the data holds 4") and a cluster list of the benign agents only ("malicious must have
    one entry per agent")."""
    xs, ys = _lists(sizes=(5, 4, 6, 3, 5))
    with pytest.raises(ValueError, match=r"different shapes.*FederatedData.from_lists"):
        fl.FederatedData.from_arrays(xs, ys)
    with pytest.raises(ValueError, match=r"give a batch of samples.*x\[None\]"):
        fl.from_flax(nn.Dense(3), xs[0][0])
    model = fl.from_flax(Classifier(), xs[0][:1])
    cb2o = fl.fedcb2o(model, fl.FedCB2OConfig(M=2, local=LOCAL), [0, 0, 1, 1, 0], [False] * 4 + [True])
    with pytest.raises(ValueError, match=r"fedcb2o takes an AttackData, got FederatedData.*AttackData.from_lists"):
        fl.run(cb2o, fl.FederatedData.from_lists(xs[:4], ys[:4]), 1, jax.random.key(0), progress=False)
    with pytest.raises(ValueError, match=r"cluster \(4 entries\) and malicious \(5\) must both have one entry per "
                                         r"agent, the attackers included"):
        fl.fedcb2o(model, fl.FedCB2OConfig(M=2, local=LOCAL), [0, 0, 1, 1], [False] * 4 + [True])


def test_round_stats_reads_an_info_given_as_a_dict():
    info = {"train_loss": jnp.array([1.0, 3.0]), "active": jnp.array([True, True])}
    out = fl.metrics.round_stats(info)
    assert float(out["train_loss"]) == 2.0 and int(out["participants"]) == 2


@pytest.mark.parametrize("where", ["x", "y", "test_x"])
def test_complex_inputs_are_refused(where):
    """A complex array ran with its imaginary part silently dropped (the particle API refused it)."""
    xs, ys = _lists()
    x, y = np.stack([a[:1] for a in xs]), np.stack([b[:1] for b in ys])
    arrays = {"x": x, "y": y, "test_x": x[:, :1]}
    arrays[where] = arrays[where] * (1 + 1j)
    model = models.logistic_regression(4, 3)
    with pytest.raises(ValueError, match=rf"{where} is complex \(complex(64|128)\).*drop the imaginary part"):
        data = fl.FederatedData.from_arrays(arrays["x"], arrays["y"], test_x=arrays["test_x"], test_y=y[:, :1])
        fl.run(_local(model), data, 1, jax.random.key(0), progress=False, metrics=[fl.metrics.test_accuracy(model, data)])


def test_object_arrays_are_named_before_jax_sees_them(monkeypatch):
    """An object-dtype ``x`` given to ``fl.run`` failed in JAX with "Error interpreting argument"."""
    xs, ys = _lists()
    x, y = np.stack([a[:1] for a in xs]), np.stack([b[:1] for b in ys])
    data = fl.AgentData(x.astype(object), y, np.ones(4, np.int32))
    _refused(_local(models.logistic_regression(4, 3)), data, r"x has dtype object, not a number type", monkeypatch)
