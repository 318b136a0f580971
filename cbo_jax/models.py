"""Models as pure ``init``/``apply`` pairs with a loss, vmapped over stacked parameters.

A :class:`Model` wraps a Flax module: ``init(key)`` returns one agent's parameters,
``apply(params, x)`` the outputs of a batch, and ``loss(outputs, y)`` the per-sample
loss (softmax cross-entropy for classifiers). :func:`init_population` stacks ``N``
independently initialised agents (the FedCBO reference code initialises agents
independently) so that every algorithm works on a population of models.

Any Flax module becomes a model with :func:`from_flax`: a classifier (cross-entropy,
accuracy reported), a regression model (squared error), or a loss of your own.
Every algorithm reaches the data through one masked loss, :func:`masked_loss`: the
mean per-sample loss over the real samples of a padded batch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, NamedTuple

import flax.errors
import flax.linen as nn
import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import optax

from cbo_jax import _checks

PyTree = Any

__all__ = ["MLP", "Model", "from_flax", "mlp_mnist", "init_population", "cross_entropy", "squared_error", "masked_loss",
           "zero_padding", "batch_loss", "accuracy", "preprocess", "LogisticRegression", "logistic_regression", "CNN",
           "cnn_emnist", "cnn", "LOSSES"]


def preprocess(x: jax.Array) -> jax.Array:
    """``uint8`` pixels to ``float32`` in ``[0, 1]`` (other dtypes pass through as float32)."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


class MLP(nn.Module):
    """Fully connected network with ReLU hidden layers and biases (FedCBO §2.4: 784-200-10)."""

    hidden: tuple[int, ...] = (200,)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = preprocess(x).reshape(x.shape[0], -1)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample softmax cross-entropy with integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def squared_error(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-sample squared error ``Σ (f(x) - y)²`` over the output dimensions.

    A scalar regression model may output ``(n, 1)`` for ``(n,)`` targets.
    """
    targets = jnp.asarray(targets, outputs.dtype)
    if outputs.ndim == targets.ndim + 1 and outputs.shape[-1] == 1:
        outputs = outputs[..., 0]
    err = jnp.square(outputs - targets)
    return jnp.sum(err.reshape(err.shape[0], -1), axis=-1) if err.ndim > 1 else err


LOSSES = {"cross_entropy": cross_entropy, "squared_error": squared_error, "mse": squared_error}


def loss_name(loss: Callable) -> str:
    """A loss function's name as results record it (``cross_entropy``; a callable object's class)."""
    return getattr(loss, "__name__", type(loss).__name__)


class Model(NamedTuple):
    """A model for stacked agents.

    Attributes:
      init: ``init(key) -> params`` of one agent.
      apply: ``apply(params, x) -> outputs`` for a batch ``x`` of shape ``(n, ...)``.
      name: a short description (written to results).
      num_classes: classes of a classifier; ``None`` for a regression model (no accuracy).
      loss: ``loss(outputs, y) -> (n,)`` per-sample loss (default: cross-entropy).
      train_apply: ``train_apply(params, x, key) -> outputs``, the forward pass in training
        mode (dropout on, drawing from ``key``), used by local SGD; ``None`` (default):
        training uses ``apply``. :func:`from_flax` sets it for a module with a ``train``
        (``training``, ``is_training``) or ``deterministic`` flag.
    """

    init: Callable[[jax.Array], PyTree]
    apply: Callable[..., Any]  # apply(params, x) -> outputs (a Flax module's apply takes more keywords)
    name: str
    num_classes: int | None
    loss: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy
    train_apply: Callable[[PyTree, jax.Array, jax.Array], Any] | None = None

    def __repr__(self) -> str:  # by name: a Flax module's apply would print every attribute of the module
        training = "" if self.train_apply is None else ", train_apply=set"
        return f"Model({self.name!r}, num_classes={self.num_classes}, loss={loss_name(self.loss)}{training})"

    @property
    def is_classifier(self) -> bool:
        return self.num_classes is not None


# A flag of ``__call__`` that switches a module between training and evaluation, and its
# value in training (``deterministic`` is the inverse of ``train``).
_TRAIN_FLAGS = {"train": True, "training": True, "is_training": True, "deterministic": False}


def _call_parameters(module: nn.Module) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(module.__call__).parameters)
    except (TypeError, ValueError):  # no signature to read (a C callable): nothing detected
        return None


def _module_fields(module: nn.Module) -> set[str]:
    return {f.name for f in dataclasses.fields(module)} if dataclasses.is_dataclass(module) else set()


def _train_flag(module: nn.Module, train_arg: str | None) -> tuple[str | None, bool]:
    """The name of ``module``'s training flag and whether it is an attribute of the module
    (``False``: an argument of ``__call__``): ``train_arg`` checked, or the conventional name
    ``__call__`` takes or the module holds (``"auto"``); ``(None, False)`` when there is none."""
    params = _call_parameters(module)
    fields = _module_fields(module)
    if train_arg == "auto":
        for where, names in ((False, params or {}), (True, fields)):
            found = [name for name in _TRAIN_FLAGS if name in names]
            if len(found) > 1:
                raise ValueError(f"{type(module).__name__} takes the flags {found}; name the one that switches "
                                 f"training on with from_flax(..., train_arg=...)")
            if found:
                return found[0], where
        return None, False
    if train_arg is None:
        return None, False
    if not isinstance(train_arg, str):
        raise ValueError(f"train_arg must be 'auto', None or the name of an argument of the module, got {train_arg!r}")
    if params is None or train_arg in params:
        return train_arg, False
    if train_arg in fields:
        return train_arg, True
    if any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values()):
        return train_arg, False
    raise ValueError(f"train_arg={train_arg!r} is neither an argument of {type(module).__name__}.__call__ "
                     f"{tuple(params)} nor an attribute of the module")


def _output_kind(out) -> str | None:
    """What a module's (abstract) output is when it is not one array, for a message."""
    if isinstance(out, jax.ShapeDtypeStruct):
        return None
    return f"a {type(out).__name__}" if isinstance(out, (tuple, list, dict)) else f"{type(out).__name__!r}"


