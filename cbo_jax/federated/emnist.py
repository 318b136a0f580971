"""EMNIST-balanced through tensorflow-datasets (the FedCB²O paper's data set).

EMNIST (Cohen, Afshar, Tapson and van Schaik, "EMNIST: an extension of MNIST to
handwritten letters", arXiv:1702.05373, 2017), split ``balanced``: 47 classes (digits
0–9, upper-case letters A–Z as 10–35, eleven lower-case letters as 36–46), 112,800
training and 18,800 test images of 28×28 pixels. The paper's label flip is
``'O'`` (label 24) → ``'0'`` (label 0).

tensorflow-datasets stores EMNIST images transposed (as the original files);
:func:`load_emnist_tfds` transposes them back so they are upright like MNIST, which
matters here because the clusters are rotations. EMNIST cannot be downloaded in this
project's offline workplace; the loader is exercised with ``tfds.testing.mock_data``.
It is :func:`cbo_jax.federated.datasets.load_tfds_images` with EMNIST's defaults;
:func:`cbo_jax.federated.datasets.load_dataset` reads EMNIST-balanced (``"emnist"``) beside the
other standard image sets.
"""

from __future__ import annotations

import os

from cbo_jax.federated.datasets import load_tfds_images
from cbo_jax.federated.datasets import prepare_hint as _hint
from cbo_jax.federated.mnist import MNIST

__all__ = ["EMNIST_BALANCED_CLASSES", "EMNIST_SOURCE_O", "EMNIST_TARGET_ZERO", "load_emnist_tfds", "prepare_hint"]

EMNIST_BALANCED_CLASSES = 47
EMNIST_SOURCE_O = 24  # upper-case 'O' in EMNIST-balanced
EMNIST_TARGET_ZERO = 0  # the digit '0'


def load_emnist_tfds(data_dir: str | os.PathLike | None = None, split_name: str = "balanced", download: bool = False,
                     transpose: bool = True) -> MNIST:
    """Load ``emnist/<split_name>`` through tensorflow-datasets as an :class:`MNIST` tuple.

    Args:
      data_dir: the tfds data directory (``None``: tfds' default).
      split_name: the EMNIST configuration (``"balanced"`` in the paper).
      download: let tfds download and prepare the data on first use (needs a network).
      transpose: swap rows and columns so that images are upright (EMNIST is stored
        transposed).
    """
    return load_tfds_images(f"emnist/{split_name}", data_dir, download, transpose)


def prepare_hint(name: str = "emnist/balanced", data_dir: str | os.PathLike | None = None) -> str:
    """How to prepare ``name`` for :func:`load_emnist_tfds` where there is no network.

    The loader reads through ``tfds.data_source`` (random access, no TensorFlow), which needs
    the data set written as ``array_record`` files; a default ``tfds build`` writes
    ``tfrecord`` files, which it cannot read.
    """
    return _hint(name, data_dir)
