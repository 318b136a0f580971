"""Label-flipping attacks on clustered federated learning (FedCB²O paper §3.1, §3.5).

Data. :func:`label_flip_rotated` builds the paper's attacked benchmark from any
MNIST-like source: ``K`` clusters (rotations, ``ROTATIONS[K]``); in cluster ``k``,
``benign_counts[k]`` benign agents with ``benign_samples`` images each, split into
a training set and a validation set of ``val_samples``, and ``malicious_counts[k]``
malicious agents with ``malicious_samples`` images each whose labels are flipped
``source → target`` (:func:`flip_labels`; nothing else changes). As in the paper, every
cluster rotates the same random subset of the training images (``shared_images``); within
a cluster all agents' images are disjoint (a random partition of that subset); each
cluster's test set is the whole rotated test set.

Agent order: benign agents first (cluster by cluster), then malicious agents (cluster by
cluster). The benign agents' algorithm never reads the order, the cluster ids or the
malicious mask; selection is invariant under relabelling the agents. Attackers do read
them: in the paper's threat model they know the clusters and each other.

Attacker strategy (:func:`attacker_selection`, :func:`attacker_average`): every round an
attacker downloads the other attackers of its cluster first, fills its budget of ``M``
with benign agents of its cluster drawn uniformly at random, and replaces its model by
the average of its own and the downloaded models weighted by training-set size. Then it
trains locally on its flipped data, as every agent trains on its own.

Local training of groups of unequal size (:func:`grouped_local_train`) trains each
contiguous group (benign training sets of 400, malicious sets of 1200) with its own
padding, so no agent pays for another group's larger data set. Inactive padding agents
of a sharded run go after the attackers (:meth:`AttackData.pad`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax import population as pop
from cbo_jax.federated.data import ROTATIONS, AgentData, _check_seed, _check_source, rotate
from cbo_jax.federated.local import LocalResult, LocalSGDConfig, local_train
from cbo_jax.federated.mnist import MNIST, DataError

PyTree = Any

__all__ = ["LabelFlipConfig", "AttackDataset", "AttackData", "flip_labels", "label_flip_rotated", "check_split",
           "attacker_selection",
           "attacker_average", "grouped_local_train", "MNIST_SOURCE", "MNIST_TARGET"]

# Offline MNIST analogue of the paper's 'O' → '0': a 7 flipped to a 1. The two digits
# share the long stroke (a 7 is a 1 with a bar on top), stay look-alikes under the 180°
# rotation of the second cluster, and are both frequent classes (6265 and 6742 training
# images, 1028 and 1135 test images).
MNIST_SOURCE, MNIST_TARGET = 7, 1


def _per_cluster(name: str, value, k: int, allow_zero: bool) -> tuple[int, ...]:
    vals = (value,) * k if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else tuple(value)
    if len(vals) != k:
        raise ValueError(f"{name} must be an integer or one integer per cluster (num_clusters = {k}), got {value!r}")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if allow_zero else 1):
            raise ValueError(f"{name} must hold integers >= {0 if allow_zero else 1}, got {value!r}")
    return tuple(int(v) for v in vals)


@dataclasses.dataclass(frozen=True)
class LabelFlipConfig:
    """The attacked benchmark (defaults: the paper's per-cluster sizes, MNIST's 7 → 1).

    Attributes:
      source, target: the flipped class and what it is flipped to (``source != target``).
      num_classes: classes of the data set (10 for MNIST, 47 for EMNIST-balanced).
      num_clusters: ``K`` in ``{1, 2, 4}`` (rotations ``ROTATIONS[K]``; the paper: 2).
      benign_per_cluster, malicious_per_cluster: agents per cluster (an integer, or one
        per cluster); the paper: 35 and 15.
      benign_samples: images per benign agent (paper: 500), of which ``val_samples``
        (paper: 100) form its validation set.
      malicious_samples: images per malicious agent (paper: 1200).
      flip_fraction: the share of an attacker's ``source`` images it flips (paper: 1, every
        one); below 1, each is flipped with this probability, drawn from a stream of the
        seed's own, so the partition is the one of a full flip.
      shared_images: ``True`` (the paper, its reference code): one random subset of the
        training images, as many as the largest cluster needs, is rotated for every
        cluster, and each cluster partitions it among its agents afresh; ``False``: every
        cluster draws its own subset (the benchmark before 2026-11-27, which the recorded
        small-scale results used).
    """

    source: int = MNIST_SOURCE
    target: int = MNIST_TARGET
    num_classes: int = 10
    num_clusters: int = 2
    benign_per_cluster: int | tuple[int, ...] = 35
    malicious_per_cluster: int | tuple[int, ...] = 15
    benign_samples: int = 500
    val_samples: int = 100
    malicious_samples: int = 1200
    shared_images: bool = True
    flip_fraction: float = 1.0

    def __post_init__(self):
        check_types(self)
        _checks.fraction("flip_fraction", self.flip_fraction)
        _checks.positive_int("num_classes", self.num_classes)
        for name in ("source", "target"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < self.num_classes:
                raise ValueError(f"{name} must be a class label in 0..num_classes - 1 = 0..{self.num_classes - 1}, "
                                 f"got {v!r}")
        if self.source == self.target:
            raise ValueError(f"source and target must differ, got {self.source} for both")
        _checks.one_of("num_clusters", self.num_clusters, tuple(ROTATIONS))
        # Checked here and kept as given, so that replace(cfg, num_clusters=4) works on integers.
        _ = self.benign_counts, self.malicious_counts
        _checks.positive_int("benign_samples", self.benign_samples)
        _checks.positive_int("val_samples", self.val_samples)
        if self.val_samples >= self.benign_samples:
            raise ValueError(f"val_samples ({self.val_samples}) must be < benign_samples ({self.benign_samples})")
        _checks.positive_int("malicious_samples", self.malicious_samples)

    @property
    def benign_counts(self) -> tuple[int, ...]:
        """Benign agents of each cluster (``benign_per_cluster`` expanded to ``num_clusters``)."""
        return _per_cluster("benign_per_cluster", self.benign_per_cluster, self.num_clusters, False)

    @property
    def malicious_counts(self) -> tuple[int, ...]:
        """Malicious agents of each cluster (``malicious_per_cluster`` expanded to ``num_clusters``)."""
        return _per_cluster("malicious_per_cluster", self.malicious_per_cluster, self.num_clusters, True)

    @property
    def images_per_cluster(self) -> tuple[int, ...]:
        return tuple(b * self.benign_samples + m * self.malicious_samples
                     for b, m in zip(self.benign_counts, self.malicious_counts))


def flip_labels(y, source: int, target: int):
    """Label flipping: every ``source`` label becomes ``target``; all others unchanged."""
    xp = jnp if isinstance(y, jax.Array) else np
    return xp.where(y == source, target, y).astype(y.dtype)


class AttackData(NamedTuple):
    """What the round functions see (a pytree of arrays): three groups of agents.

    Attributes:
      benign: the benign agents' training splits ``(N_b, n_train, ...)``.
      val: the benign agents' validation splits ``(N_b, n_val, ...)``.
      malicious: the malicious agents' (flipped, or for Oracle Max clean) data; no
        agents for Oracle Min.
    """

    benign: AgentData
    val: AgentData
    malicious: AgentData

    @property
    def num_agents(self) -> int:
        return self.benign.num_agents + self.malicious.num_agents

    @classmethod
    def from_lists(cls, train_x, train_y, val_x, val_y, malicious_x=(), malicious_y=()) -> "AttackData":
        """Your own data for FedCB²O (and DFedAvgM): per-agent arrays of unequal sizes,
        zero-padded as :meth:`~cbo_jax.federated.data.FederatedData.from_lists` does.

        ``train_x``/``train_y``: the benign agents' training splits; ``val_x``/``val_y``:
        their validation splits, one per benign agent in the same order (FedCB²O weighs
        downloads by losses on them); ``malicious_x``/``malicious_y``: the attackers' data
        as they train on it (poisoned already), none for a run without attackers. The
        agents are the benign ones, then the attackers: build the algorithm with
        ``malicious = [False] * len(train_x) + [True] * len(malicious_x)``.
        """
        from cbo_jax.federated.data import _stack_pairs

        if len(train_x) != len(train_y) or len(val_x) != len(val_y) or len(malicious_x) != len(malicious_y):
            raise ValueError(f"inputs and labels must pair up: {len(train_x)}/{len(train_y)} training, "
                             f"{len(val_x)}/{len(val_y)} validation, {len(malicious_x)}/{len(malicious_y)} attackers' "
                             "arrays")
        if len(val_x) != len(train_x):
            raise ValueError(f"every benign agent needs a validation split: {len(train_x)} training splits, "
                             f"{len(val_x)} validation splits")

        def group(xs, ys, what):
            x, y, counts = _stack_pairs(xs, ys, (f"{what}_x", f"{what}_y"), f"{what} agent")
            return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))

        benign, val = group(train_x, train_y, "train"), group(val_x, val_y, "val")
        if len(malicious_x):
            malicious = group(malicious_x, malicious_y, "malicious")
        else:  # no attackers: a group of none, with the benign inputs' per-sample shape
            malicious = AgentData(jnp.zeros((0, 1) + benign.x.shape[2:], benign.x.dtype),
                                  jnp.zeros((0, 1) + benign.y.shape[2:], benign.y.dtype), jnp.zeros((0,), jnp.int32))
        return cls(benign, val, malicious)

    @property
    def groups(self) -> tuple[AgentData, ...]:
        """The training groups in agent order (benign, then the attackers if any)."""
        return (self.benign, self.malicious) if self.malicious.num_agents else (self.benign,)

    def pad(self, size: int) -> "AttackData":
        """``size - N`` inactive padding agents after the last agents (the attackers, or
        the benign agents when there are none); the validation splits stay as they are."""
        group = "malicious" if self.malicious.num_agents else "benign"
        g = getattr(self, group)
        return self._replace(**{group: g.pad(g.num_agents + size - self.num_agents)})


class AttackDataset(NamedTuple):
    """The attacked benchmark on the host (NumPy). Agent order: benign, then malicious."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_mal: np.ndarray
    y_mal: np.ndarray  # flipped labels
    y_mal_clean: np.ndarray  # the original labels (Oracle Max: attackers honest)
    cluster: np.ndarray  # (N,) true cluster of every agent (metrics and attackers only)
    malicious: np.ndarray  # (N,) bool
    test_x: np.ndarray  # (K, n_test, ...)
    test_y: np.ndarray
    source: int
    target: int
    num_classes: int

    @property
    def num_benign(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_malicious(self) -> int:
        return int(self.x_mal.shape[0])

    @property
    def num_agents(self) -> int:
        return self.num_benign + self.num_malicious

    @property
    def num_clusters(self) -> int:
        return int(self.test_x.shape[0])

    def _group(self, x, y) -> AgentData:
        return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.full((x.shape[0],), x.shape[1], jnp.int32))

    def attack_data(self, honest: bool = False, attackers: bool = True) -> AttackData:
        """Device arrays for the round functions.

        ``honest=True``: the attackers keep their true labels (Oracle Max);
        ``attackers=False``: no attackers at all (Oracle Min).
        """
        mal = (self.x_mal, self.y_mal_clean if honest else self.y_mal)
        if not attackers:
            mal = (self.x_mal[:0], self.y_mal[:0])
        return AttackData(self._group(self.x_train, self.y_train), self._group(self.x_val, self.y_val),
                          self._group(*mal))


