"""Float64 NumPy references shared by the equation-level tests (federated/test_paper_equations.py
and the tests marked ``reference`` in federated/algorithms/)."""

from __future__ import annotations

import jax
import numpy as np


def f64(tree):
    """Every leaf of ``tree`` as a float64 NumPy array."""
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def _dense(params):
    p = params["params"]["Dense_0"]
    return np.asarray(p["kernel"], np.float64), np.asarray(p["bias"], np.float64)


def logreg_loss(params, x, y, count):
    """Float64 mean cross-entropy of ``logits = x W + b`` over the first ``count`` rows, for
    Flax's one-``Dense`` parameters ``{"params": {"Dense_0": ...}}``."""
    w, b = _dense(params)
    logits = np.asarray(x, np.float64)[:count] @ w + b
    top = logits.max(1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(1))
    return float(np.mean(lse - logits[np.arange(count), np.asarray(y)[:count]]))


def logreg_grad(params, x, y, count):
    """Float64 gradient of the mean cross-entropy of ``logits = x W + b`` over the first
    ``count`` rows, for Flax's one-``Dense`` parameters ``{"params": {"Dense_0": ...}}``."""
    w, b = _dense(params)
    x, y = np.asarray(x, np.float64)[:count], np.asarray(y)[:count]
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - np.eye(w.shape[1])[y]) / count
    return {"params": {"Dense_0": {"kernel": x.T @ d, "bias": d.sum(0)}}}
