"""Standard image data sets through tensorflow-datasets: MNIST, EMNIST, Fashion-MNIST, CIFAR-10/100.

:func:`load_dataset` reads one of :data:`DATASETS` through ``tfds.data_source`` (random
access on ``array_record`` files, no TensorFlow) and returns it as the
:class:`~cbo_jax.federated.mnist.MNIST` tuple every builder of this package takes: ``uint8``
images ``(n, H, W)`` for the grey sets and ``(n, H, W, C)`` for the colour ones, ``int32``
labels. :func:`cbo_jax.federated.data.rotated_mnist` builds the rotated benchmark of any of
them (IFCA's rotated CIFAR-10 with 2 clusters, for one), and ``cbo-jax run ALGORITHM
--dataset cifar10`` runs it (:class:`cbo_jax.experiments.federated.RotatedMNISTConfig`).

Data that is not prepared raises :class:`~cbo_jax.federated.mnist.DataError` with the
commands that prepare it (:func:`prepare_hint`); this project's workplace has no network,
and the loaders are tested with ``tfds.testing.mock_data``.

The data sets:

* MNIST: Y. LeCun, L. Bottou, Y. Bengio and P. Haffner, "Gradient-based learning applied to
  document recognition", Proc. IEEE 86(11), 1998. 10 classes, 28×28 grey.
* EMNIST-balanced: G. Cohen, S. Afshar, J. Tapson and A. van Schaik, "EMNIST: an extension of
  MNIST to handwritten letters", arXiv:1702.05373, 2017. 47 classes, 28×28 grey, stored
  transposed by tfds (turned upright here, see :mod:`cbo_jax.federated.emnist`).
* Fashion-MNIST: H. Xiao, K. Rasul and R. Vollgraf, "Fashion-MNIST: a novel image dataset for
  benchmarking machine learning algorithms", arXiv:1708.07747, 2017. 10 classes, 28×28 grey.
* CIFAR-10 and CIFAR-100: A. Krizhevsky, "Learning multiple layers of features from tiny
  images", technical report, University of Toronto, 2009. 10 (100 fine) classes, 32×32 colour.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from cbo_jax.federated.mnist import MNIST, DataError, _tfds_splits

__all__ = ["DatasetSpec", "DATASETS", "load_dataset", "load_tfds_images", "prepare_hint"]


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One standard image data set.

    Attributes:
      tfds_name: its name in tensorflow-datasets (``"emnist/balanced"``).
      num_classes: the classes of its labels.
      image_shape: one image: ``(H, W)`` grey or ``(H, W, C)`` colour.
      transpose: tfds stores the images transposed (EMNIST): rows and columns are swapped back.
    """

    tfds_name: str
    num_classes: int
    image_shape: tuple[int, ...]
    transpose: bool = False


DATASETS = {
    "mnist": DatasetSpec("mnist", 10, (28, 28)),
    "emnist": DatasetSpec("emnist/balanced", 47, (28, 28), transpose=True),
    "fashion_mnist": DatasetSpec("fashion_mnist", 10, (28, 28)),
    "cifar10": DatasetSpec("cifar10", 10, (32, 32, 3)),
    "cifar100": DatasetSpec("cifar100", 100, (32, 32, 3)),
}


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = False) -> MNIST:
    """Data set ``name`` of :data:`DATASETS` (``"cifar10"``, ...) through tensorflow-datasets.

    Args:
      name: a key of :data:`DATASETS`.
      data_dir: the tfds data directory (``None``: tfds' default, ``$TFDS_DATA_DIR`` or
        ``~/tensorflow_datasets``).
      download: let tfds download and prepare the data on first use (needs a network and,
        for the ``array_record`` files read here, TensorFlow).

    Returns its train and test splits as an :class:`~cbo_jax.federated.mnist.MNIST` tuple
    (``source`` ``"tfds:<tfds name>"``): ``uint8`` images of the spec's shape, ``int32``
    labels in ``[0, num_classes)``. Raises :class:`~cbo_jax.federated.mnist.DataError` when
    the data is not prepared (saying how, :func:`prepare_hint`) or is not what the spec says.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}")
    spec = DATASETS[name]
    data = load_tfds_images(spec.tfds_name, data_dir, download, spec.transpose)
    for split in ("train", "test"):
        images, labels = getattr(data, f"{split}_images"), getattr(data, f"{split}_labels")
        if images.shape[1:] != spec.image_shape:
            raise DataError(f"{data.source} {split}: images of shape {images.shape[1:]}, expected {spec.image_shape}")
        if labels.min() < 0 or labels.max() >= spec.num_classes:
            raise DataError(f"{data.source} {split}: labels in [{labels.min()}, {labels.max()}], expected "
                            f"0..{spec.num_classes - 1}")
    return data


def load_tfds_images(name: str, data_dir: str | os.PathLike | None = None, download: bool = False,
                     transpose: bool = False) -> MNIST:
    """Any tfds image classification data set ``name`` (its ``image`` and ``label`` features)
    as an :class:`~cbo_jax.federated.mnist.MNIST` tuple, ``source`` ``"tfds:<name>"``.

    A single channel is dropped (``(n, H, W)``), colour kept (``(n, H, W, C)``); ``transpose``
    swaps rows and columns. Data that is not prepared raises
    :class:`~cbo_jax.federated.mnist.DataError` naming the directory and the commands that
    prepare it (:func:`prepare_hint`).
    """
    try:
        splits = _tfds_splits(name, data_dir, download, transpose)
    except DataError as err:
        if download:
            raise
        root = Path(data_dir).expanduser() if data_dir is not None else None
        if root is not None and not (root / name).is_dir():  # tfds' own text would speak of a tfrecord copy
            err = DataError(f"{name} is not prepared in {root}: there is no {root / name}")
        raise DataError(f"{err}\n{prepare_hint(name, data_dir)}") from err.__cause__
    return MNIST(**splits, source=f"tfds:{name}")


def prepare_hint(name: str, data_dir: str | os.PathLike | None = None) -> str:
    """How to prepare the tfds data set ``name`` for :func:`load_tfds_images` where there is no network.

    The loaders read through ``tfds.data_source`` (random access, no TensorFlow), which needs
    the data set written as ``array_record`` files; a default ``tfds build`` writes
    ``tfrecord`` files, which it cannot read.
    """
    where = str(data_dir) if data_dir is not None else "DIR"
    return (f"{name} must be prepared as array_record files, on a machine with a network (the build needs "
            f"TensorFlow):\n"
            f"  pip install tensorflow tensorflow-datasets\n"
            f"  tfds build {name} --file_format=array_record --data_dir={where}\n"
            f"then copy {where} here and pass --data-dir {where} (the tfds data directory; without it tfds' "
            f"default, ~/tensorflow_datasets or $TFDS_DATA_DIR). Data already built as tfrecord files can be "
            f"converted: tfds convert_format --root_data_dir={where} --out_file_format=array_record.")