def _flip(y: np.ndarray, cfg: LabelFlipConfig, seed: int) -> np.ndarray:
    """The attackers' labels: every ``source`` label flipped, or each with probability
    ``cfg.flip_fraction`` (a stream of its own: the partition's draws are unchanged)."""
    if cfg.flip_fraction >= 1:
        return flip_labels(y, cfg.source, cfg.target)
    chosen = np.random.default_rng([seed, 1]).random(y.shape) < cfg.flip_fraction
    return np.where((y == cfg.source) & chosen, cfg.target, y).astype(y.dtype)


def label_flip_rotated(images: MNIST, cfg: LabelFlipConfig, seed: int = 0) -> AttackDataset:
    """The attacked rotated benchmark of FedCB²O §3.5 (see the module docstring).

    ``images`` is any :class:`~cbo_jax.federated.mnist.MNIST`-like source (MNIST, or
    EMNIST-balanced from :mod:`cbo_jax.federated.emnist`). Raises ``DataError`` when the
    source holds fewer training images than one cluster needs (or images and labels that
    do not pair up), and ``ValueError`` when its labels reach ``cfg.num_classes`` or lack
    the ``source`` class in training or test (the attack would flip nothing). ``seed``:
    an integer >= 0.
    """
    _check_seed(seed)
    _check_source(images, ROTATIONS[cfg.num_clusters])
    n_train = len(images.train_images)
    need = max(cfg.images_per_cluster)
    if need > n_train:
        k = cfg.images_per_cluster.index(need)
        raise DataError(
            f"the attack setting needs {need} training images per cluster ({cfg.benign_counts[k]} benign x "
            f"{cfg.benign_samples} + {cfg.malicious_counts[k]} malicious x {cfg.malicious_samples}), but the "
            f"source ({images.source}) has {n_train}; use the full MNIST (CBO_JAX_DATA_DIR or --source idx/tfds)"
        )
    for split in ("train", "test"):
        labels = np.asarray(getattr(images, f"{split}_labels"))
        if labels.size and int(labels.max()) >= cfg.num_classes:
            raise ValueError(f"num_classes ({cfg.num_classes}) is smaller than the data's largest {split} label "
                             f"{int(labels.max())}")
        # A source class the data lacks flips nothing (the attack would be a silent no-op) and leaves the
        # source-class accuracy and the attack success rate without test images (reported as 0).
        if not np.any(labels == cfg.source):
            raise ValueError(f"the source class {cfg.source} has no {split} images in the data ({images.source}), so "
                             f"the attack {cfg.source} -> {cfg.target} would flip nothing; pick a class of the data")
    rng = np.random.default_rng(seed)
    shared = rng.permutation(n_train)[:need] if cfg.shared_images else None  # every cluster's images
    n_tr = cfg.benign_samples - cfg.val_samples
    xt, yt, xv, yv, xm, ym = [], [], [], [], [], []
    cl_b, cl_m, test_x, test_y = [], [], [], []
    for k, degrees in enumerate(ROTATIONS[cfg.num_clusters]):
        rotated = rotate(images.train_images, degrees)
        nb, nm = cfg.benign_counts[k], cfg.malicious_counts[k]
        perm = rng.permutation(n_train) if shared is None else shared[rng.permutation(need)]
        ben = perm[: nb * cfg.benign_samples].reshape(nb, cfg.benign_samples)
        mal = perm[nb * cfg.benign_samples: nb * cfg.benign_samples + nm * cfg.malicious_samples]
        mal = mal.reshape(nm, cfg.malicious_samples)
        xt.append(rotated[ben[:, :n_tr]])
        yt.append(images.train_labels[ben[:, :n_tr]])
        xv.append(rotated[ben[:, n_tr:]])
        yv.append(images.train_labels[ben[:, n_tr:]])
        xm.append(rotated[mal])
        ym.append(images.train_labels[mal])
        cl_b += [k] * nb
        cl_m += [k] * nm
        test_x.append(rotate(images.test_images, degrees))
        test_y.append(images.test_labels)
    y_mal_clean = np.concatenate(ym).astype(np.int32)
    shape = images.train_images.shape[1:]
    return AttackDataset(
        x_train=np.concatenate(xt), y_train=np.concatenate(yt).astype(np.int32),
        x_val=np.concatenate(xv), y_val=np.concatenate(yv).astype(np.int32),
        x_mal=np.concatenate(xm) if xm and sum(len(a) for a in xm) else np.zeros((0, cfg.malicious_samples) + shape, np.uint8),
        y_mal=_flip(y_mal_clean, cfg, seed),
        y_mal_clean=y_mal_clean,
        cluster=np.asarray(cl_b + cl_m, np.int32),
        malicious=np.asarray([False] * len(cl_b) + [True] * len(cl_m)),
        test_x=np.stack(test_x), test_y=np.stack(test_y).astype(np.int32),
        source=cfg.source, target=cfg.target, num_classes=cfg.num_classes,
    )


