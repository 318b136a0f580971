"""Non-IID partitions of a labelled data set among clients.

Every partitioner takes the labels (or, for the label-blind ones, the number of samples),
the number of clients and a seed, and returns one index array per client: client ``j``
holds the samples ``indices[j]`` of the data set. Every sample goes to at most one client;
the label-aware partitioners give every sample to some client. The results are seeded
(NumPy's ``default_rng``) and depend on nothing else.

* :func:`iid` -- a random equal split (the IID baseline).
* :func:`dirichlet` -- label skew: for every class, its samples are split among the
  clients in proportions drawn from ``Dirichlet(alpha, ..., alpha)`` (Hsu, Qi and Brown
  2019; the "Dir(α)" partition of NIID-Bench, Li et al. 2022). Small ``alpha``: a client
  holds few classes; large ``alpha``: close to IID.
* :func:`classes_per_client` -- label skew by count ("#C = k"): each client holds
  ``k`` classes, every class split equally among the clients that hold it.
* :func:`shards` -- the pathological split of McMahan et al. 2017: samples sorted by
  label, cut into ``num_clients * shards_per_client`` shards, each client given
  ``shards_per_client`` of them at random.
* :func:`quantity_skew` -- IID labels, client sizes in proportions drawn from
  ``Dirichlet(beta, ..., beta)``.

Feature skew by rotation is :func:`cbo_jax.federated.data.rotated_mnist` (its
``partition`` argument, ``parse("dirichlet:0.3")`` for example, partitions each rotation's
images with any of the above).
:func:`label_counts` and :func:`plot` show the label distribution per client;
:func:`parse` reads a command-line spec such as ``"dirichlet:0.3"``;
:func:`federated_data` builds a :class:`~cbo_jax.federated.data.FederatedData`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from cbo_jax import _checks
from cbo_jax.federated.data import FederatedData

__all__ = ["iid", "dirichlet", "classes_per_client", "shards", "quantity_skew", "label_counts", "coverage",
           "plot", "parse", "SPECS", "federated_data"]


def _labels(labels: Any) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one class label per sample, shape (n,); got shape {y.shape}")
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0):
        if np.issubdtype(y.dtype, np.bool_):
            return y.astype(np.int64)
        raise ValueError(f"labels must be integer class ids >= 0, got dtype {y.dtype}"
                         + (f" with minimum {y.min()}" if np.issubdtype(y.dtype, np.number) else ""))
    return y.astype(np.int64)


def _clients(num_clients: Any, n: int) -> int:
    k = _checks.positive_int("num_clients", num_clients)
    if k > n:
        raise ValueError(f"num_clients ({k}) is larger than the number of samples ({n}): every client needs one")
    return k


def _rng(seed: Any) -> np.random.Generator:
    _checks.seed("seed", seed)
    return np.random.default_rng(seed)


def _min_size(value: Any) -> int:
    if not _checks.is_integer(value) or int(value) < 0:
        raise ValueError(f"min_size must be an integer >= 0, got {value!r}")
    return int(value)


def _sorted(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, np.int64)) for p in parts]


def iid(num_samples: int, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """A random split of ``num_samples`` samples into ``num_clients`` parts whose sizes differ by at most one."""
    n = _checks.positive_int("num_samples", num_samples)
    k = _clients(num_clients, n)
    return _sorted(np.array_split(_rng(seed).permutation(n), k))


def dirichlet(labels: Any, num_clients: int, alpha: float, seed: int = 0, *, min_size: int = 1,
              max_tries: int = 100) -> list[np.ndarray]:
    """Label skew: each class's samples split among the clients in ``Dirichlet(alpha)`` proportions.

    Args:
      labels: ``(n,)`` integer class labels.
      num_clients: the clients.
      alpha: the concentration (> 0): 0.1 gives a client a few classes, 100 nearly all ten
        of MNIST in equal shares.
      seed: an integer >= 0.
      min_size: every client gets at least this many samples: the proportions are drawn
        again (up to ``max_tries`` times) until they do.
    """
    y = _labels(labels)
    k = _clients(num_clients, y.size)
    a = _checks.positive("alpha", alpha)
    min_size = _min_size(min_size)
    if min_size * k > y.size:
        raise ValueError(f"min_size={min_size} for {k} clients needs {min_size * k} samples; the labels hold {y.size}")
    rng = _rng(seed)
    classes = np.unique(y)
    for _ in range(max(1, int(max_tries))):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            p = rng.dirichlet(np.full(k, a))
            cuts = (np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for j, part in enumerate(np.split(idx, cuts)):
                parts[j].append(part)
        out = [np.concatenate(p) for p in parts]
        if min(o.size for o in out) >= min_size:
            return _sorted(out)
    raise ValueError(f"dirichlet(alpha={alpha}) gave some client fewer than min_size={min_size} samples in "
                     f"{max_tries} draws: lower min_size, raise alpha, or use fewer clients")


def classes_per_client(labels: Any, num_clients: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """Label skew by count: client ``j`` holds ``k`` classes, class ``j mod C`` and ``k - 1``
    others at random; every class's samples are split equally among the clients holding it
    (a class no client drew is given to one client at random)."""
    y = _labels(labels)
    n_clients = _clients(num_clients, y.size)
    classes = np.unique(y)
    c = classes.size
    kk = _checks.positive_int("k", k)
    if kk > c:
        raise ValueError(f"k={kk} classes per client, but the labels hold {c} classes")
    rng = _rng(seed)
    held = []
    for j in range(n_clients):
        first = j % c
        rest = rng.choice(np.delete(np.arange(c), first), kk - 1, replace=False)
        held.append(np.concatenate([[first], rest]).astype(np.int64))
    owners: list[list[int]] = [[] for _ in range(c)]
    for j, h in enumerate(held):
        for ci in h:
            owners[ci].append(j)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for ci in range(c):
        who = owners[ci] or [int(rng.integers(n_clients))]
        idx = rng.permutation(np.flatnonzero(y == classes[ci]))
        for j, part in zip(who, np.array_split(idx, len(who))):
            parts[j].append(part)
    return _sorted([np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts])


def shards(labels: Any, num_clients: int, shards_per_client: int = 2, seed: int = 0) -> list[np.ndarray]:
    """McMahan et al.'s pathological split: sort by label, cut into ``num_clients *
    shards_per_client`` equal shards, give each client ``shards_per_client`` at random."""
    y = _labels(labels)
    n_clients = _clients(num_clients, y.size)
    s = _checks.positive_int("shards_per_client", shards_per_client)
    total = n_clients * s
    if total > y.size:
        raise ValueError(f"{n_clients} clients x {s} shards = {total} shards, more than the {y.size} samples")
    rng = _rng(seed)
    order = np.argsort(y + rng.random(y.size) * 0.5, kind="stable")  # by label, random within a label
    pieces = np.array_split(order, total)
    pick = rng.permutation(total).reshape(n_clients, s)
    return _sorted([np.concatenate([pieces[i] for i in row]) for row in pick])


def quantity_skew(num_samples: int, num_clients: int, beta: float, seed: int = 0, *,
                  min_size: int = 1) -> list[np.ndarray]:
    """IID samples, client sizes in ``Dirichlet(beta)`` proportions (at least ``min_size`` each)."""
    n = _checks.positive_int("num_samples", num_samples)
    k = _clients(num_clients, n)
    b = _checks.positive("beta", beta)
    min_size = _min_size(min_size)
    if min_size * k > n:
        raise ValueError(f"min_size={min_size} for {k} clients needs {min_size * k} samples; there are {n}")
    rng = _rng(seed)
    p = rng.dirichlet(np.full(k, b))
    sizes = min_size + np.floor(p * (n - min_size * k)).astype(np.int64)
    sizes[np.argsort(-p)[: n - sizes.sum()]] += 1  # the remainder to the largest shares
    return _sorted(np.split(rng.permutation(n), np.cumsum(sizes)[:-1]))


def label_counts(labels: Any, parts: Sequence[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """``(clients, classes)`` sample counts of each class at each client."""
    y = _labels(labels)
    c = int(num_classes) if num_classes is not None else (int(y.max()) + 1 if y.size else 0)
    return np.stack([np.bincount(y[np.asarray(p, np.int64)], minlength=c)[:c] for p in parts]) if len(parts) else \
        np.zeros((0, c), np.int64)


def coverage(labels: Any, parts: Sequence[np.ndarray], share: float = 0.9) -> np.ndarray:
    """Per client, the fewest classes that hold ``share`` of its samples (a measure of label skew:
    1 for a client of one class, all of them for a balanced client)."""
    counts = label_counts(labels, parts).astype(np.float64)
    top = -np.sort(-counts, axis=1)
    frac = np.cumsum(top, axis=1) / np.maximum(counts.sum(1, keepdims=True), 1)
    return 1 + np.sum(frac < share - 1e-12, axis=1)


def plot(labels: Any, parts: Sequence[np.ndarray], path: str | None = None, ax=None, *, num_classes: int | None = None,
         title: str | None = None):
    """A stacked bar per client of its samples by class; saved to ``path`` when given. Returns the axes."""
    from cbo_jax.runtime.plotting import subplots

    counts = label_counts(labels, parts, num_classes)
    fig = None
    if ax is None:
        fig, ax = subplots(1, 1, figsize=(min(16, 3 + 0.12 * len(parts)), 4))
    bottom = np.zeros(len(parts))
    for c in range(counts.shape[1]):
        ax.bar(np.arange(len(parts)), counts[:, c], bottom=bottom, width=1.0, label=str(c))
        bottom += counts[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title(title or "label distribution per client")
    if counts.shape[1] <= 20:
        ax.legend(title="class", fontsize=7, ncol=2, loc="upper right")
    if fig is not None and path is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    return ax


SPECS = {"iid": "iid", "dirichlet": "dirichlet:ALPHA", "classes": "classes:K", "shards": "shards:S",
         "quantity": "quantity:BETA"}


def parse(spec: str) -> Callable[[np.ndarray, int, int], list[np.ndarray]]:
    """A partitioner ``(labels, num_clients, seed) -> indices`` from a spec: ``iid``,
    ``dirichlet:ALPHA``, ``classes:K``, ``shards:S`` or ``quantity:BETA``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a partition is one of {', '.join(SPECS.values())}; got {spec!r}")
    name, _, arg = spec.partition(":")
    if name not in SPECS:
        raise ValueError(f"unknown partition {name!r}: one of {', '.join(SPECS.values())}")
    if (name == "iid") != (arg == ""):
        raise ValueError(f"partition {spec!r}: write it as {SPECS[name]}")
    try:
        value = float(arg) if name in ("dirichlet", "quantity") else (int(arg) if arg else None)
    except ValueError:
        raise ValueError(f"partition {spec!r}: {arg!r} is not a number; write it as {SPECS[name]}") from None
    if name == "iid":
        return lambda y, n, seed: iid(len(y), n, seed)
    if name == "dirichlet":
        _checks.positive("dirichlet's ALPHA", value)
        return lambda y, n, seed: dirichlet(y, n, value, seed)
    if name == "classes":
        return lambda y, n, seed: classes_per_client(y, n, value, seed)
    if name == "shards":
        return lambda y, n, seed: shards(y, n, value, seed)
    _checks.positive("quantity's BETA", value)
    return lambda y, n, seed: quantity_skew(len(y), n, value, seed)


def federated_data(x: Any, y: Any, parts: Sequence[np.ndarray], test_x: Any = None, test_y: Any = None, *,
                   cluster: Any = None):
    """A :class:`~cbo_jax.federated.data.FederatedData` of the clients ``parts`` of ``(x, y)``
    (padded to the largest client), with one shared test set when given."""
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"x and y must have one entry per sample; got {len(x)} and {len(y)}")
    empty = [j for j, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(f"clients {empty[:5]}{'...' if len(empty) > 5 else ''} hold no sample; every client needs one")
    return FederatedData.from_lists([x[np.asarray(p, np.int64)] for p in parts],
                                    [y[np.asarray(p, np.int64)] for p in parts], cluster=cluster,
                                    test_x=test_x, test_y=test_y)