def from_flax(module: nn.Module, example_input: ArrayLike, *, loss: str | Callable = "cross_entropy",
              num_classes: int | None = None, name: str | None = None, train_arg: str | None = "auto") -> Model:
    """A :class:`Model` from any Flax (linen) module.

    Args:
      module: the module; ``module.apply(params, x)`` maps a batch to outputs.
      example_input: one example batch ``(n, ...)`` (or its shape) to initialise with.
      loss: ``"cross_entropy"`` (a classifier: integer labels, the module outputs one
        logit per class), ``"squared_error"`` / ``"mse"`` (regression: float targets),
        or a callable ``loss(outputs, y) -> (n,)`` per-sample losses.
      num_classes: the classes of a classifier (default: the module's output width);
        ignored for regression losses. A custom loss counts as a classifier only if
        ``num_classes`` is given (accuracy is then reported too).
      name: a description for the results (default: the module's class name).
      train_arg: the flag that switches training on, an argument of ``module.__call__``
        or an attribute of the module. ``"auto"`` (default) takes ``train``, ``training``,
        ``is_training`` or ``deterministic`` when ``__call__`` (else the module) has one.
        Local SGD then runs the module in training mode (``train=True`` /
        ``deterministic=False``, with a fresh ``"dropout"`` key every mini-batch), and every
        evaluation (losses, downloads, consensus energies, accuracy) in evaluation mode.
        ``None`` leaves the flag as it is everywhere. A flag of another name is set to
        ``True`` for training and ``False`` for evaluation.

    Only the ``"params"`` collection is supported: a module with mutable collections
    (BatchNorm's ``batch_stats``) is refused, as is one that draws random numbers when
    evaluated, one without parameters, and (with a built-in loss) one whose output is
    not a single array.
    """
    x = jnp.zeros(example_input, jnp.float32) if isinstance(example_input, tuple) else jnp.asarray(example_input)
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"example_input must be a batch (n, ...) with n >= 1, got shape {x.shape}")
    mod = type(module).__name__
    flag, is_field = _train_flag(module, train_arg)
    eval_kw: dict[str, Any] = {} if flag is None else {flag: not _TRAIN_FLAGS.get(flag, True)}
    train_kw: dict[str, Any] = {} if flag is None else {flag: _TRAIN_FLAGS.get(flag, True)}
    train_module = module
    if is_field:  # a flag held by the module: one clone evaluates, the other trains
        module, train_module = module.clone(**eval_kw), module.clone(**train_kw)
        eval_kw, train_kw = {}, {}
    call_params = _call_parameters(module) or {}
    missing = [k for k, q in list(call_params.items())[1:] if q.default is inspect.Parameter.empty
               and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) and k not in eval_kw]
    if missing:
        raise ValueError(f"{mod}.__call__ needs the arguments {missing} besides the inputs; a model is called as "
                         f"apply(params, x): give them defaults (a training flag is found by its name: "
                         f"{sorted(_TRAIN_FLAGS)}, or from_flax(..., train_arg=...))")
    variables = jax.eval_shape(lambda k: module.init(k, x, **eval_kw), jax.random.key(0))
    extra = sorted(set(variables) - {"params"})
    if extra:
        hint = (" (BatchNorm's running statistics): they are not supported, since every agent's model is one "
                "parameter pytree trained by a pure loss; use a normalisation without state, nn.LayerNorm or "
                "nn.GroupNorm" if "batch_stats" in extra else "")
        raise ValueError(f"{mod} has mutable collections {extra}{hint}; only modules whose variables are 'params' "
                         f"are supported")
    if not jax.tree_util.tree_leaves(variables):
        raise ValueError(f"{mod} has no parameters: there is nothing for the algorithms to train or average")
    apply = functools.partial(module.apply, **eval_kw) if eval_kw else module.apply
    try:
        out = jax.eval_shape(apply, variables, x)
    except flax.errors.InvalidRngError as err:
        how = "" if flag is None else f" with {flag}={not _TRAIN_FLAGS.get(flag, True)}"
        raise ValueError(f"{mod} draws random numbers when evaluated{how} ({err}); a model's evaluation must be "
                         f"deterministic: give Dropout deterministic=not train and __call__ a flag train: bool "
                         f"(local SGD sets train=True and passes a 'dropout' key)") from None
    train_apply = None
    if flag is not None:
        def train_apply(params, xb, key):
            return train_module.apply(params, xb, rngs={"dropout": key}, **train_kw)
        try:
            jax.eval_shape(train_apply, variables, x, jax.random.key(0))
        except flax.errors.InvalidRngError as err:
            raise ValueError(f"{mod} with {flag}={_TRAIN_FLAGS.get(flag, True)} draws from an rng stream other than "
                             f"'dropout' ({err}); local SGD provides only a 'dropout' key") from None
    kind = _output_kind(out)
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)} or a callable, got {loss!r}")
        if kind is not None:
            raise ValueError(f"{mod} outputs {kind}, not one array; loss={loss!r} needs one array of outputs: pass a "
                             f"loss of your own, loss(outputs, y) -> (n,), or make the module return one array")
        if loss == "cross_entropy":
            if out.ndim != 2:
                hint = (f" for example_input of shape {x.shape} (if that is the stacked (N, n_max, ...) data, give "
                        f"one batch of samples, such as data.x[0, :1])" if x.ndim > 2 and out.ndim > 2 else "")
                if out.ndim == 1:  # one sample without its batch axis: (classes,) logits
                    hint = (f" for example_input of shape {x.shape}: give a batch of samples, (n, ...), such as "
                            f"x[None] for one sample or xs[0][:1]")
                raise ValueError(f"a cross-entropy classifier must output (n, classes) logits; {mod} "
                                 f"outputs {out.shape}{hint}")
            num_classes = out.shape[-1] if num_classes is None else num_classes
            if num_classes != out.shape[-1]:
                raise ValueError(f"num_classes={num_classes} but the module outputs {out.shape[-1]} logits")
            if num_classes < 2:  # softmax over one logit: the loss is 0 and its gradient too, nothing trains
                raise ValueError(f"{mod} outputs {out.shape[-1]} logit: a cross-entropy classifier needs one logit "
                                 f"per class, at least 2 (for two classes, nn.Dense(2)); a single output with "
                                 f"a loss of your own, loss(outputs, y) -> (n,), for a sigmoid")
        else:
            num_classes = None
        loss_fn = LOSSES[loss]
    elif callable(loss):
        loss_fn = loss
        if num_classes is not None and (kind is not None or out.shape[1:] != (num_classes,)):
            # accuracy takes the argmax of the outputs: they must be (n, classes) logits
            what = kind if kind is not None else f"shape {out.shape}"
            raise ValueError(f"num_classes={num_classes} makes {mod} a classifier (accuracy is its outputs' argmax), "
                             f"but it outputs {what}, not (n, {num_classes}) logits; leave num_classes out")
    else:
        raise ValueError(f"loss must be a name or a callable, got {loss!r}")
    return Model(init=lambda key: module.init(key, x, **eval_kw), apply=apply, name=name or mod,
                 num_classes=num_classes, loss=loss_fn, train_apply=train_apply)


