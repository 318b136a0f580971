"""Real MNIST from three sources: IDX files, tensorflow-datasets, a bundled subset.

* :func:`load_idx_dir` reads the four standard IDX files (gzip-compressed or not, told
  by their content) from a directory, as distributed by LeCun et al. (in CI:
  ``$CBO_JAX_DATA_DIR/mnist``).
* :func:`load_tfds` reads MNIST through tensorflow-datasets (needs a prepared tfds
  data directory, or network access on the first call).
* :func:`load_bundled` reads the small real-MNIST subset shipped inside the package
  (built from the IDX files by ``python -m cbo_jax.data.build_subset``), so examples and the
  main command work offline on a fresh machine.

Every loader returns a :class:`MNIST` with ``uint8`` images ``(n, 28, 28)`` and
``int32`` labels. Corrupt or missing files raise :class:`DataError` naming the file.

MNIST: Y. LeCun, L. Bottou, Y. Bengio and P. Haffner, "Gradient-based learning applied
to document recognition", Proc. IEEE 86(11), 1998.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["MNIST", "DataError", "read_idx", "load_idx_dir", "load_tfds", "load_bundled", "load_mnist", "resolve_source",
           "SOURCES", "BUNDLED_PATH"]

BUNDLED_PATH = Path(__file__).resolve().parent.parent / "data" / "mnist_subset.npz"

_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_MAGIC = {3: 2051, 1: 2049}  # unsigned-byte IDX files with 3 (images) or 1 (labels) dimensions
_GZIP_MAGIC = b"\x1f\x8b"


class DataError(ValueError):
    """A data file is missing, truncated or not in the expected format."""


class MNIST(NamedTuple):
    """The train and test splits of an image data set (MNIST's loaders, and those of
    :mod:`cbo_jax.federated.datasets` for the other image sets)."""

    train_images: np.ndarray  # (n_train, 28, 28) uint8; (n_train, H, W) or (n_train, H, W, C) for other image sets
    train_labels: np.ndarray  # (n_train,) int32
    test_images: np.ndarray  # (n_test, 28, 28) uint8 (likewise)
    test_labels: np.ndarray  # (n_test,) int32
    source: str


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """Read one unsigned-byte IDX file (``.gz`` or raw) with ``ndim`` dimensions (1 or 3).

    Gzip-compressed or raw is told by the content, not by the name: a compressed file
    without the ``.gz`` suffix, or a raw one that kept it (browsers that decompress
    downloads leave the name), reads the same. Checks the magic number (2051 for
    images, 2049 for labels) and that the data length equals the product of the
    dimensions; raises :class:`DataError` naming ``path`` otherwise.
    """
    if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)) or ndim not in _MAGIC:
        raise ValueError(f"ndim must be 3 (images) or 1 (labels), got {ndim!r}")
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        # Raw unsigned-byte IDX starts 00 00 08; anything else named .gz goes to gzip, which names the problem.
        if raw[:2] == _GZIP_MAGIC or (path.suffix == ".gz" and raw[:3] != b"\x00\x00\x08"):
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as err:  # zlib.error: a corrupt deflate stream
        raise DataError(f"{path}: cannot read ({type(err).__name__}: {err})") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if magic != _MAGIC[ndim]:
        raise DataError(f"{path}: bad magic number {magic}, expected {_MAGIC[ndim]} (unsigned-byte, {ndim}-D IDX)")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = math.prod(dims)  # Python integers: np.prod wraps around in int64 for a corrupt header
    if len(raw) - header != expected:
        raise DataError(f"{path}: {len(raw) - header} data bytes, but the header's dimensions {dims} need {expected}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for candidate in (directory / f"{stem}.gz", directory / stem, directory / "mnist" / f"{stem}.gz", directory / "mnist" / stem):
        if candidate.exists():
            return candidate
    raise DataError(f"{directory / stem}[.gz]: file not found (also looked in {directory / 'mnist'})")


def load_idx_dir(directory: str | os.PathLike) -> MNIST:
    """Load MNIST from the four IDX files in ``directory`` (or its ``mnist/`` subfolder)."""
    directory = Path(directory)
    if not directory.is_dir():
        why = "it is a file" if directory.exists() else "it does not exist"
        raise DataError(f"{directory}: not a directory ({why})")
    arrays = {}
    for name, stem in _FILES.items():
        path = _find(directory, stem)
        arr = read_idx(path, 3 if name.endswith("images") else 1)
        if len(arr) == 0:
            raise DataError(f"{path}: holds 0 {name.split('_')[1]}; the {name.split('_')[0]} split must not be empty")
        if name.endswith("images") and arr.shape[1:] != (28, 28):
            raise DataError(f"{path}: images are {arr.shape[1:]}, expected 28x28")
        if name.endswith("labels"):
            if arr.size and arr.max() > 9:
                raise DataError(f"{path}: label {int(arr.max())} outside 0..9")
            arr = arr.astype(np.int32)
        arrays[name] = arr
    for split in ("train", "test"):
        if len(arrays[f"{split}_images"]) != len(arrays[f"{split}_labels"]):
            raise DataError(
                f"{directory}: {split} has {len(arrays[f'{split}_images'])} images but {len(arrays[f'{split}_labels'])} labels"
            )
    return MNIST(**arrays, source=f"idx:{directory}")


def load_tfds(data_dir: str | os.PathLike | None = None, download: bool = False) -> MNIST:
    """Load MNIST through tensorflow-datasets (``pip install 'cbo-jax[data]'``).

    Uses ``tfds.data_source`` (random access on array_record files), which needs no
    TensorFlow. ``download=True`` lets tfds fetch and prepare the data on first use.
    """
    return MNIST(**_tfds_splits("mnist", data_dir, download), source="tfds")


def _tfds_splits(name: str, data_dir, download: bool, transpose: bool = False) -> dict:
    """The train and test images (uint8, ``(n, H, W)``; ``(n, H, W, C)`` for more than one
    channel) and labels (int32) of tfds dataset ``name``.

    Through ``tfds.data_source`` (no TensorFlow needed); shared by :func:`load_tfds` and
    :func:`cbo_jax.federated.datasets.load_tfds_images`. ``transpose`` swaps rows and columns.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise DataError("tensorflow-datasets is not installed: pip install 'cbo-jax[data]'") from err
    out = {}
    for split in ("train", "test"):
        try:
            source = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
        except Exception as err:  # noqa: BLE001 - tfds raises many types for a missing dataset
            raise DataError(f"tensorflow-datasets could not provide {name}/{split}: {err}") from err
        examples = [source[i] for i in range(len(source))]
        if not examples:  # as load_idx_dir: an empty split fails here, not as a division by zero mid-run
            raise DataError(f"tensorflow-datasets gave 0 images for {name}/{split}; the {split} split must not be empty")
        arr = np.stack([np.asarray(ex["image"]) for ex in examples])
        arr = arr[..., 0] if arr.ndim == 4 and arr.shape[-1] == 1 else arr  # one channel dropped, colour kept
        if transpose:
            arr = np.swapaxes(arr, 1, 2)
        out[f"{split}_images"] = np.ascontiguousarray(arr).astype(np.uint8)
        out[f"{split}_labels"] = np.asarray([int(ex["label"]) for ex in examples], np.int32)
    return out


