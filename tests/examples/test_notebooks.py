"""The example notebooks: in sync with their scripts, valid, and executed in small mode.

Execution runs every notebook top to bottom in a Jupyter kernel (nbclient) with
``CBO_JAX_SMALL=1``. It takes several minutes on 2 CPU cores, so it is marked
``notebooks`` and left out of the default ``pytest -q`` (see pyproject.toml); CI runs it
with ``pytest -q -m notebooks`` after installing the ``notebooks`` extra.
"""

import json
import os
from pathlib import Path

import pytest

from cbo_jax import notebook

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples" / "notebooks").glob("[0-9][0-9]_*.py"))


def test_the_six_notebooks_exist():
    names = [s.stem for s in SCRIPTS]
    assert names == ["01_cbo_basics", "02_fedcbo_rotated_mnist", "03_meanfield", "04_fedcb2o_attack",
                     "05_fedsgld_synthetic", "06_cbx_family"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_matches_its_script(script):
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.is_file(), f"run: python -m cbo_jax.notebook {script.relative_to(ROOT)}"
    assert ipynb.read_text() == notebook.notebook_json(script), (
        f"{ipynb.name} is out of date; run: python -m cbo_jax.notebook {script.relative_to(ROOT)}")
    # the pairing is a round trip: the notebook, read back by jupytext, is the script byte for byte
    assert notebook.notebook_to_script(ipynb.read_text()) == script.read_text()
    nb = json.loads(ipynb.read_text())
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds[0] == "markdown" and "code" in kinds
    assert all(c.get("outputs", []) == [] for c in nb["cells"])
    # the first code cell installs cbo_jax when it is missing (Colab) and picks the size
    setup = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert "pip" in setup and "small_mode()" in "".join("".join(c["source"]) for c in nb["cells"])


def _install_commands(setup: str, monkeypatch, env: dict[str, str]) -> list[list[str]]:
    """The commands the first code cell's install block runs on a runtime without cbo_jax."""
    import importlib.util
    import subprocess

    block = setup.split("\nif importlib.util.find_spec", 1)[1].split("\n\n", 1)[0]
    calls: list[list[str]] = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cbo_jax" else object())
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(list(cmd)))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import os
    import sys

    exec("if importlib.util.find_spec" + block, {"importlib": importlib, "os": os, "subprocess": subprocess,  # noqa: S102
                                                   "sys": sys})
    return calls


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_install_cell_installs_the_distribution_by_name(script, monkeypatch):
    import re
    import sys

    name = re.search(r'^name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert name == "cbo-jax"
    nb = json.loads(script.with_suffix(".ipynb").read_text())
    setup = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert "until it is on pypi" in setup.lower()  # the cell says what to do before the package is published
    monkeypatch.delenv("CBO_JAX_PIP_SOURCE", raising=False)
    assert _install_commands(setup, monkeypatch, {}) == [[sys.executable, "-m", "pip", "install", "-q", name]]
    wheel = "/content/cbo_jax-0.1.0-py3-none-any.whl"
    assert _install_commands(setup, monkeypatch, {"CBO_JAX_PIP_SOURCE": wheel}) == [
        [sys.executable, "-m", "pip", "install", "-q", wheel]]


def test_converter_cells_and_errors(tmp_path):
    nb = notebook.script_to_notebook("# %% [markdown]\n# # Title\n#\n# text $x$\n\n# %%\nx = 1\n\n\n# %%\n\n"
                                     "print(x)\n")
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code", "code"]
    assert nb["cells"][0]["source"] == ["# Title\n", "\n", "text $x$"]
    assert nb["cells"][2]["source"] == ["print(x)"]
    one_cell = notebook._with_ids(notebook.script_to_notebook("# %%\nx = 1\n"), "t")
    assert notebook.notebook_to_script(json.dumps(one_cell)) == "# %%\nx = 1\n"
    with pytest.raises(ValueError, match="no '# %%' cells"):
        notebook.script_to_notebook("x = 1\n")
    script = tmp_path / "demo.py"
    script.write_text("# %%\nprint(1)\n")
    assert notebook.main([str(script)]) == 0
    assert json.loads((tmp_path / "demo.ipynb").read_text())["cells"][0]["source"] == ["print(1)"]


@pytest.mark.parametrize("name,content,match", [
    ("missing.py", None, "No such file"),
    ("cells.py", "x = 1\n", "no '# %%' cells"),
    ("demo.ipynb", "{}", "expected a .py script"),
])
def test_converter_command_refuses_bad_input_in_one_line(tmp_path, capsys, name, content, match):
    """``python -m cbo_jax.notebook`` (docs/getting_started.md) printed a traceback for a missing file."""
    if content is not None:
        (tmp_path / name).write_text(content)
    assert notebook.main([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cbo_jax.notebook: error:") and match in err and "Traceback" not in err


def test_small_mode_switch(monkeypatch):
    monkeypatch.setenv("CBO_JAX_SMALL", "0")
    assert notebook.small_mode() is False
    monkeypatch.setenv("CBO_JAX_SMALL", "1")
    assert notebook.small_mode() is True
    monkeypatch.setenv("CBO_JAX_SMALL", "yes")
    with pytest.raises(ValueError, match="CBO_JAX_SMALL"):
        notebook.small_mode()
    monkeypatch.delenv("CBO_JAX_SMALL")
    assert notebook.small_mode() is True  # the test machine has no accelerator
    assert not notebook.in_notebook()


@pytest.mark.notebooks
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_executes_in_small_mode(script, tmp_path, monkeypatch, optimized_xla):
    # the kernel compiles with XLA's backend optimisation (the test run turns it off): the notebooks
    # run whole federated runs, and took 157 s for the six unoptimised against 142 s optimised
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("CBO_JAX_SMALL", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    assert images >= 2, "every notebook shows at least two figures"
    saved = list((tmp_path / "results" / "notebooks" / script.stem).glob("*.png"))
    assert saved, "figures are saved under results/notebooks/<name>/"
    assert os.environ["CBO_JAX_SMALL"] == "1"
