"""Federated data: every agent's samples stacked on a leading agent axis.

:class:`FederatedData` holds ``N`` agents' training sets as one array
``(N, n_max, ...)`` (padded to the largest agent, with ``counts`` and a derived
``mask`` for unequal sizes), the true cluster id of each agent, and one test set per
cluster. The cluster ids are for metrics only: no algorithm may read them.

:func:`rotated_mnist` builds the rotated-MNIST benchmark of the FedCBO paper
(REFERENCE_NOTES §1.3): ``K`` clusters, cluster ``k`` sees every image rotated by its
own multiple of 90°, ``N`` agents split evenly over the clusters, each cluster's rotated
training set randomly partitioned among its agents, and the cluster's test set is the
whole test set rotated the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cbo_jax import _checks
from cbo_jax.federated.mnist import MNIST

__all__ = ["FederatedData", "ROTATIONS", "rotated_mnist"]

# Rotation (degrees, counter-clockwise) of each cluster for K = 1, 2, 4. K = 2 uses the
# two upright-symmetric angles 0° and 180°, as the FedCB²O experiment does.
ROTATIONS = {1: (0,), 2: (0, 180), 4: (0, 90, 180, 270)}


class FederatedData(NamedTuple):
    """Per-agent data stacked on the agent axis (a pytree of arrays).

    Attributes:
      x: ``(N, n_max, ...)`` inputs (``uint8`` images for MNIST; models scale them).
      y: ``(N, n_max)`` integer labels (padding rows hold 0).
      counts: ``(N,)`` number of real samples of each agent.
      cluster: ``(N,)`` true cluster id (metrics only).
      test_x: ``(K, n_test, ...)`` one test set per cluster.
      test_y: ``(K, n_test)``.
    """

    x: np.ndarray
    y: np.ndarray
    counts: np.ndarray
    cluster: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    @property
    def num_agents(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_clusters(self) -> int:
        return int(self.test_x.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """``(N, n_max)`` boolean: ``True`` on real samples, ``False`` on padding."""
        return np.arange(self.x.shape[1])[None, :] < np.asarray(self.counts)[:, None]

    @classmethod
    def from_lists(cls, xs, ys, cluster, test_x, test_y) -> "FederatedData":
        """Stack per-agent arrays of unequal sizes, padding with zeros."""
        if len(xs) != len(ys) or len(xs) != len(cluster):
            raise ValueError(f"xs, ys and cluster must have one entry per agent; got {len(xs)}, {len(ys)}, {len(cluster)}")
        counts = np.array([len(x) for x in xs], np.int32)
        for j, (x, y) in enumerate(zip(xs, ys)):
            if len(x) != len(y):
                raise ValueError(f"agent {j} has {len(x)} inputs but {len(y)} labels")
        n_max = int(counts.max(initial=0))
        x = np.zeros((len(xs), n_max) + np.shape(xs[0])[1:], np.asarray(xs[0]).dtype)
        y = np.zeros((len(xs), n_max), np.int32)
        for j, (xj, yj) in enumerate(zip(xs, ys)):
            x[j, : len(xj)] = xj
            y[j, : len(yj)] = yj
        return cls(x, y, counts, np.asarray(cluster, np.int32), np.asarray(test_x), np.asarray(test_y, np.int32))


def rotate(images: np.ndarray, degrees: int) -> np.ndarray:
    """Rotate ``(n, H, W)`` images counter-clockwise by a multiple of 90°."""
    if degrees % 90:
        raise ValueError(f"rotation must be a multiple of 90 degrees, got {degrees}")
    return np.rot90(images, k=(degrees // 90) % 4, axes=(1, 2))


def rotated_mnist(
    mnist: MNIST,
    num_agents: int,
    num_clusters: int = 4,
    samples_per_agent: int | None = None,
    seed: int = 0,
) -> FederatedData:
    """The rotated-MNIST clustered benchmark (FedCBO paper, Table 1 setting).

    Args:
      mnist: the source data (any loader of :mod:`cbo_jax.federated.mnist`).
      num_agents: ``N``; must be a multiple of ``num_clusters``.
      num_clusters: ``K`` in ``{1, 2, 4}``; rotations are ``ROTATIONS[K]``.
      samples_per_agent: images per agent; default (``None``) partitions the whole
        training set, ``n_train // (N / K)`` each (200 for the paper's N = 1200).
      seed: seed of the random partition.

    Returns a :class:`FederatedData` whose agents ``k·N/K .. (k+1)·N/K - 1`` form
    cluster ``k`` (the algorithms never see this order or the ids).
    """
    n = _checks.positive_int("num_agents", num_agents)
    if num_clusters not in ROTATIONS:
        raise ValueError(f"num_clusters (rotation count) must be one of {sorted(ROTATIONS)}, got {num_clusters!r}")
    if n % num_clusters:
        raise ValueError(f"num_agents ({n}) must be divisible by num_clusters ({num_clusters})")
    per_cluster = n // num_clusters
    n_train = len(mnist.train_images)
    max_per_agent = n_train // per_cluster
    if samples_per_agent is None:
        samples_per_agent = max_per_agent
    _checks.positive_int("samples_per_agent", samples_per_agent)
    if samples_per_agent > max_per_agent:
        raise ValueError(
            f"samples_per_agent={samples_per_agent} needs {samples_per_agent * per_cluster} training images per "
            f"cluster, but the source ({mnist.source}) has {n_train}"
        )
    rng = np.random.default_rng(seed)
    xs, ys, cluster = [], [], []
    test_x, test_y = [], []
    for k, degrees in enumerate(ROTATIONS[num_clusters]):
        rotated = rotate(mnist.train_images, degrees)
        perm = rng.permutation(n_train)[: samples_per_agent * per_cluster].reshape(per_cluster, samples_per_agent)
        xs.extend(rotated[perm])
        ys.extend(mnist.train_labels[perm])
        cluster.extend([k] * per_cluster)
        test_x.append(rotate(mnist.test_images, degrees))
        test_y.append(mnist.test_labels)
    return FederatedData(
        x=np.stack(xs),
        y=np.stack(ys).astype(np.int32),
        counts=np.full(n, samples_per_agent, np.int32),
        cluster=np.asarray(cluster, np.int32),
        test_x=np.stack(test_x),
        test_y=np.stack(test_y).astype(np.int32),
    )
