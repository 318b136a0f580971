"""Broken and unusual data inputs: IDX files (compression, damage), the data directory, the
tfds path, and the partitions' arguments (rotated MNIST, the label-flipping attack).

Every user error is a ``ValueError`` (``DataError`` for the data) naming the problem, never
a NumPy traceback or a silently wrong partition.
"""

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from cbo_jax.federated import attacks, mnist
from cbo_jax.federated import data as fdata
from cbo_jax.federated.mnist import MNIST

STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    magic = magic if magic is not None else {3: 2051, 1: 2049}[arr.ndim]
    dims = b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    return magic.to_bytes(4, "big") + dims + arr.astype(np.uint8).tobytes()


def _arrays(n_train=30, n_test=10) -> dict:
    rng = np.random.default_rng(0)
    return dict(zip(STEMS, (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train),
                            rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test))))


def _write_dir(d: Path, names=lambda stem: stem + ".gz", compress=True) -> Path:
    for stem, arr in _arrays().items():
        raw = _idx_bytes(arr)
        (d / names(stem)).write_bytes(gzip.compress(raw) if compress else raw)
    return d


def _source(n_train=40, n_test=20, classes=4, hw=(2, 2), seed=0, **over) -> MNIST:
    rng = np.random.default_rng(seed)
    fields = dict(train_images=rng.integers(0, 256, (n_train,) + hw).astype(np.uint8),
                  train_labels=np.arange(n_train, dtype=np.int32) % classes,
                  test_images=rng.integers(0, 256, (n_test,) + hw).astype(np.uint8),
                  test_labels=np.arange(n_test, dtype=np.int32) % classes, source="fake")
    fields.update(over)
    return MNIST(**fields)


# ---------------------------------------------------------------- IDX files and the data directory


@pytest.mark.parametrize("layout", ["gzip_without_suffix", "raw_with_gz_suffix"])
def test_compression_is_told_by_the_content_not_the_name(tmp_path, layout):
    """A gzipped file without .gz was 'bad magic number 529205256'; a raw file that kept
    its .gz (browsers decompress downloads) was 'cannot read (BadGzipFile)'. Both load."""
    (tmp_path / "ref").mkdir()
    reference = mnist.load_idx_dir(_write_dir(tmp_path / "ref"))
    d = tmp_path / layout
    d.mkdir()
    if layout == "gzip_without_suffix":
        _write_dir(d, names=lambda stem: stem, compress=True)
    else:
        _write_dir(d, names=lambda stem: stem + ".gz", compress=False)
    data = mnist.load_idx_dir(d)
    for a, b in zip(data[:4], reference[:4]):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


def test_gz_named_garbage_is_still_a_read_error(tmp_path):
    (tmp_path / "x.gz").write_bytes(b"not gzip at all")
    with pytest.raises(mnist.DataError, match="x.gz: cannot read"):
        mnist.read_idx(tmp_path / "x.gz", 1)
    (tmp_path / "y").write_bytes(b"not idx at all")
    with pytest.raises(mnist.DataError, match="y: bad magic number"):
        mnist.read_idx(tmp_path / "y", 1)


def test_header_whose_dimensions_overflow_int64_is_a_data_error(tmp_path):
    """2**31 x 2**31 x 4 is 2**64 bytes: np.prod wrapped it to 0 in int64, the length check passed
    for an empty body, and NumPy's reshape raised 'cannot reshape array of size 0'."""
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(b"".join(v.to_bytes(4, "big") for v in (2051, 2**31, 2**31, 4)))
    with pytest.raises(mnist.DataError, match=r"t10k-images-idx3-ubyte: 0 data bytes, but the header's dimensions "
                                              r"\[2147483648, 2147483648, 4\] need 18446744073709551616"):
        mnist.read_idx(path, 3)


@pytest.mark.parametrize("ndim", [2, "3", 3.0, True])
def test_read_idx_refuses_other_dimension_counts(tmp_path, ndim):
    """ndim=2 was a bare KeyError: 2, ndim='3' a TypeError from the header arithmetic."""
    path = tmp_path / "a"
    path.write_bytes(_idx_bytes(np.zeros((2, 3), np.uint8), magic=2050))
    with pytest.raises(ValueError, match="ndim must be 3 .images. or 1 .labels."):
        mnist.read_idx(path, ndim)


