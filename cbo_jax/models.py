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

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import optax

from cbo_jax import _checks

PyTree = Any

__all__ = ["MLP", "Model", "from_flax", "mlp_mnist", "init_population", "cross_entropy", "squared_error", "masked_loss",
           "batch_loss", "accuracy", "preprocess", "LogisticRegression", "logistic_regression", "CNN", "cnn_emnist",
           "LOSSES"]


def preprocess(x: jax.Array) -> jax.Array:
    """``uint8`` pixels to ``float32`` in ``[0, 1]`` (other dtypes pass through as float32)."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


class MLP(nn.Module):
    """Fully connected network with ReLU hidden layers and biases (FedCBO §1.3: 784-200-10)."""

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


class Model(NamedTuple):
    """A model for stacked agents.

    Attributes:
      init: ``init(key) -> params`` of one agent.
      apply: ``apply(params, x) -> outputs`` for a batch ``x`` of shape ``(n, ...)``.
      name: a short description (written to results).
      num_classes: classes of a classifier; ``None`` for a regression model (no accuracy).
      loss: ``loss(outputs, y) -> (n,)`` per-sample loss (default: cross-entropy).
    """

    init: Callable[[jax.Array], PyTree]
    apply: Callable[..., Any]  # apply(params, x) -> outputs (a Flax module's apply takes more keywords)
    name: str
    num_classes: int | None
    loss: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy

    @property
    def is_classifier(self) -> bool:
        return self.num_classes is not None


def from_flax(module: nn.Module, example_input: ArrayLike, *, loss: str | Callable = "cross_entropy",
              num_classes: int | None = None, name: str | None = None) -> Model:
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

    Modules with mutable collections (batch statistics) are not supported: the
    agents' parameters must be one pytree.
    """
    x = jnp.zeros(example_input, jnp.float32) if isinstance(example_input, tuple) else jnp.asarray(example_input)
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"example_input must be a batch (n, ...) with n >= 1, got shape {x.shape}")
    variables = jax.eval_shape(lambda k: module.init(k, x), jax.random.key(0))
    extra = sorted(set(variables) - {"params"})
    if extra:
        raise ValueError(f"{type(module).__name__} has mutable collections {extra}; only modules whose variables are "
                         f"'params' are supported")
    out = jax.eval_shape(module.apply, variables, x)
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)} or a callable, got {loss!r}")
        if loss == "cross_entropy":
            if out.ndim != 2:
                hint = (f" for example_input of shape {x.shape} (if that is the stacked (N, n_max, ...) data, give "
                        f"one batch of samples, such as data.x[0, :1])" if x.ndim > 2 and out.ndim > 2 else "")
                raise ValueError(f"a cross-entropy classifier must output (n, classes) logits; {type(module).__name__} "
                                 f"outputs {out.shape}{hint}")
            num_classes = out.shape[-1] if num_classes is None else num_classes
            if num_classes != out.shape[-1]:
                raise ValueError(f"num_classes={num_classes} but the module outputs {out.shape[-1]} logits")
        else:
            num_classes = None
        loss_fn = LOSSES[loss]
    elif callable(loss):
        loss_fn = loss
    else:
        raise ValueError(f"loss must be a name or a callable, got {loss!r}")
    return Model(init=lambda key: module.init(key, x), apply=module.apply, name=name or type(module).__name__,
                 num_classes=num_classes, loss=loss_fn)


def mlp_mnist(hidden: tuple[int, ...] = (200,), num_classes: int = 10, input_shape=(28, 28)) -> Model:
    """The FedCBO paper's MNIST model, MLP 784-200-10 (ReLU, biases)."""
    module = MLP(hidden=tuple(hidden), num_classes=num_classes)
    dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
    name = "mlp-" + "-".join(str(v) for v in (int(jnp.prod(jnp.asarray(input_shape))), *hidden, num_classes))
    return Model(init=lambda key: module.init(key, dummy), apply=module.apply, name=name, num_classes=num_classes)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: ``logits = x W + b`` on flattened float inputs.

    The FedProx synthetic(α, β) benchmark's model (REFERENCE_NOTES §3). Inputs keep
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
    """The FedCB²O paper's CNN (REFERENCE_NOTES §2.2): conv 32 (5×5) → max-pool 2 →
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


def init_population(model: Model, key: jax.Array, num_agents: int) -> PyTree:
    """``num_agents`` (an integer ``>= 1``) independently initialised parameter sets, stacked on axis 0."""
    num_agents = _checks.positive_int("init_population: num_agents", num_agents)
    return jax.vmap(model.init)(jax.random.split(key, num_agents))


def masked_loss(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean per-sample loss over the real samples of a padded batch.

    ``mask`` (bool ``(n,)``) marks the real samples; ``None`` means all. Padding rows
    never contribute, even when their loss is not finite; an all-padding batch gives 0.
    The one loss every algorithm uses (local training, download evaluation, IFCA's
    cluster estimates, FedSGLD's node objective).
    """
    per = model.loss(model.apply(params, x), y)
    if mask is None:
        return jnp.mean(per)
    return jnp.sum(jnp.where(mask, per, 0.0)) / jnp.maximum(jnp.sum(mask), 1).astype(per.dtype)


def batch_loss(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Alias of :func:`masked_loss` (the mean loss over a batch's real samples)."""
    return masked_loss(model, params, x, y, mask)


def accuracy(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Share of correctly classified real samples."""
    hit = (jnp.argmax(model.apply(params, x), axis=-1) == y).astype(jnp.float32)
    if mask is None:
        return jnp.mean(hit)
    mask = mask.astype(jnp.float32)
    return jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