def agent_roles(cluster, malicious) -> tuple[np.ndarray, np.ndarray, int]:
    """``(cluster, malicious, N_b)`` of an attacked population, checked: one entry each per
    agent, the attackers included (an attacker's cluster is the one it targets), and the
    ``N_b >= 1`` benign agents first."""
    cluster = _checks.cluster_ids("cluster", cluster)
    malicious = np.asarray(malicious, bool)
    n = cluster.shape[0]
    if malicious.shape != (n,):  # either may be the short one
        raise ValueError(f"cluster ({n} entries) and malicious ({np.size(malicious)}) must both have one entry per "
                         f"agent, the attackers included (an attacker's cluster is the one it targets)")
    nb = int(np.sum(~malicious))
    if np.any(malicious[:nb]) or nb == 0:
        raise ValueError("the benign agents must come first and there must be at least one")
    return cluster, malicious, nb


def check_split(data: AttackData, benign: int, attackers: int, who: str) -> None:
    """Refuse data split otherwise than ``benign`` agents (with validation splits), then
    ``attackers``, with a ``ValueError`` when a round is traced (the shapes are static).
    Padding agents of a sharded run come after the last group: the attackers, or the
    benign agents when there are none."""
    if not isinstance(data, AttackData):  # else an AttributeError ('AgentData' object has no attribute 'benign')
        raise ValueError(f"{who} takes an AttackData (benign training splits, their validation splits, the "
                         f"attackers' data), got {type(data).__name__}: build one from your per-agent arrays with "
                         f"fl.AttackData.from_lists(train_x, train_y, val_x, val_y[, malicious_x, malicious_y]), "
                         f"or take the benchmark's AttackDataset.attack_data()")
    b, m, v = data.benign.num_agents, data.malicious.num_agents, data.val.num_agents
    ok = (b == benign and m >= attackers) if attackers else (b >= benign and m == 0)
    if v != benign or not ok:
        raise ValueError(f"the data holds {b} benign agents ({v} validation splits) and {m} attackers, but {who} "
                         f"was built for {benign} benign agents and {attackers} attackers (its malicious mask)")


