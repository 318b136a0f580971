"""The standard image sets through tensorflow-datasets (:mod:`cbo_jax.federated.datasets`), on tfds'
mock data (no network here): their shapes, dtypes and classes, colour images through the rotated
benchmark, the model ``cbo-jax run`` picks for each, the ``data.dataset`` option and its record,
and the error that says how to prepare data that is not there."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.cli import build_parser, main
from cbo_jax.cli.flags import config_from_args
from cbo_jax.experiments import federated as fx
from cbo_jax.federated import data as fdata
from cbo_jax.federated import datasets, mnist
from cbo_jax.federated.runner import model_record

# name -> (tfds name, image shape, classes): the published facts, written out here
FACTS = {
    "mnist": ("mnist", (28, 28), 10),
    "emnist": ("emnist/balanced", (28, 28), 47),
    "fashion_mnist": ("fashion_mnist", (28, 28), 10),
    "cifar10": ("cifar10", (32, 32, 3), 10),
    "cifar100": ("cifar100", (32, 32, 3), 100),
}


def _raw(tfds, name, split):
    """The mock split read with tfds directly: images as tfds stores them, (n, H, W, C), and labels."""
    source = tfds.data_source(name, split=split, download=False)
    return (np.stack([np.asarray(source[i]["image"]) for i in range(len(source))]),
            np.array([int(source[i]["label"]) for i in range(len(source))]))


@pytest.mark.parametrize("name", sorted(FACTS))
def test_each_dataset_loads_in_the_layout_of_the_mnist_loaders(tfds, name):
    tfds_name, shape, classes = FACTS[name]
    assert (datasets.DATASETS[name].tfds_name, datasets.DATASETS[name].image_shape,
            datasets.DATASETS[name].num_classes) == (tfds_name, shape, classes)
    with tfds.testing.mock_data(num_examples=9):
        data = datasets.load_dataset(name)
        raw_train, raw_labels = _raw(tfds, tfds_name, "train")
    assert isinstance(data, mnist.MNIST) and data.source == f"tfds:{tfds_name}"
    for split in ("train", "test"):
        images, labels = getattr(data, f"{split}_images"), getattr(data, f"{split}_labels")
        assert images.shape == (9, *shape) and images.dtype == np.uint8
        assert labels.shape == (9,) and labels.dtype == np.int32 and 0 <= labels.min() and labels.max() < classes
    # grey images lose their one channel; EMNIST's are turned upright (tfds stores them transposed)
    want = raw_train[..., 0] if len(shape) == 2 else raw_train
    if name == "emnist":
        want = want.transpose(0, 2, 1)
    np.testing.assert_array_equal(data.train_images, want)
    np.testing.assert_array_equal(data.train_labels, raw_labels)


def test_mnist_through_the_generic_loader_is_mnists_tfds_source(tfds):
    with tfds.testing.mock_data(num_examples=7):
        generic = datasets.load_dataset("mnist")
    with tfds.testing.mock_data(num_examples=7):
        own = mnist.load_tfds()
    for a, b in zip(generic[:4], own[:4]):
        np.testing.assert_array_equal(a, b)


def test_unknown_dataset_and_wrong_shapes_are_refused(tfds, monkeypatch):
    with pytest.raises(ValueError, match=r"dataset must be one of \['cifar10', 'cifar100', 'emnist'"):
        datasets.load_dataset("svhn")
    monkeypatch.setitem(datasets.DATASETS, "cifar10", dataclasses.replace(datasets.DATASETS["cifar10"],
                                                                          image_shape=(28, 28)))
    with tfds.testing.mock_data(num_examples=3):
        with pytest.raises(mnist.DataError, match=r"tfds:cifar10 train: images of shape \(32, 32, 3\), expected "
                                                  r"\(28, 28\)"):
            datasets.load_dataset("cifar10")


def test_not_prepared_says_how(tfds, tmp_path, capsys):
    """No CIFAR-10 in the data directory: the loader and ``cbo-jax run --dataset cifar10`` name the
    directory and the commands that prepare it as array_record files (what tfds.data_source reads)."""
    empty = tmp_path / "tfds"
    empty.mkdir()
    with pytest.raises(mnist.DataError) as err:
        datasets.load_dataset("fashion_mnist", empty)
    assert f"there is no {empty / 'fashion_mnist'}" in str(err.value)
    assert f"tfds build fashion_mnist --file_format=array_record --data_dir={empty}" in str(err.value)
    code = main(["run", "fedavg", "--dataset", "cifar10", "--data-dir", str(empty), "--no-progress",
                 "--output", str(tmp_path / "out")])
    text = capsys.readouterr().err
    assert code == 2
    assert f"cifar10 is not prepared in {empty}: there is no {empty / 'cifar10'}" in text
    assert f"tfds build cifar10 --file_format=array_record --data_dir={empty}" in text
    assert "tfds convert_format" in text and f"--data-dir {empty}" in text


def test_rotated_benchmark_of_colour_images(tfds):
    """Cluster k of the rotated benchmark holds its images turned by k quarter turns counter-clockwise:
    checked pixel by pixel against the index formula out[r, c] = in[c, W - 1 - r] for 90°."""
    rng = np.random.default_rng(0)
    src = mnist.MNIST(rng.integers(0, 256, (24, 5, 5, 3), dtype=np.uint8), rng.integers(0, 10, 24).astype(np.int32),
                      rng.integers(0, 256, (6, 5, 5, 3), dtype=np.uint8), rng.integers(0, 10, 6).astype(np.int32),
                      "test")
    fed = fdata.rotated_mnist(src, num_agents=4, num_clusters=4, samples_per_agent=6, seed=1)
    assert fed.x.shape == (4, 6, 5, 5, 3) and fed.test_x.shape == (4, 6, 5, 5, 3)

    def quarter(img):  # one quarter turn counter-clockwise, by index
        h, w = img.shape[:2]
        return np.array([[img[c, w - 1 - r] for c in range(w)] for r in range(h)])

    def turned(img, k):
        for _ in range(k % 4):
            img = quarter(img)
        return img

    for k in range(4):
        for i in range(6):
            np.testing.assert_array_equal(fed.test_x[k, i], turned(src.test_images[i], k))
        for img, label in zip(fed.x[k], fed.y[k]):  # a source image turned k times, with its label
            upright = turned(img, 4 - k)
            hits = np.flatnonzero((src.train_images == upright[None]).all(axis=(1, 2, 3)))
            assert hits.size and src.train_labels[hits[0]] == label
    with pytest.raises(mnist.DataError, match=r"train images must be \(n, H, W\), got shape \(24, 5, 5, 3, 1\) "
                                              r"\(test\); colour images \(n, H, W, C\)"):
        fdata.rotated_mnist(src._replace(train_images=src.train_images[..., None]), 4, 4, 6)


def test_cnn_has_the_published_parameter_count():
    """McMahan et al. 2017: their MNIST CNN has 1,663,370 parameters; on 32x32x3 the count below."""
    count = lambda m: sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(jax.eval_shape(  # noqa: E731
        m.init, jax.random.key(0))))
    assert count(models.cnn((28, 28), 10)) == 1_663_370
    conv = (5 * 5 * 3 * 32 + 32) + (5 * 5 * 32 * 64 + 64)
    assert count(models.cnn((32, 32, 3), 10)) == conv + (8 * 8 * 64 * 512 + 512) + (512 * 10 + 10)
    out = jax.eval_shape(models.cnn((32, 32, 3), 100).apply, jax.eval_shape(models.cnn((32, 32, 3), 100).init,
                                                                            jax.random.key(0)),
                         jax.ShapeDtypeStruct((2, 32, 32, 3), np.uint8))
    assert out.shape == (2, 100)
    with pytest.raises(ValueError, match="input_shape must be one image"):
        models.cnn((4,), 10)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_the_model_fits_the_dataset(name):
    _, shape, classes = FACTS[name]
    data = fx.RotatedMNISTConfig(dataset=name)
    model = fx.model_of(data)
    assert model.num_classes == classes
    expected = "mlp" if name == "mnist" else "cnn"
    assert fx.resolve_data(data).model == expected and model.name.startswith(expected)
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((3, *shape), np.uint8)).shape == (3, classes)
    other = fx.model_of(dataclasses.replace(data, model="cnn" if name == "mnist" else "mlp"))
    assert other.name.startswith("cnn" if name == "mnist" else "mlp") and other.num_classes == classes
    if name == "mnist":  # today's model, as before
        assert model_record(model) == model_record(models.mlp_mnist())


def test_dataset_option_flag_alias_and_checks(tmp_path, monkeypatch):
    parser = build_parser()
    for flags in (["--dataset", "cifar10"], ["--data.dataset", "cifar10"]):
        args = parser.parse_args(["run", "fedavg", *flags])
        cfg = config_from_args("fedavg", args, args.run_flags)
        assert cfg.data.dataset == "cifar10" and cfg.data.model == "auto"
    args = parser.parse_args(["run", "fedavg"])
    assert config_from_args("fedavg", args, args.run_flags).data.dataset == "mnist"
    with pytest.raises(ValueError, match=r"dataset must be one of \['cifar10', 'cifar100', 'emnist', 'fashion_mnist', "
                                         r"'mnist'\], got 'svhn'"):
        fx.RotatedMNISTConfig(dataset="svhn")
    with pytest.raises(ValueError, match="model must be one of"):
        fx.RotatedMNISTConfig(model="resnet")
    with pytest.raises(ValueError, match="data.source 'bundled' is MNIST's; the cifar10 images are read with "
                                         "tensorflow-datasets"):
        fx.RotatedMNISTConfig(dataset="cifar10", source="bundled")
    # the other sets: tfds, the directory absolute when given, MNIST's CBO_JAX_DATA_DIR not read
    monkeypatch.setenv("CBO_JAX_DATA_DIR", str(tmp_path / "idx"))
    monkeypatch.chdir(tmp_path)
    assert fx.resolve_data(fx.RotatedMNISTConfig(dataset="emnist")) == fx.RotatedMNISTConfig(
        dataset="emnist", source="tfds", data_dir=None, model="cnn")
    assert fx.resolve_data(fx.RotatedMNISTConfig(dataset="emnist", data_dir="tf")).data_dir == str(tmp_path / "tf")
    mnist_now = fx.resolve_data(fx.RotatedMNISTConfig())  # MNIST: as before, the variable's IDX directory
    assert (mnist_now.source, mnist_now.data_dir, mnist_now.model) == ("idx", str(tmp_path / "idx"), "mlp")


def test_resume_refuses_another_dataset(tmp_path):
    """``--resume`` of a results directory whose config.json records another data set is refused,
    naming the flag, before any data is read."""
    cfg = fx.default_config("fedavg", data=fx.RotatedMNISTConfig(source="bundled", agents=8, samples_per_agent=20))
    out = tmp_path / "run"
    out.mkdir()
    recorded = fx.cfgs.to_dict(dataclasses.replace(cfg, data=fx.resolve_data(cfg.data)))
    (out / "config.json").write_text(json.dumps(recorded))
    other = fx.replace(cfg, **{"data.dataset": "cifar10", "data.source": "auto"})
    with pytest.raises(ValueError, match=r"cannot resume .*\n  --data.dataset: 'mnist' in .*config.json, 'cifar10' "
                                         r"now\n  --data.model: 'mlp' in .*, 'cnn' now"):
        fx.run_experiment(other, out, progress=False, resume=True)
    # a record of a version before data.dataset (no such field): MNIST, the resume's check passes it
    older = {**recorded, "data": {k: v for k, v in recorded["data"].items() if k not in ("dataset", "model")}}
    (out / "config.json").write_text(json.dumps(older))
    fx._check_resume(dataclasses.replace(cfg, data=fx.resolve_data(cfg.data)), out, extend=False)


def test_config_file_of_a_cifar_run_names_its_cnn(tmp_path):
    """A CIFAR-10 run's config.json is a --config file: its model record (the CNN) is this run's;
    the MLP's record with dataset cifar10, or the CNN's with MNIST, is refused."""
    cfg = fx.default_config("fedavg", data=fx.RotatedMNISTConfig(dataset="cifar10", agents=8, samples_per_agent=20))
    cfg = dataclasses.replace(cfg, data=fx.resolve_data(cfg.data))
    record = {**fx.cfgs.to_dict(cfg), "model": model_record(fx.model_of(cfg.data))}
    assert record["model"]["name"] == "cnn-32x32x3-32-64-512-10"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    parser = build_parser()
    args = parser.parse_args(["run", "fedavg", "--config", str(path)])
    assert config_from_args("fedavg", args, args.run_flags) == cfg
    args = parser.parse_args(["run", "fedavg", "--config", str(path), "--dataset", "mnist", "--data.model", "auto"])
    with pytest.raises(ValueError, match=r"records the model 'cnn-32x32x3-32-64-512-10' .* trains 'mlp-784-200-10'"):
        config_from_args("fedavg", args, args.run_flags)
    path.write_text(json.dumps({**record, "model": model_record(models.mlp_mnist())}))
    args = parser.parse_args(["run", "fedavg", "--config", str(path)])
    with pytest.raises(ValueError, match=r"records the model 'mlp-784-200-10' .* trains 'cnn-32x32x3-32-64-512-10'"):
        config_from_args("fedavg", args, args.run_flags)
