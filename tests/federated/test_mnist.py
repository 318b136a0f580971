"""MNIST sources: IDX reader (and its errors), bundled subset, tfds (mocked), real files."""

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from cbo_jax.federated import mnist


def _write_idx(path: Path, arr: np.ndarray, magic: int | None = None, gz: bool = True, truncate: int = 0):
    magic = magic if magic is not None else {3: 2051, 1: 2049}[arr.ndim]
    raw = magic.to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in arr.shape) + arr.astype(np.uint8).tobytes()
    raw = raw[: len(raw) - truncate]
    with (gzip.open if gz else open)(path, "wb") as fh:  # closed here: Python 3.12's GzipFile buffers writes
        fh.write(raw)


def _fake_dir(tmp_path: Path, n_train=30, n_test=10, **bad) -> Path:
    rng = np.random.default_rng(0)
    files = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for stem, arr in files.items():
        _write_idx(tmp_path / f"{stem}.gz", arr, **bad.get(stem, {}))
    return tmp_path


def test_read_idx_roundtrip_gz_and_raw(tmp_path):
    arr = np.arange(2 * 28 * 28).reshape(2, 28, 28) % 256
    _write_idx(tmp_path / "a.gz", arr)
    _write_idx(tmp_path / "b", arr, gz=False)
    np.testing.assert_array_equal(mnist.read_idx(tmp_path / "a.gz", 3), arr)
    np.testing.assert_array_equal(mnist.read_idx(tmp_path / "b", 3), arr)


def test_idx_dir_loads(tmp_path):
    data = mnist.load_idx_dir(_fake_dir(tmp_path))
    assert data.train_images.shape == (30, 28, 28) and data.test_labels.shape == (10,)
    assert data.train_labels.dtype == np.int32


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"train-images-idx3-ubyte": {"magic": 2049}}, "train-images-idx3-ubyte.gz: bad magic number 2049"),
        ({"t10k-labels-idx1-ubyte": {"truncate": 3}}, "t10k-labels-idx1-ubyte.gz: 7 data bytes"),
    ],
)
def test_corrupt_files_name_the_file(tmp_path, bad, match):
    with pytest.raises(mnist.DataError, match=match):
        mnist.load_idx_dir(_fake_dir(tmp_path, **bad))


