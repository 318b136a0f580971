"""Host-side checks of federated training and test data, before anything is compiled.

:func:`~cbo_jax.federated.data.check_training` (one group of agents' training data and,
given a model, that the model fits it), :func:`~cbo_jax.federated.data.check_model` (the
model probed with ``jax.eval_shape``), :func:`~cbo_jax.federated.data.check_labels` (class
ids within the model's classes), ``check_test_sets`` and ``check_numeric``. Each raises a
``ValueError`` naming the first problem. Public path: :mod:`cbo_jax.federated.data`, which
re-exports them; :meth:`~cbo_jax.federated.data.FederatedData.check` and
:func:`cbo_jax.federated.run` call them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax.models import Model, squared_error


def check_numeric(name: str, a: Any) -> None:
    """Refuse an array that is not boolean, integer or real floating: a complex array (JAX's
    float models would drop the imaginary part without a word) or an object array (a ragged
    list, or mixed types: JAX's "Error interpreting argument")."""
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(a).dtype
        except ValueError:  # a ragged nested list (NumPy >= 1.24)
            dtype = np.dtype(object)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise ValueError(f"{name} is complex ({dtype}); the models take real numbers and would drop the imaginary "
                         f"part: pass the real and imaginary parts as separate features (np.stack([a.real, a.imag], "
                         f"-1))")
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer) or dtype == bool):
        raise ValueError(f"{name} has dtype {dtype}, not a number type: pass one numeric array (a ragged or "
                         f"mixed-type list gives dtype object; FederatedData.from_lists stacks agents of different "
                         f"sizes)")


def check_test_sets(test_x: Any, test_y: Any, test_counts: Any, sample_shape: tuple, label_shape: tuple | None = None
                    ) -> None:
    """Refuse test sets that are not ``(T, n_test) + sample_shape`` with labels ``(T, n_test)``
    (``+ label_shape`` where given), or ``test_counts`` that are not one integer per set, or
    that are not real numbers (:func:`check_numeric`)."""
    check_numeric("test_x", test_x)
    check_numeric("test_y", test_y)
    tx, ty = np.shape(test_x), np.shape(test_y)
    if (len(tx) < 2 or tx[2:] != tuple(sample_shape) or ty[:2] != tx[:2]
            or (label_shape is not None and ty[2:] != tuple(label_shape))):
        labels = "(T, n_test)" + ("" if label_shape is None else f" + {tuple(label_shape)}")
        raise ValueError(f"test sets must be (T, n_test) + the samples' shape {tuple(sample_shape)} with labels "
                         f"{labels}; got test_x {tx}, test_y {ty}")
    if test_counts is not None and (np.shape(test_counts) != tx[:1]
                                    or not np.issubdtype(np.asarray(test_counts).dtype, np.integer)):
        raise ValueError(f"test_counts must hold integer counts, one per test set ({tx[0]}), got "
                         f"{np.asarray(test_counts)}")


def check_labels(y: Any, counts: Any, num_classes: int, name: str = "y", *, model: str = "", unit: str = "agent",
                 first: int = 0) -> None:
    """Refuse integer labels outside ``[0, num_classes)`` among the real samples (host, cheap).

    ``y``: ``(N, n_max)`` labels, ``counts``: ``(N,)`` real samples of each row (``None``:
    all), the rows numbered from ``first`` (an agent's index in its population). The
    ``ValueError`` names ``name``, the first offending ``unit`` and its label. Labels that
    are not integers are left to the caller (:meth:`FederatedData.check` refuses them for a
    classifier). :func:`cbo_jax.federated.run` calls this at the start of every run.
    """
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.integer) or y.ndim < 2 or not y.size:
        return
    bad = (y < 0) | (y >= num_classes)
    if counts is not None:
        real = np.arange(y.shape[1])[None, :] < np.asarray(counts)[:, None]
        bad &= real.reshape(real.shape + (1,) * (y.ndim - 2))
    if bad.any():
        j, i = (int(v) for v in np.argwhere(bad)[0][:2])
        rows = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))
        more = f"; {rows.size} {unit}s hold such labels" if rows.size > 1 else ""
        raise ValueError(f"{name} holds labels outside [0, {num_classes}) for {model or 'the model'}: {unit} "
                         f"{first + j} has label {y[j, i].item()} (sample {i}){more}")


_BOOL_HINT = "; booleans: pass test_y.astype(int) (FederatedData.from_arrays converts them)"


