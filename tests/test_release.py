"""Release metadata: one version (the installed metadata), `cbo-jax --version`, the demo's size option,
the typing marker and the package data that a wheel must carry.

These tests import only the installed package (no file of the source tree), so the CI's wheel step runs this
file against the wheel installed in a fresh virtual environment (.ci/wheel_check.sh).
"""

from __future__ import annotations

import json
from importlib import metadata
from importlib.resources import files

import pytest

import cbo_jax
from cbo_jax.cli import main


def test_version_is_the_installed_metadata():
    assert cbo_jax.__version__ == metadata.version("cbo-jax")
    assert cbo_jax.__version__[0].isdigit()


def test_cli_version_prints_the_metadata_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"cbo-jax {metadata.version('cbo-jax')}"


def test_demo_rounds_option_reaches_the_demo(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_run_demo(out, seed=0, progress=True, rounds=None):
        seen.update(out=out, seed=seed, progress=progress, rounds=rounds)
        return {"fedcbo": 1.0, "rounds": rounds}

    import cbo_jax.experiments.demo as demo

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    assert main(["demo", "--rounds", "2", "--no-progress", "--output", str(tmp_path)]) == 0
    assert seen == {"out": tmp_path, "seed": 0, "progress": False, "rounds": 2}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rounds"] == 2
    assert main(["demo", "--no-progress", "--output", str(tmp_path)]) == 0
    assert seen["rounds"] is None  # the demo's own default (15 rounds)
    with pytest.raises(SystemExit):
        main(["demo", "--rounds", "0"])


def test_package_carries_its_data_and_typing_marker():
    root = files("cbo_jax")
    assert root.joinpath("py.typed").is_file()
    data = root.joinpath("data")
    assert data.joinpath("README.md").is_file()
    assert any(p.name.endswith(".npz") for p in data.iterdir())


def test_bundled_mnist_subset_loads():
    from cbo_jax.federated.mnist import load_bundled

    mnist = load_bundled()
    assert mnist.train_images.shape[1:] == (28, 28) and len(mnist.train_images) == len(mnist.train_labels) > 0
    assert len(mnist.test_images) == len(mnist.test_labels) > 0
    assert set(int(v) for v in mnist.train_labels) == set(range(10))


# Exported functions whose signatures are not annotated yet. The test fails when one of them gains its annotations,
# so the list only shrinks.
NOT_YET_ANNOTATED: set[str] = set()


def test_public_functions_have_annotated_signatures():
    import inspect
    import types

    import cbo_jax.federated as fl

    incomplete = set()
    for mod in (cbo_jax, fl):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, types.ModuleType) or not inspect.isfunction(obj):
                continue
            sig = inspect.signature(obj)
            if (sig.return_annotation is inspect.Signature.empty
                    or any(p.annotation is inspect.Parameter.empty for p in sig.parameters.values())):
                incomplete.add(f"{mod.__name__}.{name}")
    assert incomplete == NOT_YET_ANNOTATED