def attacker_selection(key: jax.Array, cluster, malicious, m: int) -> tuple[jax.Array, jax.Array]:
    """The attackers' downloads: ``(N_m, M)`` indices and a validity mask.

    ``malicious`` must be concrete (a NumPy array or a constant), ``cluster`` may be traced.

    Attacker ``a`` (the agents with ``malicious`` True, in order) takes the other
    attackers of its cluster first, then benign agents of its cluster uniformly at
    random, up to ``M``. Slots that its cluster cannot fill are marked invalid.
    """
    malicious_np = np.asarray(malicious, bool)  # static: who the attackers are
    cluster, malicious = jnp.asarray(cluster), jnp.asarray(malicious_np)
    n = cluster.shape[0]
    if malicious_np.shape != (n,):
        raise ValueError(f"malicious must be a mask of one entry per agent, shape ({n},) as cluster; got shape "
                         f"{malicious_np.shape}")
    _checks.downloads(m, n, what="downloads per attacker")
    att = jnp.asarray(np.nonzero(malicious_np)[0])
    same = cluster[att][:, None] == cluster[None, :]
    own = att[:, None] == jnp.arange(n)[None, :]
    tier = jnp.where(own, -1, jnp.where(same & malicious[None, :], 2, jnp.where(same, 1, 0)))
    u = jax.random.uniform(key, tier.shape)
    order = jnp.lexsort((-u, -tier), axis=-1)[:, :m]
    valid = jnp.take_along_axis(tier, order, axis=1) > 0
    return order.astype(jnp.int32), valid


