"""The FedProx synthetic(α, β) federated benchmark, stacked for vmapped agents.

Recipe (Li et al., "Federated optimization in heterogeneous networks", 2020; the FedSGLD
paper's experiment, its §6.0.1). For each of ``N = 30`` devices ``k``, with
``d = 60`` features and ``C = 10`` classes:

* ``u_k ~ N(0, α)`` and ``B_k ~ N(0, β)`` (α and β are standard deviations);
* ``W_k ~ N(u_k, 1)`` of shape ``d × C`` and ``b_k ~ N(u_k, 1)`` of shape ``C``;
* ``v_k ~ N(B_k, 1)`` per feature, and ``x ~ N(v_k, Σ)`` with ``Σ = diag(j^-1.2)``,
  ``j = 1..d``;
* ``y = argmax(x W_k + b_k)``;
* ``n_k = int(lognormal(4, 2)) + 50`` samples, shuffled and split 90 / 10 into the
  device's training and test sets (``int(0.9 n_k)`` training samples).

α controls how much the local models differ between devices, β how much the local
input distributions differ. The IID variant (``iid=True``) draws one ``W, b ~ N(0, 1)``
shared by every device and the same input distribution ``x ~ N(0, Σ)`` everywhere.

Generation is NumPy with one seeded ``Generator``, so a seed fixes the data
bit-for-bit. The device sizes are log-normal (a few devices hold most samples), so the
arrays are padded to the largest device and carry ``counts``; the masks are derived.
:class:`SyntheticData` is a sibling of :class:`cbo_jax.federated.data.FederatedData`:
the training side is the same ``(N, n_max, ...)`` layout (``agent_data()`` gives the
algorithms' :class:`~cbo_jax.federated.algorithms.base.AgentData`), but every device
has its own test set of its own size, so the test side is padded per device as well
instead of one test set per cluster.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cbo_jax import _checks

__all__ = ["SyntheticData", "synthetic", "NUM_DEVICES", "NUM_FEATURES", "NUM_CLASSES"]

NUM_DEVICES = 30
NUM_FEATURES = 60
NUM_CLASSES = 10


class SyntheticData(NamedTuple):
    """Per-device train and test sets, padded and stacked on the device axis.

    Attributes:
      x: ``(N, n_max, d)`` float32 training inputs (padding rows are zero).
      y: ``(N, n_max)`` int32 training labels (padding rows hold 0).
      counts: ``(N,)`` training samples of each device.
      test_x: ``(N, t_max, d)`` float32 test inputs.
      test_y: ``(N, t_max)`` int32 test labels.
      test_counts: ``(N,)`` test samples of each device.
      W, b: ``(N, d, C)`` and ``(N, C)``: each device's true labelling model.
    """

    x: np.ndarray
    y: np.ndarray
    counts: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    test_counts: np.ndarray
    W: np.ndarray
    b: np.ndarray

    @property
    def num_agents(self) -> int:
        return int(self.x.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """``(N, n_max)`` boolean: ``True`` on real training samples."""
        return np.arange(self.x.shape[1])[None, :] < self.counts[:, None]

    @property
    def test_mask(self) -> np.ndarray:
        """``(N, t_max)`` boolean: ``True`` on real test samples."""
        return np.arange(self.test_x.shape[1])[None, :] < self.test_counts[:, None]

    def agent_data(self):
        """The training side as the algorithms see it (an ``AgentData`` of JAX arrays)."""
        return self.federated().train

    def federated(self):
        """As a :class:`~cbo_jax.federated.data.FederatedData`: one test set per device."""
        from cbo_jax.federated.data import FederatedData

        return FederatedData(self.x, self.y, self.counts, None, self.test_x, self.test_y, self.test_counts,
                             np.arange(self.num_agents, dtype=np.int32))


def _stack(parts: list[np.ndarray], width: int, dtype) -> np.ndarray:
    out = np.zeros((len(parts), width) + parts[0].shape[1:], dtype)
    for k, p in enumerate(parts):
        out[k, : len(p)] = p
    return out


def synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    iid: bool = False,
    num_devices: int = NUM_DEVICES,
    num_features: int = NUM_FEATURES,
    num_classes: int = NUM_CLASSES,
    train_fraction: float = 0.9,
    max_samples: int | None = None,
    seed: int = 0,
) -> SyntheticData:
    """Generate synthetic(α, β) (or its IID variant) with a seeded NumPy generator.

    Args:
      alpha: std of ``u_k`` (model heterogeneity, ``>= 0`` and within float32's range, the
        data's dtype); ignored when ``iid``.
      beta: std of ``B_k`` (input heterogeneity); ignored when ``iid``.
      iid: the IID variant: one shared ``W, b ~ N(0, 1)`` and ``x ~ N(0, Σ)`` everywhere.
      num_devices, num_features, num_classes: 30, 60, 10 in the benchmark.
      train_fraction: share of each device's shuffled samples used for training
        (``int(train_fraction · n_k)``; 0.9 in the benchmark).
      max_samples: if given, cap every ``n_k`` at this value *after* drawing it (not part
        of the benchmark; bounds the padding for quick tests). The sizes are the same
        draws as without the cap, but a capped device draws fewer samples, so every
        device after the first capped one (and its ``W_k``, ``b_k``) differs from the
        uncapped data: capped data are not a subset of the uncapped data.
      seed: the generator's seed (an integer >= 0).
    """
    a = _checks.non_negative("alpha", alpha, f32=True)
    b_std = _checks.non_negative("beta", beta, f32=True)
    if not isinstance(iid, (bool, np.bool_)):
        raise ValueError(f"iid must be a bool, got {iid!r}")
    _checks.seed("seed", seed)
    n_dev = _checks.positive_int("num_devices", num_devices)
    d = _checks.positive_int("num_features", num_features)
    c = _checks.positive_int("num_classes", num_classes)
    frac = _checks.fraction("train_fraction", train_fraction)
    if frac >= 1:
        raise ValueError(f"train_fraction must lie in (0, 1) so that every device has a test set, got {train_fraction!r}")
    if max_samples is not None:
        _checks.positive_int("max_samples", max_samples)
        if int(frac * max_samples) < 1 or max_samples - int(frac * max_samples) < 1:
            raise ValueError(f"max_samples={max_samples} leaves a device without training or test samples")
    rng = np.random.default_rng(seed)

    sizes = rng.lognormal(4.0, 2.0, n_dev).astype(np.int64) + 50
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    n_train = (frac * sizes).astype(np.int64)  # int(frac · n_k), as the split below
    short = np.flatnonzero((n_train < 1) | (sizes - n_train < 1))
    if short.size:
        raise ValueError(f"train_fraction={train_fraction} leaves devices {short[:10].tolist()} (of "
                         f"{int(sizes[short[0]])} samples) without training or test samples")
    sigma_diag = np.arange(1, d + 1, dtype=np.float64) ** -1.2
    if iid:
        u = np.zeros(n_dev)
        v = np.zeros((n_dev, d))
        W_shared = rng.normal(0.0, 1.0, (d, c))
        b_shared = rng.normal(0.0, 1.0, c)
    else:
        u = rng.normal(0.0, a, n_dev)
        B = rng.normal(0.0, b_std, n_dev)
        v = rng.normal(B[:, None], 1.0, (n_dev, d))

    xs_tr, ys_tr, xs_te, ys_te, Ws, bs = [], [], [], [], [], []
    for k in range(n_dev):
        if iid:
            W, bias = W_shared, b_shared
        else:
            W = rng.normal(u[k], 1.0, (d, c))
            bias = rng.normal(u[k], 1.0, c)
        # x ~ N(v_k, Σ) with diagonal Σ: independent coordinates with std j^-0.6.
        x = v[k] + rng.normal(0.0, 1.0, (sizes[k], d)) * np.sqrt(sigma_diag)
        y = np.argmax(x @ W + bias, axis=1)
        perm = rng.permutation(sizes[k])
        x, y = x[perm], y[perm]
        n_tr = int(frac * sizes[k])
        xs_tr.append(x[:n_tr]), ys_tr.append(y[:n_tr])
        xs_te.append(x[n_tr:]), ys_te.append(y[n_tr:])
        Ws.append(W), bs.append(bias)

    counts = np.array([len(t) for t in ys_tr], np.int32)
    test_counts = np.array([len(t) for t in ys_te], np.int32)
    return SyntheticData(
        x=_stack(xs_tr, int(counts.max()), np.float32),
        y=_stack(ys_tr, int(counts.max()), np.int32),
        counts=counts,
        test_x=_stack(xs_te, int(test_counts.max()), np.float32),
        test_y=_stack(ys_te, int(test_counts.max()), np.int32),
        test_counts=test_counts,
        W=np.stack(Ws).astype(np.float32),
        b=np.stack(bs).astype(np.float32),
    )