def mlp_mnist(hidden: tuple[int, ...] = (200,), num_classes: int = 10, input_shape=(28, 28)) -> Model:
    """The FedCBO paper's MNIST model, MLP 784-200-10 (ReLU, biases)."""
    module = MLP(hidden=tuple(hidden), num_classes=num_classes)
    dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
    name = "mlp-" + "-".join(str(v) for v in (int(jnp.prod(jnp.asarray(input_shape))), *hidden, num_classes))
    return Model(init=lambda key: module.init(key, dummy), apply=module.apply, name=name, num_classes=num_classes)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: ``logits = x W + b`` on flattened float inputs.

    The FedProx synthetic(α, β) benchmark's model (FedSGLD paper §6). Inputs keep
    their floating dtype (no ``uint8`` scaling); ``zero_init`` starts from ``W = 0,
    b = 0``, the usual start for this convex problem.
    """

    num_classes: int = 10
    zero_init: bool = True

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.float32)
        init = nn.initializers.zeros if self.zero_init else nn.initializers.lecun_normal()
        return nn.Dense(self.num_classes, kernel_init=init, bias_init=nn.initializers.zeros)(x)


def logistic_regression(num_features: int = 60, num_classes: int = 10, zero_init: bool = True) -> Model:
    """Multinomial logistic regression ``num_features -> num_classes`` (60 -> 10 for synthetic(α, β))."""
    module = LogisticRegression(num_classes=num_classes, zero_init=zero_init)
    dummy = jnp.zeros((1, num_features), jnp.float32)
    return Model(init=lambda key: module.init(key, dummy), apply=module.apply, name=f"logreg-{num_features}-{num_classes}",
                 num_classes=num_classes)


class CNN(nn.Module):
    """The FedCB²O paper's CNN (§3.5): conv 32 (5×5) → max-pool 2 →
    conv 64 (5×5) → max-pool 2 → dense 2048 → dense ``num_classes``, ReLU, ``SAME``
    padding (28×28 inputs give 7·7·64 = 3136 features before the dense layers)."""

    num_classes: int = 47
    features: tuple[int, ...] = (32, 64)  # the two convolutions' channels
    hidden: int = 2048

    @nn.compact
    def __call__(self, x):
        x = preprocess(x)
        if x.ndim == 3:  # (n, H, W) grey images -> one channel
            x = x[..., None]
        for f in self.features:
            x = nn.relu(nn.Conv(f, (5, 5), padding="SAME")(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_classes)(x)


def cnn_emnist(num_classes: int = 47, input_shape=(28, 28), features: tuple[int, int] = (32, 64),
               hidden: int = 2048) -> Model:
    """The FedCB²O CNN (47 classes for EMNIST-balanced; 10 for the MNIST analogue)."""
    module = CNN(num_classes=num_classes, features=tuple(features), hidden=hidden)
    dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
    name = f"cnn-{features[0]}-{features[1]}-{hidden}-{num_classes}"
    return Model(init=lambda key: module.init(key, dummy), apply=module.apply, name=name, num_classes=num_classes)


def cnn(input_shape: tuple[int, ...] = (28, 28), num_classes: int = 10, features: tuple[int, int] = (32, 64),
        hidden: int = 512) -> Model:
    """The small CNN of federated averaging for the standard image sets, any input shape.

    McMahan, Moore, Ramage, Hampson and Agüera y Arcas, "Communication-efficient learning of
    deep networks from decentralized data", AISTATS 2017, §3 ("CNN"): conv 32 (5×5) →
    max-pool 2 → conv 64 (5×5) → max-pool 2 → dense 512 → dense ``num_classes``, ReLU
    (:class:`CNN`, ``SAME`` padding): 1,663,370 parameters on 28×28 grey images with 10
    classes, as that paper counts, 2,156,490 on CIFAR-10's 32×32×3.

    Args:
      input_shape: one image, ``(H, W)`` grey or ``(H, W, C)`` colour (``uint8`` pixels are
        scaled to ``[0, 1]``).
      num_classes: the classes (the logits' width).
      features: the two convolutions' channels.
      hidden: the width of the dense layer.
    """
    shape = tuple(int(v) for v in input_shape)
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise ValueError(f"input_shape must be one image, (H, W) or (H, W, C), got {input_shape!r}")
    num_classes = _checks.positive_int("num_classes", num_classes)
    module = CNN(num_classes=num_classes, features=tuple(features), hidden=hidden)
    dummy = jnp.zeros((1,) + shape, jnp.float32)
    name = f"cnn-{'x'.join(str(v) for v in shape)}-{features[0]}-{features[1]}-{hidden}-{num_classes}"
    return Model(init=lambda key: module.init(key, dummy), apply=module.apply, name=name, num_classes=num_classes)


def init_population(model: Model, key: jax.Array, num_agents: int) -> PyTree:
    """``num_agents`` (an integer ``>= 1``) independently initialised parameter sets, stacked on axis 0.

    ``key`` is one PRNG key or an integer seed (``jax.random.key(seed)``)."""
    num_agents = _checks.positive_int("init_population: num_agents", num_agents)
    key = _checks.as_key("init_population: key", key)
    if jnp.shape(key) != (() if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else jnp.shape(key)[-1:]):
        raise ValueError(f"init_population: key must be one PRNG key, got a batch of keys of shape {jnp.shape(key)}; "
                         f"the agents' keys are split from it")
    return jax.vmap(model.init)(jax.random.split(key, num_agents))


def zero_padding(a: PyTree, mask: jax.Array) -> PyTree:
    """``a`` (arrays with a leading row axis) with the rows where ``mask`` is ``False`` set to 0.

    Padding rows may hold anything (NaN included: they are not data); masking their loss
    with ``jnp.where`` hides them from the value but not from the gradient, where the zero
    cotangent meets their non-finite partials (``0 · NaN``). Zeroed first, they are finite.
    Integer arrays (labels) pass through.
    """
    def zero(leaf):
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            return leaf
        m = mask.reshape(mask.shape + (1,) * (leaf.ndim - mask.ndim))
        return jnp.where(m, leaf, jnp.zeros((), leaf.dtype))

    return jax.tree_util.tree_map(zero, a)


def _sample_losses(model: Model, params: PyTree, x, y, key: jax.Array | None = None) -> jax.Array:
    """The ``(n,)`` per-sample losses of a batch; a ``ValueError`` for a loss of any other shape."""
    out = model.train_apply(params, x, key) if key is not None and model.train_apply is not None else \
        model.apply(params, x)
    per = jnp.asarray(model.loss(out, y))
    lead = [jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(x) if jnp.ndim(leaf)]
    n = lead[0] if lead else None
    if n is not None and per.shape != (n,):
        # (n, 1) would broadcast against the (n,) mask to (n, n); a scalar mean counts the padding rows
        raise ValueError(f"the loss of model {model.name} gives shape {per.shape} for {n} samples, not one loss per "
                         f"sample ({n},): loss(outputs, y) must return per-sample losses")
    return per


def masked_loss(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None, *,
                key: jax.Array | None = None) -> jax.Array:
    """Mean per-sample loss over the real samples of a padded batch.

    ``mask`` (bool ``(n,)``) marks the real samples; ``None`` means all. Padding rows
    never contribute, to the value or to its gradient, even when they hold NaN
    (:func:`zero_padding`); an all-padding batch gives 0.
    The one loss every algorithm uses (local training, download evaluation, IFCA's
    cluster estimates, FedSGLD's node objective). ``key`` (local SGD's) runs a model
    with a ``train_apply`` in training mode (dropout); without it the model is evaluated.
    A low-precision loss (bfloat16, float16) is averaged in float32.
    """
    if mask is not None:
        x, y = zero_padding(x, mask), zero_padding(y, mask)
    per = _sample_losses(model, params, x, y, key)
    if jnp.issubdtype(per.dtype, jnp.floating) and jnp.finfo(per.dtype).bits < 32:
        per = per.astype(jnp.float32)
    if mask is None:
        return jnp.mean(per)
    return jnp.sum(jnp.where(mask, per, 0.0)) / jnp.maximum(jnp.sum(mask), 1).astype(per.dtype)


def batch_loss(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None, *,
               key: jax.Array | None = None) -> jax.Array:
    """Alias of :func:`masked_loss` (the mean loss over a batch's real samples)."""
    return masked_loss(model, params, x, y, mask, key=key)


def accuracy(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Share of correctly classified real samples."""
    hit = (jnp.argmax(model.apply(params, x), axis=-1) == y).astype(jnp.float32)
    if mask is None:
        return jnp.mean(hit)
    mask = mask.astype(jnp.float32)
    return jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