def attacker_average(params: PyTree, attackers: jax.Array, idx: jax.Array, valid: jax.Array, sizes: jax.Array) -> PyTree:
    """Each attacker's own model averaged with its valid downloads, weighted by data size.

    Returns the attackers' new models ``(N_m, ...)``. Non-finite models get weight zero.
    """
    clean, ok = pop.zero_nonfinite_rows(params)
    n = ok.shape[0]
    w = jnp.where(valid & ok[idx], sizes[idx], 0.0).astype(jnp.float32)
    w_self = jnp.where(ok[attackers], sizes[attackers], 0.0).astype(jnp.float32)
    rows = jnp.arange(attackers.shape[0])
    dense = jnp.zeros((attackers.shape[0], n), jnp.float32).at[rows[:, None], idx].add(w).at[rows, attackers].add(w_self)
    return pop.weighted_average(clean, dense)


def _rows(tree: PyTree, start: int, stop: int) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[start:stop], tree)


def grouped_local_train(model, cfg: LocalSGDConfig, params: PyTree, opt_state: PyTree | None,
                        groups: tuple[AgentData, ...], key: jax.Array) -> LocalResult:
    """:func:`~cbo_jax.federated.local.local_train` on contiguous groups of agents.

    ``groups[g]`` holds the data of the next ``groups[g].counts.shape[0]`` agents of
    ``params``; each group is padded only to its own largest agent.
    """
    results, start = [], 0
    for g, k in zip(groups, jax.random.split(key, len(groups))):
        stop = start + g.counts.shape[0]
        st = None if opt_state is None else _rows(opt_state, start, stop)
        results.append(local_train(model, cfg, _rows(params, start, stop), st, g, k))
        start = stop
    n = pop.num_agents(params)
    if start != n:
        raise ValueError(f"the groups hold {start} agents but params has {n}")
    cat = lambda *xs: jnp.concatenate(xs, axis=0)  # noqa: E731
    return LocalResult(*(jax.tree_util.tree_map(cat, *[getattr(r, f) for r in results]) for f in LocalResult._fields))
