"""Federated data: every agent's samples stacked on a leading agent axis.

Two containers:

* :class:`AgentData` -- what an algorithm's round sees: ``(N, n_max, ...)`` inputs and
  labels padded to the largest agent, ``counts`` (real samples per agent) and ``valid``
  (real agents; ``False`` on the inactive padding agents a sharded run appends, see
  :mod:`cbo_jax.federated.padding`). Selection, averaging and metrics respect both.
* :class:`FederatedData` -- a whole benchmark on the host: the training side, test sets,
  which test set each agent is measured on, and optionally the true cluster ids. The
  cluster ids are for metrics only: no algorithm ever receives them.

Test sets come in three layouts, told apart by ``test_of`` (agent -> test set): one per
cluster (rotated MNIST: agent ``j`` is tested on its cluster's set), one per agent
(synthetic(α, β)), or one shared by all agents. Build any of them from arrays or from
per-agent lists with :meth:`FederatedData.from_arrays` / :meth:`FederatedData.from_lists`;
:meth:`FederatedData.check` validates shapes, counts, labels and the model's output
shape on the host, before anything is compiled.

:func:`rotated_mnist` builds the rotated-MNIST benchmark of the FedCBO paper
(§2.4, Table 1): ``K`` clusters, cluster ``k`` sees every image rotated by its
own multiple of 90°, ``N`` agents split evenly over the clusters, each cluster's rotated
training set randomly partitioned among its agents, and the cluster's test set is the
whole test set rotated the same way. It takes any image set of
:mod:`cbo_jax.federated.datasets` as well, colour images included (rotated CIFAR-10 with
``K = 2``, 0° and 180°, is the benchmark of IFCA: Ghosh, Chung, Yin and Ramchandran, "An
efficient framework for clustered federated learning", NeurIPS 2020, its rotated-CIFAR
experiment).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
# The host-side checks (their own module, _data_checks; importable from here too, as runner does)
from cbo_jax.federated._data_checks import (_BOOL_HINT, _field, check_labels, check_model, check_numeric,  # noqa: F401
                                            check_test_sets, check_training)
from cbo_jax.federated.mnist import MNIST, DataError
from cbo_jax.population import resize_rows

__all__ = ["AgentData", "FederatedData", "ROTATIONS", "check_labels", "check_model", "check_training", "rotated_mnist",
           "rotate"]

# Rotation (degrees, counter-clockwise) of each cluster for K = 1, 2, 4. K = 2 uses the
# two upright-symmetric angles 0° and 180°, as the FedCB²O experiment does.
ROTATIONS = {1: (0,), 2: (0, 180), 4: (0, 90, 180, 270)}


class AgentData(NamedTuple):
    """The agents' training data as an algorithm's round sees it (a pytree of arrays).

    Attributes:
      x: ``(N, n_max, ...)`` inputs, padded with zeros after each agent's ``counts[j]`` samples.
      y: ``(N, n_max, ...)`` labels or targets (padding rows hold 0).
      counts: ``(N,)`` real samples of each agent.
      valid: ``(N,)`` bool, the real agents (``None``: all of them).
    """

    x: Any
    y: Any
    counts: Any
    valid: Any = None

    @property
    def num_agents(self) -> int:
        return int(np.shape(self.counts)[0])

    @property
    def agent_mask(self) -> jax.Array:
        """``(N,)`` bool: the real agents."""
        if self.valid is None:
            return jnp.ones(np.shape(self.counts), bool)
        return jnp.asarray(self.valid)

    @property
    def sample_mask(self) -> jax.Array:
        """``(N, n_max)`` bool: the real samples."""
        return jnp.arange(np.shape(self.x)[1])[None, :] < jnp.asarray(self.counts)[:, None]

    def pad(self, size: int) -> "AgentData":
        """``size - N`` inactive padding agents appended: no samples, ``valid`` False."""
        return resize_rows(self._replace(valid=self.agent_mask), size)

    def __repr__(self) -> str:  # shapes, not the images (thousands of numbers at a prompt)
        from cbo_jax.runtime import display as _repr

        return f"AgentData({self.num_agents} agents; {_repr.fields(self._asdict())})"


class FederatedData(NamedTuple):
    """A federated benchmark on the host (NumPy arrays).

    Attributes:
      x, y, counts: the training side (see :class:`AgentData`).
      cluster: ``(N,)`` true cluster ids (metrics only), or ``None``.
      test_x: ``(T, n_test, ...)`` test sets (``None``: no test data).
      test_y: ``(T, n_test, ...)``.
      test_counts: ``(T,)`` real samples of each test set (``None``: all ``n_test``).
      test_of: ``(N,)`` the test set of each agent (``None``: see :meth:`test_index`).
    """

    x: np.ndarray
    y: np.ndarray
    counts: np.ndarray
    cluster: np.ndarray | None = None
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    test_counts: np.ndarray | None = None
    test_of: np.ndarray | None = None

    @property
    def num_agents(self) -> int:
        return int(np.shape(self.x)[0])

    @property
    def num_clusters(self) -> int | None:
        """``max id + 1`` of the true cluster ids (``None`` when the data has none). Ids are
        indices (of the per-cluster test sets, of the per-cluster metrics): an id no agent
        has, such as the 1 of ``{0, 2}``, counts."""
        return None if self.cluster is None else int(np.max(self.cluster)) + 1

    @property
    def num_test_sets(self) -> int:
        return 0 if self.test_x is None else int(np.shape(self.test_x)[0])

    @property
    def mask(self) -> np.ndarray:
        """``(N, n_max)`` boolean: ``True`` on real samples, ``False`` on padding."""
        return np.arange(self.x.shape[1])[None, :] < np.asarray(self.counts)[:, None]

    @property
    def train(self) -> AgentData:
        """The training side as device arrays, what the algorithms' rounds take."""
        return AgentData(jnp.asarray(self.x), jnp.asarray(self.y), jnp.asarray(self.counts, jnp.int32))

    def __repr__(self) -> str:  # counts and shapes, not the images (thousands of numbers at a prompt)
        from cbo_jax.runtime import display as _repr

        head = [f"{self.num_agents} agents"]
        try:
            head.append(f"{int(np.sum(self.counts)):,} training samples")
        except Exception:  # counts that are not concrete numbers
            pass
        if self.cluster is not None:
            head.append(f"{self.num_clusters} clusters")
        head.append(f"{self.num_test_sets} test sets")
        return f"FederatedData({', '.join(head)};\n    {_repr.fields(self._asdict())})"

    def test_index(self) -> np.ndarray:
        """``(N,)``: which test set agent ``j`` is measured on.

        ``test_of`` when given; otherwise the only test set, the agent's cluster (one
        test set per cluster), or the agent's own (one test set per agent). As many test sets
        as clusters and agents, with agent ``j`` not in cluster ``j``, is refused: pass ``test_of``.
        """
        t, n = self.num_test_sets, self.num_agents
        if self.test_of is not None:  # refused when fractional or negative, not truncated
            return _checks.cluster_ids("test_of", self.test_of)
        if t == 1:
            return np.zeros(n, np.int32)
        if self.cluster is not None and t == self.num_clusters:
            by_cluster = np.asarray(self.cluster, np.int32)
            if t == n and not np.array_equal(by_cluster, np.arange(n)):  # one per cluster, or one per agent?
                raise ValueError(f"cannot tell whether the {t} test sets are one per cluster or one per agent (there "
                                 f"are {n} agents in {t} clusters, and the readings differ): pass test_of "
                                 f"(test_of=cluster, or test_of=range({n}))")
            return by_cluster
        if t == n:
            return np.arange(n, dtype=np.int32)
        raise ValueError(f"cannot tell which of the {t} test sets each of the {n} agents uses: pass test_of")

    def check_test_shapes(self) -> None:
        """The test sets against the training samples' shapes, and integer ``test_counts``
        (what :func:`~cbo_jax.federated.metrics.test_accuracy` checks when it is built)."""
        if self.test_x is not None and self.test_y is not None:
            check_test_sets(self.test_x, self.test_y, self.test_counts, np.shape(self.x)[2:], np.shape(self.y)[2:])

    @classmethod
    def from_arrays(cls, x, y, *, counts=None, cluster=None, test_x=None, test_y=None, test_counts=None,
                    test_of=None) -> "FederatedData":
        """From stacked arrays ``(N, n, ...)``; ``counts`` default to ``n`` for every agent.

        ``test_x``/``test_y`` may be one shared test set ``(n_test, ...)`` (a leading
        axis of 1 is added) or stacked test sets ``(T, n_test, ...)``.
        """
        if isinstance(x, (list, tuple)) and len({np.shape(a) for a in x}) > 1:  # NumPy: "inhomogeneous shape"
            raise ValueError(f"x is a list of per-agent arrays of different shapes ({sorted({np.shape(a) for a in x})[:3]}"
                             f" ...): from_arrays takes arrays stacked (N, n, ...); FederatedData.from_lists(xs, ys) "
                             f"stacks and pads per-agent arrays of unequal sizes")
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim < 2:
            raise ValueError(f"x must be (N, n_samples, ...) stacked per agent, got shape {x.shape}")
        counts = np.full(x.shape[0], x.shape[1], np.int32) if counts is None else np.asarray(counts)
        if cluster is not None and np.shape(cluster) != (x.shape[0],):
            raise ValueError(f"cluster must have one entry per agent ({x.shape[0]}), got shape {np.shape(cluster)}")
        if (test_x is None) != (test_y is None):
            raise ValueError("give both test_x and test_y, or neither")
        if test_x is not None:
            test_x, test_y = np.asarray(test_x), np.asarray(test_y)
            if test_x.ndim == x.ndim - 1:  # one shared test set
                test_x, test_y = test_x[None], test_y[None]
        return cls(x, _labels(y), counts, None if cluster is None else np.asarray(cluster), test_x,
                   None if test_y is None else _labels(test_y), None if test_counts is None else np.asarray(test_counts),
                   None if test_of is None else np.asarray(test_of))

    @classmethod
    def from_lists(cls, xs: Sequence, ys: Sequence, cluster=None, test_x=None, test_y=None, *,
                   test_of=None) -> "FederatedData":
        """Stack per-agent arrays of unequal sizes, padding with zeros.

        Args:
          xs, ys: one array of inputs ``(n_j, ...)`` and one of targets ``(n_j, ...)`` (or
            ``(n_j,)`` class labels) per agent ``j``.
          cluster: optional ``(N,)`` integer cluster id of every agent: the ground truth
            that the clustering metrics (:mod:`~cbo_jax.federated.metrics`) and the
            per-cluster test sets use; the algorithms never see it.
          test_x, test_y: stacked test sets ``(T, n_test, ...)``, one shared set
            ``(n_test, ...)``, or lists of per-set arrays of unequal sizes (padded, with
            ``test_counts``).
          test_of: optional ``(N,)`` integers, the test set each agent is scored on. Without
            it (:meth:`test_index`): the one test set; agent ``j``'s cluster's when there is
            one test set per cluster; agent ``j``'s own when there is one per agent (as many
            sets as clusters and agents, with the two readings different: pass it).
        """
        if len(xs) != len(ys):
            raise ValueError(f"xs and ys must have one entry per agent; got {len(xs)} and {len(ys)}")
        if cluster is not None and len(cluster) != len(xs):
            raise ValueError(f"cluster must have one entry per agent ({len(xs)}), got {len(cluster)}")
        x, y, counts = _stack_pairs(xs, ys, ("xs", "ys"), "agent")
        test_counts = None
        if isinstance(test_x, (list, tuple)):
            if not isinstance(test_y, (list, tuple)) or len(test_y) != len(test_x):
                raise ValueError(f"test_x is a list of {len(test_x)} test sets: test_y must be a list of as many")
            test_x, test_y, test_counts = _stack_pairs(test_x, test_y, ("test_x", "test_y"), "test set")
        return cls.from_arrays(x, y, counts=counts, cluster=cluster, test_x=test_x, test_y=test_y,
                               test_counts=test_counts, test_of=test_of)

    def check(self, model=None) -> "FederatedData":
        """Validate on the host; raise ``ValueError`` naming the first problem found.

        Shapes of the training side and the test sets, one real sample at least per
        agent, counts within the padded size, finite inputs and float targets (training
        and test), cluster ids and integer ``test_of`` of the right length and range,
        integer labels (training and test) within ``[0, classes)`` and,
        given a ``model``, that its output fits the labels (before any compilation).
        """
        x, y, counts = np.asarray(self.x), np.asarray(self.y), np.asarray(self.counts)
        check_training(x, y, counts, model=model)  # with the model: its probe and the training labels' range
        n = x.shape[0]
        if self.cluster is not None:
            c = np.asarray(self.cluster)
            if c.shape != (n,) or not np.issubdtype(c.dtype, np.integer) or (c.size and c.min() < 0):
                raise ValueError(f"cluster must hold one integer id >= 0 per agent ({n}), got {c.shape} {c.dtype}")
        if self.test_x is not None:
            tx, ty = np.asarray(self.test_x), np.asarray(self.test_y)
            self.check_test_shapes()
            if self.test_counts is not None:
                tc = np.asarray(self.test_counts)
                if (tc.shape != (tx.shape[0],) or not np.issubdtype(tc.dtype, np.integer) or tc.min(initial=1) < 1
                        or tc.max(initial=0) > tx.shape[1]):
                    raise ValueError(f"test_counts must hold one integer count in [1, {tx.shape[1]}] per test set, "
                                     f"got {tc}")
            if self.test_of is not None and not np.issubdtype(np.asarray(self.test_of).dtype, np.integer):
                raise ValueError(f"test_of must hold integer test-set indices, got {np.asarray(self.test_of).dtype}")
            real = (np.arange(tx.shape[1])[None, :] < np.asarray(self.test_counts)[:, None]
                    if self.test_counts is not None else np.ones(tx.shape[:2], bool))
            if np.issubdtype(tx.dtype, np.floating) and not np.all(np.isfinite(tx[real])):
                raise ValueError("the test inputs test_x hold NaN or infinite values")
            if np.issubdtype(ty.dtype, np.floating) and not np.all(np.isfinite(ty[real])):
                raise ValueError("the test targets test_y hold NaN or infinite values")
            idx = self.test_index()
            if idx.shape != (n,) or idx.min(initial=0) < 0 or idx.max(initial=0) >= tx.shape[0]:
                raise ValueError(f"test_of must map each of the {n} agents to one of the {tx.shape[0]} test sets")
        if model is not None and model.num_classes is not None and self.test_y is not None:  # a classifier
            test_y = np.asarray(self.test_y)
            if not np.issubdtype(test_y.dtype, np.integer):
                raise ValueError(f"a classifier needs integer test labels test_y, got {test_y.dtype}"
                                 + (_BOOL_HINT if test_y.dtype == np.bool_ else ""))
            check_labels(test_y, None if self.test_counts is None else np.asarray(self.test_counts),
                         model.num_classes, "test_y", model=f"model {model.name}", unit="test set")
        return self