@pytest.mark.parametrize("damage, match", [
    ("truncated_gzip", "cannot read .EOFError"),
    ("flipped_gzip_byte", "cannot read .(BadGzipFile|zlib.error|error)"),
    ("short_header", "is too short for an IDX header"),
    ("labels_as_images", "bad magic number 2049, expected 2051"),
    ("one_label_missing", "test has 10 images but 9 labels"),
    ("label_out_of_range", "label 200 outside 0..9"),
])
def test_damaged_files_name_file_and_problem(tmp_path, damage, match):
    d = _write_dir(tmp_path)
    labels = d / "t10k-labels-idx1-ubyte.gz"
    images = d / "t10k-images-idx3-ubyte.gz"
    if damage == "truncated_gzip":
        raw = labels.read_bytes()
        labels.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped_gzip_byte":
        raw = bytearray(images.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        images.write_bytes(bytes(raw))
    elif damage == "short_header":
        images.write_bytes(gzip.compress(_idx_bytes(np.zeros((1, 28, 28)))[:10]))
    elif damage == "labels_as_images":
        shutil.copy(labels, images)
    elif damage == "one_label_missing":
        labels.write_bytes(gzip.compress(_idx_bytes(_arrays()["t10k-labels-idx1-ubyte"][:9])))
    else:
        labels.write_bytes(gzip.compress(_idx_bytes(np.full(10, 200))))
    with pytest.raises(mnist.DataError, match=match) as err:
        mnist.load_idx_dir(d)
    assert str(d) in str(err.value)


def test_missing_directory_says_it_does_not_exist(tmp_path, monkeypatch):
    """A directory that does not exist was only 'not a directory'; from the environment, the
    message did not say where the path came from."""
    with pytest.raises(mnist.DataError, match=r"nope: not a directory \(it does not exist\)$"):
        mnist.load_idx_dir(tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(mnist.DataError, match=r"file: not a directory \(it is a file\)$"):
        mnist.load_idx_dir(tmp_path / "file")
    monkeypatch.setenv("CBO_JAX_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(mnist.DataError, match=r"gone: not a directory \(it does not exist\); the directory comes from "
                                              r"CBO_JAX_DATA_DIR='.*gone': unset it to use the bundled subset$"):
        mnist.load_mnist()
    with pytest.raises(mnist.DataError, match=r"comes from CBO_JAX_DATA_DIR='.*gone'$"):  # idx: no bundled fallback
        mnist.load_mnist("idx")
    with pytest.raises(mnist.DataError, match=r"elsewhere: not a directory \(it does not exist\)$"):  # given
        mnist.load_mnist("idx", tmp_path / "elsewhere")
    monkeypatch.delenv("CBO_JAX_DATA_DIR")
    assert mnist.load_mnist().source == "bundled"


def test_tfds_empty_split_is_refused_like_an_empty_idx_file(tfds):
    """tfds giving 0 examples returned empty arrays (the IDX path refuses them at load time)."""
    with tfds.testing.mock_data(num_examples=0):
        with pytest.raises(mnist.DataError, match="0 images for mnist/train; the train split must not be empty"):
            mnist.load_tfds()


def test_real_mnist_reads_the_same_gunzipped_or_misnamed(tmp_path):
    """Skipped without CBO_JAX_DATA_DIR (the reason says how to run it); fails in CI without it."""
    from conftest import real_mnist

    _, reference = real_mnist()
    (tmp_path / "misnamed").mkdir()
    for stem, arr in zip(STEMS, reference[:4]):
        raw = _idx_bytes(arr)  # the files' bytes after gunzip
        (tmp_path / stem).write_bytes(raw)  # as `gunzip *.gz` leaves them
        (tmp_path / "misnamed" / f"{stem}.gz").write_bytes(raw)  # decompressed by a browser, name kept
    for d in (tmp_path, tmp_path / "misnamed"):
        for a, b in zip(mnist.load_idx_dir(d)[:4], reference[:4]):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- rotated MNIST


@pytest.mark.parametrize("k", [4.0, True, np.float64(2.0), "4"])
def test_rotated_mnist_refuses_non_integer_cluster_counts(k):
    """4.0 ended in 'samples_per_agent must be an integer, got 10.0' (or a TypeError in the
    slicing), and True silently meant one cluster."""
    with pytest.raises(ValueError, match=r"num_clusters \(rotation count\) must be one of \[1, 2, 4\], got"):
        fdata.rotated_mnist(_source(), 4, k, samples_per_agent=2)


def test_rotated_mnist_numpy_integer_cluster_count_is_the_int():
    a = fdata.rotated_mnist(_source(), 4, np.int64(4), samples_per_agent=3, seed=1)
    b = fdata.rotated_mnist(_source(), 4, 4, samples_per_agent=3, seed=1)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("n_train", [40, 0])
def test_more_agents_than_images_names_the_agents(n_train):
    """41 agents per cluster over 40 images (or any over none) was 'samples_per_agent must be
    >= 1, got 0' although no samples_per_agent was given."""
    src = _source(n_train=n_train)
    with pytest.raises(ValueError, match=f"num_agents=164 puts 41 agents in each of the 4 clusters, but the source "
                                         f"\\(fake\\) has {n_train} training images"):
        fdata.rotated_mnist(src, 164, 4)
    # the reference script's protocol draws with replacement: more agents than images is fine
    d = fdata.rotated_mnist(_source(), 164, 4, samples_per_agent=2, subset=10)
    assert d.x.shape == (164, 2, 2, 2)


def test_too_many_images_per_agent_says_what_fits():
    """`cbo-jax run fedcbo` on the bundled subset (the paper's 1200 agents of 200 images) said
    what it needed and not what would run: the images per agent and the agents that fit, the
    whole MNIST where it suffices, or a shared subset."""
    bundled = _source(n_train=100, source="bundled")
    with pytest.raises(ValueError, match=r"samples_per_agent=20 needs 200 training images per cluster, but the "
                                         r"source \(bundled\) has 100. Options: samples_per_agent <= 10 \(for 40 "
                                         r"agents\); num_agents <= 20 \(at 20 images each\); the whole MNIST training "
                                         r"set \(60000 images: .*\); or subset=S"):
        fdata.rotated_mnist(bundled, 40, 4, samples_per_agent=20)
    assert fdata.rotated_mnist(bundled, 40, 4, samples_per_agent=10).x.shape[:2] == (40, 10)
    assert fdata.rotated_mnist(bundled, 20, 4, samples_per_agent=20).x.shape[:2] == (20, 20)
    # more images than one cluster has: no agent count fits, and the source is not the bundled subset
    with pytest.raises(ValueError, match=r"Options: samples_per_agent <= 25 \(for 16 agents\); or subset=S"):
        fdata.rotated_mnist(bundled._replace(source="idx"), 16, 4, samples_per_agent=101)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None, True])