def _field(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_training(x: Any, y: Any, counts: Any, valid: Any = None, *, model: Model | None = None, prefix: str = "",
                   first: int = 0) -> None:
    """Validate one group of agents' training data on the host; ``ValueError`` naming the first problem.

    ``x``/``y``: ``(N, n_max, ...)`` inputs and labels or targets, ``counts``: ``(N,)`` real
    samples of each agent, ``valid``: ``(N,)`` the real agents (``None``: all; inactive
    padding agents hold no samples). Checks the shapes, that ``counts`` are integers in
    ``[1, n_max]`` for every real agent, that inputs and targets are real numbers
    (:func:`check_numeric`) and, where floating, finite on the real samples (naming the agent
    and the sample), and, given a ``model``, that it takes
    the inputs and that its output and per-sample loss fit the labels
    (:func:`check_model`, abstract: nothing is compiled) and, for a classifier, that the
    labels lie in ``[0, classes)``. ``prefix`` names the group in the messages
    (``"benign"``: ``benign.y``), ``first`` is the index of its first agent.
    :func:`cbo_jax.federated.run` calls this at the start of every run.
    """
    xn, yn, cn = _field(prefix, "x"), _field(prefix, "y"), _field(prefix, "counts")
    check_numeric(xn, x)
    check_numeric(yn, y)
    xs, ys = tuple(np.shape(x)), tuple(np.shape(y))
    if len(xs) < 2 or ys[:2] != xs[:2]:
        raise ValueError(f"{xn} must be (N, n_max, ...) and {yn} (N, n_max, ...) with the same first two axes; got "
                         f"{xn} {xs} and {yn} {ys}")
    n, n_max = xs[:2]
    c = np.asarray(counts)
    if c.shape != (n,) or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"{cn} must hold one integer per agent ({n}), got shape {c.shape} ({c.dtype})")
    if not n:
        return
    real = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    empty = np.flatnonzero(real & (c < 1))
    if empty.size:
        raise ValueError(f"agents {(first + empty[:10]).tolist()} have no samples ({cn} < 1); every agent needs "
                         f"data")
    if c.max() > n_max:
        raise ValueError(f"{cn} up to {int(c.max())} exceed the padded size n_max={n_max}")
    mask = (np.arange(n_max)[None, :] < c[:, None]) & real[:, None]
    for name, a, what in ((xn, x, "inputs"), (yn, y, "targets")):
        if jnp.issubdtype(a.dtype, jnp.floating):
            bad = ~np.isfinite(np.asarray(a)).reshape(n, n_max, -1).all(axis=2) & mask
            if bad.any():
                j, i = (int(v) for v in np.argwhere(bad)[0])
                raise ValueError(f"the training {what} {name} hold NaN or infinite values: agent {first + j}, "
                                 f"sample {i}")
    if model is not None:
        check_model(model, x, y, x_name=xn, y_name=yn)
        if model.num_classes is not None:  # a classifier
            check_labels(y, np.where(real, c, 0), model.num_classes, yn, model=f"model {model.name}", first=first)


def check_model(model: Model, x: Any, y: Any, *, x_name: str = "x", y_name: str = "y") -> None:
    """Probe ``model`` against training data ``(N, n_max, ...)`` of ``x``'s and ``y``'s shapes and
    dtypes (arrays or ``jax.ShapeDtypeStruct``) with ``jax.eval_shape``: nothing is compiled.

    A ``ValueError`` names the problem when the model cannot take the inputs, when a
    classifier does not output one logit per class or its labels are not integer class
    ids ``(N, n_max)``, when a squared-error model's output does not match the targets,
    or when the loss does not give one loss per sample.
    """
    x_shape, y_shape = tuple(np.shape(x))[2:], tuple(np.shape(y))[2:]
    y_dtype = np.dtype(y.dtype)
    params = jax.eval_shape(model.init, jax.random.key(0))
    try:
        out = jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((1,) + x_shape, x.dtype))
    except Exception as err:  # noqa: BLE001 - reported with the shapes involved
        raise ValueError(f"model {model.name} cannot take inputs of shape {x_shape} ({x_name}): {err}") from None
    if model.is_classifier:
        if out.shape != (1, model.num_classes):
            raise ValueError(f"model {model.name} outputs {out.shape[1:]} per sample but is a {model.num_classes}-class "
                             f"classifier")
        if not np.issubdtype(y_dtype, np.integer) or y_shape:
            hint = ""
            if y_shape == (model.num_classes,):
                hint = f"; one-hot labels: pass their class ids, {y_name}.argmax(-1)"
            elif y_shape == (1,):
                hint = f"; a column of labels: pass {y_name}[..., 0]"
            elif np.issubdtype(y_dtype, np.floating):
                hint = f"; class ids stored as floats: pass {y_name}.astype(int)"
            elif y_dtype == np.bool_:
                hint = f"; booleans: pass {y_name}.astype(int) (FederatedData.from_arrays converts them)"
            raise ValueError(f"a classifier needs integer labels of shape (N, n_max), got {y_dtype} "
                             f"{tuple(np.shape(y))} ({y_name} of model {model.name}){hint}")
        return
    # A batch of 3, not 1: with one sample, (1, 2) outputs broadcast against (1,) targets.
    b = 3
    if model.loss is squared_error and out.shape[1:] != y_shape and not (out.shape[1:] == (1,) and y_shape == ()):
        # squared_error broadcasts, e.g. (n, 3) outputs against (n, 1) targets or (n,) against (n, 1)
        raise ValueError(f"model {model.name} outputs {out.shape[1:]} per sample, but the squared error needs "
                         f"targets of the same shape; got targets of shape {y_shape} ({y_name})")
    try:
        out_b = jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((b,) + x_shape, x.dtype))
        loss = jax.eval_shape(model.loss, out_b, jax.ShapeDtypeStruct((b,) + y_shape, y_dtype))
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"model {model.name} outputs {out.shape[1:]} per sample, which its loss cannot compare "
                         f"with targets of shape {y_shape} ({y_name}): {err}") from None
    if loss.shape != (b,):
        # (n, 1) would broadcast against the (n,) sample mask to (n, n); a scalar mean would count the padding rows
        raise ValueError(f"the loss of model {model.name} gives shape {loss.shape} for {b} samples, not one loss per "
                         f"sample ({b},)")