def _labels(y: np.ndarray) -> np.ndarray:
    # Booleans (binary labels such as ``x[:, 0] > 0``) are the class ids 0 and 1.
    return y.astype(np.int32) if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_ else y


def _stack_pairs(xs: Sequence, ys: Sequence, names: tuple[str, str], what: str):
    """Inputs and labels, one pair per agent (or test set), each checked and padded: ``(x, y, counts)``."""
    for j, (xj, yj) in enumerate(zip(xs, ys)):
        if len(xj) != len(yj):
            raise ValueError(f"{what} {j} has {len(xj)} inputs but {len(yj)} labels")
    x, counts = _stack(xs, names[0])
    y, _ = _stack(ys, names[1])
    return x, y, counts


def _stack(parts: Sequence, name: str = "parts") -> tuple[np.ndarray, np.ndarray]:
    parts = [np.asarray(p) for p in parts]
    if not parts:
        raise ValueError(f"{name} is empty: give one array per agent (or test set)")
    for j, p in enumerate(parts):
        if p.ndim < 1 or p.shape[1:] != parts[0].shape[1:]:
            raise ValueError(f"{name}[{j}] has shape {p.shape}, but {name}[0] has {parts[0].shape}: every entry must "
                             f"be (n_samples,) + the same per-sample shape")
    counts = np.array([len(p) for p in parts], np.int32)
    # The common dtype of all parts (not the first one's: an integer first agent would
    # truncate every other agent's float inputs or targets).
    out = np.zeros((len(parts), int(counts.max(initial=0))) + parts[0].shape[1:], np.result_type(*parts))
    for j, p in enumerate(parts):
        out[j, : len(p)] = p
    return out, counts