def test_partitions_refuse_seeds_that_do_not_fix_them(seed):
    """-1 / 1.5 were NumPy's SeedSequence errors; None drew a partition no seed reproduces."""
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        fdata.rotated_mnist(_source(), 4, 4, samples_per_agent=2, seed=seed)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        attacks.label_flip_rotated(_source(), _flip(), seed=seed)


@pytest.mark.parametrize("bad, match", [
    (dict(train_labels=np.zeros(35, np.int32)), r"has 40 train images but train labels of shape \(35,\)"),
    (dict(train_labels=np.zeros(45, np.int32)), r"has 40 train images but train labels of shape \(45,\)"),
    (dict(test_labels=np.zeros((20, 1), np.int32)), r"has 20 test images but test labels of shape \(20, 1\)"),
    (dict(train_images=np.zeros((40, 4), np.uint8)), r"train images must be \(n, H, W\), got shape \(40, 4\)"),
])
def test_inconsistent_source_is_a_data_error(bad, match):
    """More labels than images paired them silently with the wrong images; fewer was an IndexError."""
    src = _source(**bad)
    with pytest.raises(mnist.DataError, match=match):
        fdata.rotated_mnist(src, 4, 2, samples_per_agent=2)
    with pytest.raises(mnist.DataError, match=match):
        attacks.label_flip_rotated(src, _flip())


