"""Models as pure ``init``/``apply`` pairs that vmap over stacked parameters.

A :class:`Model` wraps a Flax module: ``init(key)`` returns one agent's parameters,
``apply(params, x)`` the logits of a batch; :func:`init_population` stacks ``N``
independently initialised agents (the FedCBO reference code initialises agents
independently) so that every algorithm works on a population of models.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

PyTree = Any

__all__ = ["MLP", "Model", "mlp_mnist", "init_population", "cross_entropy", "batch_loss", "accuracy", "preprocess",
           "LogisticRegression", "logistic_regression", "CNN", "cnn_emnist"]


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


class Model(NamedTuple):
    """Pure pair: ``init(key) -> params``, ``apply(params, x) -> logits``."""

    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    name: str
    num_classes: int


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
    features: tuple[int, int] = (32, 64)
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
    """``num_agents`` independently initialised parameter sets, stacked on axis 0."""
    return jax.vmap(model.init)(jax.random.split(key, num_agents))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample softmax cross-entropy."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def batch_loss(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy over the real samples of a batch (``mask`` marks them)."""
    per = cross_entropy(model.apply(params, x), y)
    if mask is None:
        return jnp.mean(per)
    mask = mask.astype(per.dtype)
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def accuracy(model: Model, params: PyTree, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Share of correctly classified real samples."""
    hit = (jnp.argmax(model.apply(params, x), axis=-1) == y).astype(jnp.float32)
    if mask is None:
        return jnp.mean(hit)
    mask = mask.astype(jnp.float32)
    return jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