def load_bundled() -> MNIST:
    """The real-MNIST subset shipped with the package (see ``cbo_jax/data/README.md``)."""
    if not BUNDLED_PATH.exists():
        raise DataError(f"{BUNDLED_PATH}: bundled subset missing (rebuild with "
                        "python -m cbo_jax.data.build_subset --idx-dir DIR)")
    try:
        with np.load(BUNDLED_PATH) as z:
            return MNIST(
                train_images=z["train_images"],
                train_labels=z["train_labels"].astype(np.int32),
                test_images=z["test_images"],
                test_labels=z["test_labels"].astype(np.int32),
                source="bundled",
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{BUNDLED_PATH}: corrupt bundled subset ({type(err).__name__}: {err}); rebuild it with "
                        "python -m cbo_jax.data.build_subset --idx-dir DIR") from None


SOURCES = ("auto", "idx", "tfds", "bundled")


def resolve_source(source: str = "auto", data_dir: str | os.PathLike | None = None) -> tuple[str, str | None]:
    """The source and directory :func:`load_mnist` reads for ``source`` and ``data_dir``.

    ``"auto"`` becomes ``"idx"`` with the IDX directory ``data_dir`` (or
    ``$CBO_JAX_DATA_DIR``) when one is given, else ``"bundled"`` (directory ``None``).
    ``"idx"`` and ``"tfds"`` take ``$CBO_JAX_DATA_DIR`` when ``data_dir`` is not given;
    ``"bundled"`` keeps ``data_dir`` as given (it reads none). The IDX directory is
    returned absolute, so the pair names the same files from any working directory and
    without the environment variable: what a run's ``config.json`` records. Resolving a
    resolved pair returns it unchanged.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be 'auto', 'idx', 'tfds' or 'bundled', got {source!r}")
    directory = os.fspath(data_dir) if data_dir else None
    if source != "bundled":
        directory = directory or os.environ.get("CBO_JAX_DATA_DIR") or None
    if source == "auto":
        source = "idx" if directory else "bundled"
    if source == "idx" and directory:
        directory = os.path.abspath(directory)
    return source, directory


def load_mnist(source: str = "auto", data_dir: str | os.PathLike | None = None) -> MNIST:
    """Load MNIST from ``source``: ``"idx"``, ``"tfds"``, ``"bundled"`` or ``"auto"``.

    ``"auto"`` uses the IDX files in ``data_dir`` (or ``$CBO_JAX_DATA_DIR``) when
    given, else the bundled subset (:func:`resolve_source` says which).
    """
    requested, given = source, data_dir
    source, data_dir = resolve_source(source, data_dir)
    if source == "idx":
        if not data_dir:
            raise DataError("source='idx' needs data_dir or the CBO_JAX_DATA_DIR environment variable")
        try:
            return load_idx_dir(data_dir)
        except DataError as err:
            if given:
                raise
            # The directory came from the environment: say so, the user may not know it is set.
            hint = ": unset it to use the bundled subset" if requested == "auto" else ""
            raise DataError(f"{err}; the directory comes from CBO_JAX_DATA_DIR={os.environ.get('CBO_JAX_DATA_DIR')!r}"
                            f"{hint}") from None
    if source == "tfds":
        return load_tfds(data_dir)
    return load_bundled()