def test_quarter_turns_need_square_images():
    """Non-square images with K = 4 failed in np.stack ('all input arrays must have the same shape')."""
    src = _source(hw=(2, 3))
    with pytest.raises(mnist.DataError, match=r"train images are 2x3: rotations by \[0, 90, 180, 270\] degrees need "
                                              r"square images"):
        fdata.rotated_mnist(src, 4, 4, samples_per_agent=2)
    assert fdata.rotated_mnist(src, 4, 2, samples_per_agent=2).x.shape == (4, 2, 2, 3)  # 0 and 180 keep the shape


# ---------------------------------------------------------------- label flipping


def _flip(**kw):
    base = dict(source=2, target=1, num_classes=4, benign_per_cluster=2, malicious_per_cluster=1, benign_samples=6,
                val_samples=2, malicious_samples=5)
    return attacks.LabelFlipConfig(**{**base, **kw})


@pytest.mark.parametrize("split", ["train", "test"])
def test_attack_on_a_class_the_data_lacks_is_refused(split):
    """EMNIST's 'O' (24) on MNIST flipped nothing, and with no source-class test images the
    source-class accuracy and the attack success rate came out as 0 %."""
    labels = {"train": dict(train_labels=np.arange(40, dtype=np.int32) % 2),
              "test": dict(test_labels=np.arange(20, dtype=np.int32) % 2)}[split]
    with pytest.raises(ValueError, match=f"the source class 2 has no {split} images in the data \\(fake\\)"):
        attacks.label_flip_rotated(_source(**labels), _flip())


def test_test_labels_beyond_num_classes_are_refused():
    src = _source(test_labels=np.arange(20, dtype=np.int32) % 5)
    with pytest.raises(ValueError, match=r"num_classes \(4\) is smaller than the data's largest test label 4"):
        attacks.label_flip_rotated(src, _flip())


def test_label_flip_partition_follows_the_paper():
    """Per cluster: benign and malicious images disjoint, 30 % attackers (35 + 15), only the
    source label flipped; seeds reproduce and differ."""
    src = _source(n_train=200, n_test=20, hw=(3, 3))
    cfg = _flip(benign_per_cluster=7, malicious_per_cluster=3, benign_samples=10, val_samples=2, malicious_samples=20)
    ds = attacks.label_flip_rotated(src, cfg, seed=5)
    assert ds.malicious.mean() == pytest.approx(0.3) and ds.x_train.shape == (14, 8, 3, 3)
    assert ds.x_val.shape == (14, 2, 3, 3) and ds.x_mal.shape == (6, 20, 3, 3)
    changed = ds.y_mal != ds.y_mal_clean
    assert np.all(ds.y_mal_clean[changed] == 2) and np.all(ds.y_mal[changed] == 1) and np.all(ds.y_mal != 2)
    flat = src.train_images.reshape(200, -1)
    for k, deg in enumerate(fdata.ROTATIONS[2]):
        imgs = np.concatenate([ds.x_train[ds.cluster[:14] == k].reshape(-1, 3, 3),
                               ds.x_val[ds.cluster[:14] == k].reshape(-1, 3, 3),
                               ds.x_mal[ds.cluster[14:] == k].reshape(-1, 3, 3)])
        idx = [int(np.flatnonzero((flat == r.ravel()).all(1))[0]) for r in fdata.rotate(imgs, -deg)]
        assert len(set(idx)) == len(idx) == 7 * 10 + 3 * 20
    again, other = attacks.label_flip_rotated(src, cfg, seed=5), attacks.label_flip_rotated(src, cfg, seed=6)
    np.testing.assert_array_equal(again.x_mal, ds.x_mal)
    assert not np.array_equal(other.x_mal, ds.x_mal)