def test_missing_file_and_dir_are_named(tmp_path):
    d = _fake_dir(tmp_path)
    (d / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(mnist.DataError, match="t10k-images-idx3-ubyte.*not found"):
        mnist.load_idx_dir(d)
    with pytest.raises(mnist.DataError, match="not a directory"):
        mnist.load_idx_dir(tmp_path / "nope")
    (tmp_path / "x.gz").write_bytes(b"not gzip at all")
    with pytest.raises(mnist.DataError, match="x.gz: cannot read"):
        mnist.read_idx(tmp_path / "x.gz", 1)


def test_bundled_subset_is_real_stratified_mnist():
    data = mnist.load_bundled()
    assert data.train_images.shape == (10_000, 28, 28) and data.test_images.shape == (2_000, 28, 28)
    assert np.all(np.bincount(data.train_labels, minlength=10) == 1000)
    assert np.all(np.bincount(data.test_labels, minlength=10) == 200)
    # MNIST pixel statistics (REFERENCE data README: mean 33.3 train, 33.8 test).
    assert 31.0 < data.train_images.mean() < 36.0
    assert mnist.BUNDLED_PATH.stat().st_size < 5e6


def test_tfds_source_with_mock_data(tfds):
    with tfds.testing.mock_data(num_examples=12):
        data = mnist.load_tfds()
    assert data.train_images.shape == (12, 28, 28) and data.train_images.dtype == np.uint8
    assert data.test_labels.shape == (12,) and data.source == "tfds"


def test_real_mnist_idx_files_match_published_facts():
    """Skipped without CBO_JAX_DATA_DIR (the reason says how to run it); fails in CI without it."""
    from conftest import real_mnist

    _, data = real_mnist()
    assert mnist.load_mnist("auto").source == data.source  # auto reads the directory the variable names
    assert data.train_images.shape == (60_000, 28, 28) and data.test_images.shape == (10_000, 28, 28)
    assert np.bincount(data.train_labels, minlength=10).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(data.test_labels, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    bundled = mnist.load_bundled()
    with np.load(mnist.BUNDLED_PATH) as z:
        idx = z["train_index"]
    np.testing.assert_array_equal(bundled.train_images, data.train_images[idx])


@pytest.mark.parametrize("ci", ["", "false", "0", "true", "1"])
def test_real_mnist_tests_skip_saying_why_and_fail_in_ci(tmp_path, ci):
    """The tests of the real files skip with the way to run them when CBO_JAX_DATA_DIR is unset
    or names no MNIST files; in CI (CI=true) they fail instead, so CI always runs them."""
    from conftest import real_mnist

    outcome = pytest.fail.Exception if ci in ("true", "1") else pytest.skip.Exception
    for env, why in [({}, "CBO_JAX_DATA_DIR is not set: set CBO_JAX_DATA_DIR to the directory holding mnist/"),
                     ({"CBO_JAX_DATA_DIR": str(tmp_path)},
                      f"CBO_JAX_DATA_DIR={re.escape(repr(str(tmp_path)))} holds no readable MNIST IDX files "
                      ".*not found.*: set CBO_JAX_DATA_DIR to the directory holding mnist/")]:
        with pytest.raises(outcome, match=why):
            real_mnist(dict(env, CI=ci))
    directory, data = real_mnist({"CBO_JAX_DATA_DIR": str(_fake_dir(tmp_path)), "CI": ci})
    assert directory == str(tmp_path) and data.train_images.shape == (30, 28, 28)


@pytest.mark.parametrize("split, stem", [("train", "train-images-idx3-ubyte"), ("test", "t10k-images-idx3-ubyte")])
def test_empty_split_is_refused_naming_the_file(tmp_path, split, stem):
    """A split with 0 images is a DataError (a ValueError) at load time, not a ZeroDivisionError mid-run."""
    d = _fake_dir(tmp_path, **{f"n_{split}": 0})
    with pytest.raises(ValueError, match=f"{stem}.gz: holds 0 images; the {split} split must not be empty"):
        mnist.load_idx_dir(d)


def test_missing_bundled_subset_names_the_real_build_command(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist, "BUNDLED_PATH", tmp_path / "missing.npz")
    with pytest.raises(mnist.DataError, match=r"python -m cbo_jax\.data\.build_subset") as err:
        mnist.load_bundled()
    assert "scripts/" not in str(err.value)
    assert "scripts/" not in mnist.__doc__ and "python -m cbo_jax.data.build_subset" in mnist.__doc__


def test_resolve_source_makes_auto_explicit(tmp_path, monkeypatch):
    """auto -> idx with the absolute directory (argument, else $CBO_JAX_DATA_DIR), else bundled; idempotent."""
    monkeypatch.delenv("CBO_JAX_DATA_DIR", raising=False)
    assert mnist.resolve_source() == ("bundled", None)
    assert mnist.resolve_source("auto", "") == ("bundled", None)
    monkeypatch.chdir(tmp_path)
    assert mnist.resolve_source("auto", "idxdir") == ("idx", str(tmp_path / "idxdir"))
    monkeypatch.setenv("CBO_JAX_DATA_DIR", "envdir")
    assert mnist.resolve_source() == ("idx", str(tmp_path / "envdir"))
    assert mnist.resolve_source("idx") == ("idx", str(tmp_path / "envdir"))
    assert mnist.resolve_source("auto", "/given") == ("idx", "/given")
    # explicit sources are kept; bundled reads no directory, so the environment does not add one
    assert mnist.resolve_source("bundled") == ("bundled", None)
    assert mnist.resolve_source("tfds") == ("tfds", "envdir")
    for args in (("auto",), ("auto", "x"), ("idx", "y"), ("bundled",), ("tfds", "gs://bucket")):
        resolved = mnist.resolve_source(*args)
        assert mnist.resolve_source(*resolved) == resolved
    monkeypatch.delenv("CBO_JAX_DATA_DIR")
    assert mnist.resolve_source("idx") == ("idx", None)
    with pytest.raises(mnist.DataError, match="needs data_dir or the CBO_JAX_DATA_DIR"):
        mnist.load_mnist("idx")
    with pytest.raises(ValueError, match="source must be"):
        mnist.resolve_source("idk")


def test_load_mnist_reads_what_resolve_source_names(tmp_path, monkeypatch):
    (tmp_path / "idx").mkdir()
    d = _fake_dir(tmp_path / "idx")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CBO_JAX_DATA_DIR", "idx")
    assert mnist.resolve_source() == ("idx", str(d))
    data = mnist.load_mnist()
    assert data.source == f"idx:{d}" and data.train_images.shape == (30, 28, 28)
    monkeypatch.delenv("CBO_JAX_DATA_DIR")
    assert mnist.load_mnist().source == "bundled"


@pytest.mark.parametrize("content", ["garbage", "missing_key", "pickled"])
def test_corrupt_bundled_subset_is_a_data_error_naming_the_file(tmp_path, monkeypatch, content):
    """A corrupt bundled subset (not an npz, an array missing, object arrays) was NumPy's
    ValueError or a bare KeyError; the module promises a DataError naming the file."""
    path = tmp_path / "mnist_subset.npz"
    if content == "garbage":
        path.write_bytes(b"not an npz file")
    elif content == "missing_key":
        np.savez(path, train_images=np.zeros((2, 28, 28), np.uint8))
    else:
        np.savez(path, train_images=np.array([None, 1], object), train_labels=np.zeros(2), test_images=np.zeros(2),
                 test_labels=np.zeros(2))
    monkeypatch.setattr(mnist, "BUNDLED_PATH", path)
    with pytest.raises(mnist.DataError, match="mnist_subset.npz"):
        mnist.load_bundled()
