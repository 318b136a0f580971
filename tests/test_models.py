"""A researcher's own Flax model (and own loss) meeting ``from_flax``, the losses and local SGD.

Dropout behind a ``train`` flag, BatchNorm, tuple or dict outputs, a model without
parameters, a bfloat16 model, a loss that is not one loss per sample: each works and
gives the right numbers, or is refused at once by a ``ValueError`` that says what to do.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import local
from cbo_jax.federated.data import AgentData
from cbo_jax.models import logistic_regression, mlp_mnist


class DropNet(nn.Module):
    """Dropout behind a ``train`` flag, the usual Flax idiom."""

    rate: float = 0.5
    train_default: bool = False

    @nn.compact
    def __call__(self, x, train: bool | None = None):
        train = self.train_default if train is None else train
        h = nn.relu(nn.Dense(16)(x))
        h = nn.Dropout(self.rate)(h, deterministic=not train)
        return nn.Dense(3)(h)


class DeterministicFlag(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        return nn.Dense(3)(nn.Dropout(0.5)(nn.Dense(16)(x), deterministic=deterministic))


class AlwaysDrop(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.Dropout(0.5, deterministic=False)(nn.Dense(8)(x)))


class WithBatchNorm(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(3)(nn.BatchNorm(use_running_average=not train)(nn.Dense(8)(x)))


class TupleOut(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)
        return nn.Dense(3)(h), h


class DictOut(nn.Module):
    @nn.compact
    def __call__(self, x):
        return {"logits": nn.Dense(3)(x)}


class NoParams(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x[:, :3]


class HalfDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)(x)


def _data(n_agents=2, n_max=12, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(n_agents, n_max, dim)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 3, (n_agents, n_max)).astype(np.int32))
    return AgentData(x, y, jnp.full((n_agents,), n_max, jnp.int32))


LOCAL = local.LocalSGDConfig(epochs=2, batch_size=5, lr=0.1, momentum=0.0)


# --- dropout behind a training flag ---------------------------------------------------------------

def test_local_sgd_applies_dropout_of_a_train_flag():
    # A module with ``train: bool = False`` was always called as apply(params, x): local SGD trained
    # with dropout off, silently (the step of the dropout-free loss).
    data = _data(n_agents=1)
    cfg = local.LocalSGDConfig(epochs=1, batch_size=12, lr=0.1, momentum=0.0)  # one full batch: one SGD step
    drop = models.from_flax(DropNet(rate=0.5), data.x[0, :1])
    plain = models.from_flax(DropNet(rate=0.0), data.x[0, :1])
    assert drop.train_apply is not None

    @jax.jit
    def run(key):
        params = models.init_population(drop, key, 1)
        p0 = jax.tree_util.tree_map(lambda leaf: leaf[0], params)
        trained = local.local_train(drop, cfg, params, None, data, jax.random.key(1)).params
        g = jax.grad(lambda q: models.masked_loss(plain, q, data.x[0], data.y[0]))(p0)
        no_dropout = jax.tree_util.tree_map(lambda w, d: w - 0.1 * d, p0, g)
        # evaluation is dropout-free: the rate-0 model's loss
        losses = models.masked_loss(drop, p0, data.x[0], data.y[0]), models.masked_loss(plain, p0, data.x[0], data.y[0])
        return trained, no_dropout, losses

    trained, no_dropout, (ld, lp) = run(jax.random.key(0))
    k = trained["params"]["Dense_0"]["kernel"][0]
    assert not np.allclose(k, no_dropout["params"]["Dense_0"]["kernel"], atol=1e-4)
    np.testing.assert_allclose(ld, lp, rtol=1e-6)


def test_a_train_flag_defaulting_to_true_is_evaluated_with_it_off():
    # ``train: bool = True`` (dropout on by default) failed in from_flax with flax's InvalidRngError:
    # evaluation ran in training mode.
    data = _data()
    model = models.from_flax(DropNet(rate=0.5, train_default=True), data.x[0, :1])
    plain = models.from_flax(DropNet(rate=0.0), data.x[0, :1])
    flag = models.from_flax(DeterministicFlag(), data.x[0, :1])  # deterministic=True evaluates, False trains

    @jax.jit
    def outputs(key):
        p, q = model.init(key), flag.init(key)
        return (model.apply(p, data.x[0]), plain.apply(p, data.x[0]),
                flag.train_apply(q, data.x[0], jax.random.key(1)), flag.apply(q, data.x[0]))

    evaluated, dropout_free, trained, flag_evaluated = outputs(jax.random.key(0))
    np.testing.assert_allclose(evaluated, dropout_free, rtol=1e-6)
    assert not np.allclose(trained, flag_evaluated)


class FieldFlag(nn.Module):
    """The training flag as an attribute of the module, the other Flax idiom."""

    training: bool = False

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.Dropout(0.9, deterministic=not self.training)(nn.Dense(16)(x)))


@pytest.mark.parametrize("training", [False, True])
def test_a_training_attribute_is_switched_for_training_and_evaluation(training):
    # FieldFlag(training=False) never applied its dropout; FieldFlag(training=True) failed in from_flax.
    x = jnp.ones((4, 4))
    model = models.from_flax(FieldFlag(training=training), x[:1])
    p = model.init(jax.random.key(0))
    plain = models.from_flax(FieldFlag(training=False), x[:1], train_arg=None).apply(p, x)  # dropout off
    np.testing.assert_allclose(model.apply(p, x), plain, rtol=1e-6)
    assert not np.allclose(model.train_apply(p, x, jax.random.key(1)), plain)


def test_train_arg_none_keeps_the_flag_at_its_default():
    data = _data()
    model = models.from_flax(DropNet(rate=0.5), data.x[0, :1], train_arg=None)
    assert model.train_apply is None
    with pytest.raises(ValueError, match=r"neither an argument of DropNet.__call__ \('x', 'train'\) nor an attribute"):
        models.from_flax(DropNet(), data.x[0, :1], train_arg="training")


@pytest.mark.slow  # compiles a whole federated run
def test_a_federated_run_trains_a_dropout_model():
    data = _data(n_agents=3)
    fdata = fl.FederatedData.from_lists([np.asarray(v) for v in data.x], [np.asarray(v) for v in data.y])
    model = models.from_flax(DropNet(rate=0.3), data.x[0, :1])
    res = fl.run(fl.fedavg(model, fl.FedAvgConfig(local=LOCAL), 3), fdata, 1, jax.random.key(0), progress=False)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree_util.tree_leaves(res.state.params))


# --- modules that cannot be a model: refused at once, with what to do ----------------------------

@pytest.mark.parametrize("module,match", [
    (AlwaysDrop(), r"AlwaysDrop draws random numbers when evaluated .*give Dropout deterministic=not train"),
    (WithBatchNorm(), r"mutable collections \['batch_stats'\] \(BatchNorm's running statistics\).*nn.LayerNorm"),
    (NoParams(), "NoParams has no parameters"),
    (TupleOut(), "TupleOut outputs a tuple, not one array; loss='cross_entropy'"),
    (DictOut(), "DictOut outputs a dict, not one array"),
    (nn.Dense(1), "Dense outputs 1 logit: a cross-entropy classifier needs one logit per class, at least 2"),
])
def test_from_flax_refuses_what_it_cannot_run(module, match):
    # AlwaysDrop: flax's InvalidRngError; NoParams: a vmap error over an empty pytree at the first
    # loss; TupleOut / DictOut: AttributeError "'tuple' object has no attribute 'ndim'".
    with pytest.raises(ValueError, match=match):
        models.from_flax(module, np.zeros((1, 4), np.float32))


def test_a_custom_loss_may_take_a_tuple_output_but_a_classifier_needs_logits():
    x = jnp.ones((5, 4))
    y = jnp.asarray([0, 1, 2, 0, 1])
    loss = lambda out, y: models.cross_entropy(out[0], y)  # noqa: E731
    model = models.from_flax(TupleOut(), x[:1], loss=loss)
    assert np.isfinite(jax.jit(lambda k: models.masked_loss(model, model.init(k), x, y))(jax.random.key(0)))
    with pytest.raises(ValueError, match=r"num_classes=3 makes TupleOut a classifier .* outputs a tuple"):
        models.from_flax(TupleOut(), x[:1], loss=loss, num_classes=3)


def test_a_required_extra_argument_is_named():
    class NeedsMode(nn.Module):
        @nn.compact
        def __call__(self, x, mode):
            return nn.Dense(3)(x)

    with pytest.raises(ValueError, match=r"NeedsMode.__call__ needs the arguments \['mode'\]"):
        models.from_flax(NeedsMode(), np.zeros((1, 4), np.float32))


# --- the losses -----------------------------------------------------------------------------------

@pytest.mark.parametrize("loss", [lambda o, y: (o[:, :1] - y[:, None]) ** 2, lambda o, y: jnp.mean(o[:, 0] - y) ** 2])
def test_masked_loss_refuses_a_loss_that_is_not_per_sample(loss):
    # (n, 1) broadcast against the (n,) mask to (n, n); a per-batch scalar counted the padding rows:
    # local_train (no runner check in front of it) trained on a wrong loss, silently.
    model = models.from_flax(nn.Dense(2), np.zeros((1, 4), np.float32), loss=loss)
    p = model.init(jax.random.key(0))
    x, y = jnp.ones((6, 4)), jnp.zeros(6)
    with pytest.raises(ValueError, match=r"gives shape \((6, 1|)\) for 6 samples, not one loss per sample"):
        models.masked_loss(model, p, x, y, jnp.arange(6) < 4)


def test_a_bfloat16_model_averages_its_loss_in_float32():
    # The mean over a batch was summed in bfloat16 (8 bits of mantissa): off by ~1e-2 relative.
    model = models.from_flax(HalfDense(), np.zeros((1, 4), np.float32))
    rng = np.random.default_rng(0)
    x, y = jnp.asarray(rng.normal(size=(300, 4)).astype(np.float32)), jnp.asarray(rng.integers(0, 3, 300))

    p = jax.jit(model.init)(jax.random.key(0))
    per = np.asarray(models.cross_entropy(model.apply(p, x), y), np.float64)  # eager: bfloat16 losses, as rounded
    got = models.masked_loss(model, p, x, y, jnp.arange(300) < 257)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), per[:257].mean(), rtol=1e-5)
    grads = jax.jit(jax.grad(lambda q: models.masked_loss(model, q, x, y)))(p)
    assert jax.tree_util.tree_leaves(grads)[0].dtype == jnp.bfloat16


# --- consensus of a bfloat16 population --------------------------------------------------------------

def test_consensus_of_bfloat16_rows_sums_its_weights_in_float32():
    # The normalised weights were cast to bfloat16 (1/3 -> 0.33398, summing to 1.0019) and the
    # streaming sums accumulated in bfloat16: the consensus of rows 1, 2, 4 came out 2.34375,
    # not 2.328125, the bfloat16 nearest to 7/3.
    from cbo_jax import consensus, population as pop

    rows = {"w": jnp.asarray([[1.0], [2.0], [4.0]], jnp.bfloat16)}
    want = float(jnp.asarray(7 / 3, jnp.bfloat16))
    energy = jnp.zeros(3)

    @jax.jit
    def points(rows, energy):
        return (consensus.consensus_point(rows, energy, 1.0),
                consensus.streaming_consensus_point(rows, energy, 1.0, chunk=1),
                jax.tree_util.tree_map(lambda v: v[0], consensus.subset_consensus(
                    rows, jnp.asarray([[0, 1, 2]]), energy[None], 1.0, method="gather")),
                pop.weighted_mean(rows, jnp.full(3, 1 / 3)))

    for got in points(rows, energy):
        assert got["w"].dtype == jnp.bfloat16
        assert float(got["w"][0]) == want


def test_init_population_takes_a_seed_and_names_a_batch_of_keys():
    # An integer seed failed inside jax.random.split ("invalid PRNG key data ... Got 0"), a batch of
    # keys with "split accepts a single key".
    model = models.from_flax(nn.Dense(2), np.zeros((1, 3), np.float32))
    a, b = models.init_population(model, 3, 2), models.init_population(model, jax.random.key(3), 2)
    np.testing.assert_array_equal(a["params"]["kernel"], b["params"]["kernel"])
    with pytest.raises(ValueError, match=r"one PRNG key, got a batch of keys of shape \(2,\)"):
        models.init_population(model, jax.random.split(jax.random.key(0), 2), 2)


def test_fedcbo_download_consensus_of_bfloat16_rows_sums_in_float32():
    """The default ``eval_by="agent"`` path cast the weights to bfloat16 (1/3 -> 0.33398):
    rows 1, 2, 4 with equal energies gave 2.34375, not 2.328125 (the bfloat16 nearest 7/3)."""
    from cbo_jax.federated.aggregation import Energy, consensus_downloads

    params = {"w": jnp.asarray([[1.0], [2.0], [4.0], [0.0]], jnp.bfloat16)}
    own = {"w": jnp.asarray([[0.0]], jnp.bfloat16)}

    def energy(down, theta, x):
        loss = jnp.zeros(down["w"].shape[0], jnp.float32)
        return Energy(loss, loss, jnp.float32(0.0), jnp.float32(0.0))

    res = jax.jit(lambda p, o: consensus_downloads(energy, p, jnp.asarray([[0, 1, 2]]), o, (jnp.zeros((1, 1)),),
                                                   alpha=1.0, chunk=1))(params, own)
    assert res.consensus["w"].dtype == jnp.bfloat16
    assert float(res.consensus["w"][0, 0]) == float(jnp.asarray(7 / 3, jnp.bfloat16)) == 2.328125


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_models_logistic_and_mlp_still_usable():
    lr = logistic_regression()
    p = lr.init(jax.random.key(0))
    assert p["params"]["Dense_0"]["kernel"].shape == (60, 10)
    assert lr.apply(p, jnp.ones((5, 60))).shape == (5, 10)
    mlp = mlp_mnist()
    assert mlp.apply(mlp.init(jax.random.key(0)), jnp.zeros((2, 28, 28), jnp.uint8)).shape == (2, 10)