def _check_seed(seed: Any) -> int:
    """The seed of a random partition: an integer >= 0 (``None`` would draw a partition no seed reproduces)."""
    if not _checks.is_integer(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _check_source(mnist: MNIST, rotations: Sequence[int]) -> None:
    """``DataError`` for a source whose images are not ``(n, H, W)`` or ``(n, H, W, C)``, whose labels
    do not pair up with its images one to one, or whose images are not square when ``rotations`` hold
    quarter turns."""
    for split in ("train", "test"):
        images = np.asarray(getattr(mnist, f"{split}_images"))
        labels = np.asarray(getattr(mnist, f"{split}_labels"))
        if images.ndim not in (3, 4):
            raise DataError(f"{split} images must be (n, H, W), got shape {images.shape} ({mnist.source}); colour "
                            f"images (n, H, W, C)")
        if labels.shape != images.shape[:1]:
            raise DataError(f"the source ({mnist.source}) has {images.shape[0]} {split} images but {split} labels of "
                            f"shape {labels.shape}")
        h, w = images.shape[1:3]
        if h != w and any(r % 180 for r in rotations):
            raise DataError(f"{split} images are {h}x{w}: rotations by {list(rotations)} degrees need square images "
                            f"({mnist.source})")


def rotate(images: np.ndarray, degrees: int) -> np.ndarray:
    """Rotate ``(n, H, W)`` (or colour ``(n, H, W, C)``) images counter-clockwise by a multiple of 90°."""
    if degrees % 90:
        raise ValueError(f"rotation must be a multiple of 90 degrees, got {degrees}")
    return np.rot90(images, k=(degrees // 90) % 4, axes=(1, 2))


def rotated_mnist(
    mnist: MNIST,
    num_agents: int,
    num_clusters: int = 4,
    samples_per_agent: int | None = None,
    seed: int = 0,
    subset: int | None = None,
    partition: Callable[[np.ndarray, int, int], Sequence[np.ndarray]] | None = None,
) -> FederatedData:
    """The rotated-MNIST clustered benchmark (FedCBO paper, Table 1 setting), of any image set.

    Args:
      mnist: the source data (any loader of :mod:`cbo_jax.federated.mnist`, or another image
        set from :func:`cbo_jax.federated.datasets.load_dataset`: grey ``(n, H, W)`` or colour
        ``(n, H, W, C)`` images, square for quarter turns; rotated CIFAR-10 with ``K = 2`` is
        the IFCA paper's benchmark).
      num_agents: ``N``; must be a multiple of ``num_clusters``.
      num_clusters: ``K`` in ``{1, 2, 4}``; rotations are ``ROTATIONS[K]``.
      samples_per_agent: images per agent; default (``None``) partitions the whole
        training set, ``n_train // (N / K)`` each (200 for the paper's N = 1200).
      seed: seed of the random partition (an integer >= 0).
      subset: the FedCBO reference script's protocol instead of the paper's: one random
        subset of ``subset`` training images (6,000 in the script), shared by every
        rotation, from which each agent draws its ``samples_per_agent`` images with
        replacement.
      partition: label skew within each rotation, a partitioner ``(labels, num_clients, seed)
        -> indices`` such as ``fl.partition.parse("dirichlet:0.3")``: each cluster's
        ``N/K · samples_per_agent`` images are split among its agents by it (unequal sizes,
        padded) instead of ``samples_per_agent`` each at random; ``None`` (default): the
        paper's equal split.

    Returns a :class:`FederatedData` whose agents ``k·N/K .. (k+1)·N/K - 1`` form
    cluster ``k`` (the algorithms never see this order or the ids), with one test set
    per cluster. Raises ``ValueError`` for arguments the source cannot satisfy (more
    agents per cluster than training images, without ``subset``) and ``DataError`` for a
    source whose images and labels do not pair up.
    """
    n = _checks.positive_int("num_agents", num_agents)
    # is_integer first: 4.0 and True are dictionary keys of ROTATIONS too (4.0 would fail later, True become K = 1)
    if not _checks.is_integer(num_clusters) or num_clusters not in ROTATIONS:
        raise ValueError(f"num_clusters (rotation count) must be one of {sorted(ROTATIONS)}, got {num_clusters!r}")
    num_clusters = int(num_clusters)
    if n % num_clusters:
        raise ValueError(f"num_agents ({n}) must be divisible by num_clusters ({num_clusters})")
    _check_seed(seed)
    _check_source(mnist, ROTATIONS[num_clusters])
    per_cluster = n // num_clusters
    n_train = len(mnist.train_images)
    if subset is None and per_cluster > n_train:
        raise ValueError(f"num_agents={n} puts {per_cluster} agents in each of the {num_clusters} clusters, but the "
                         f"source ({mnist.source}) has {n_train} training images: every agent needs at least one")
    max_per_agent = n_train // per_cluster
    if subset is not None:
        _checks.positive_int("subset", subset)
        if subset > n_train:
            raise ValueError(f"subset={subset} is larger than the source's {n_train} training images")
        if samples_per_agent is None:
            raise ValueError("subset needs samples_per_agent (images each agent draws from it)")
    if samples_per_agent is None:
        samples_per_agent = max_per_agent
    _checks.positive_int("samples_per_agent", samples_per_agent)
    if subset is None and samples_per_agent > max_per_agent:
        fits = n_train // samples_per_agent * num_clusters
        fewer = f"; num_agents <= {fits} (at {samples_per_agent} images each)" if fits >= num_clusters else ""
        full = 60000  # MNIST's training set
        whole = (f"; the whole MNIST training set ({full} images: source 'idx' with the IDX files' directory, or "
                 f"$CBO_JAX_DATA_DIR)" if mnist.source == "bundled" and samples_per_agent * per_cluster <= full else "")
        raise ValueError(
            f"samples_per_agent={samples_per_agent} needs {samples_per_agent * per_cluster} training images per "
            f"cluster, but the source ({mnist.source}) has {n_train}. Options: samples_per_agent <= {max_per_agent} "
            f"(for {n} agents){fewer}{whole}; or subset=S, every "
            f"agent drawing its images from one shared subset of S images (the reference script's protocol)"
        )
    split = partition
    if split is not None:
        if not callable(split):
            raise ValueError(f"partition must be a partitioner (labels, num_clients, seed) -> indices, such as "
                             f"fl.partition.parse('dirichlet:0.3'); got {partition!r}")
        if subset is not None:
            raise ValueError("partition and subset are two protocols: give one of them")
    rng = np.random.default_rng(seed)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    cluster: list[int] = []
    test_x: list[np.ndarray] = []
    test_y: list[np.ndarray] = []
    shared = rng.choice(n_train, subset, replace=False) if subset is not None else None
    for k, degrees in enumerate(ROTATIONS[num_clusters]):
        rotated = rotate(mnist.train_images, degrees)
        if shared is not None:
            perm = shared[rng.integers(0, subset, (per_cluster, samples_per_agent))]
        else:
            perm = rng.permutation(n_train)[: samples_per_agent * per_cluster].reshape(per_cluster, samples_per_agent)
        rows: Sequence[np.ndarray] = list(perm)
        if split is not None:  # the same images, split by the partitioner (its own seed per cluster)
            flat = perm.ravel()
            parts = split(mnist.train_labels[flat], per_cluster, int(np.random.default_rng([seed, 3, k]).integers(2**31)))
            rows = [flat[q] for q in parts]
        xs.extend(rotated[q] for q in rows)
        ys.extend(mnist.train_labels[q] for q in rows)
        cluster.extend([k] * per_cluster)
        test_x.append(rotate(mnist.test_images, degrees))
        test_y.append(mnist.test_labels)
    if split is not None:
        empty = [j for j, a in enumerate(xs) if len(a) == 0]
        if empty:
            raise ValueError(f"the partition left agents {empty[:5]} without images; use fewer agents or more "
                             f"samples_per_agent")
        return FederatedData.from_lists(xs, [a.astype(np.int32) for a in ys], cluster=np.asarray(cluster, np.int32),
                                        test_x=np.stack(test_x), test_y=np.stack(test_y).astype(np.int32))
    return FederatedData(
        x=np.stack(xs),
        y=np.stack(ys).astype(np.int32),
        counts=np.full(n, samples_per_agent, np.int32),
        cluster=np.asarray(cluster, np.int32),
        test_x=np.stack(test_x),
        test_y=np.stack(test_y).astype(np.int32),
    )
