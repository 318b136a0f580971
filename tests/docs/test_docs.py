"""The README is a short first page whose commands, files and numbers are real; the documentation
builds with warnings as errors (docs/README.md); the changelog names the current version."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _fenced(text: str, lang: str) -> list[str]:
    return [ln for block in re.findall(rf"```{lang}\n(.*?)```", text, re.S) for ln in block.splitlines() if ln.strip()]


def test_readme_is_short():
    assert len(README.splitlines()) < 120


def test_readme_links_and_named_files_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+://", link)]
    named = re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.\w+|[\w-]+\.(?:md|py|toml))`", _prose(README))
    assert local and named
    missing = sorted({f for f in local + named if not (ROOT / f).exists()})
    assert not missing, f"README names files that do not exist: {missing}"


def test_readme_cli_commands_parse():
    """Every `cbo-jax ...` line of the README is accepted by the real parser (subcommands and flags)."""
    from cbo_jax.cli import build_parser

    lines = [ln.split("#")[0].strip() for ln in _fenced(README, "bash")]
    lines += re.findall(r"`(cbo-jax [^`]+)`", _prose(README))
    commands = [ln for ln in lines if ln.startswith("cbo-jax ")]
    assert any(c.startswith("cbo-jax demo") for c in commands) and "cbo-jax --version" in commands
    for cmd in commands:
        if "&&" in cmd:
            cmd = cmd.split("&&")[1].strip()
        words = shlex.split(cmd)[1:]
        if words == ["--version"]:
            continue
        try:
            build_parser().parse_args(words)
        except SystemExit as exit_:  # --help exits 0; a bad subcommand or flag exits 2
            assert exit_.code == 0, f"README command does not parse: {cmd}"


def test_readme_pip_commands_name_real_extras():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = set(re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0], re.M))
    named = re.findall(r'pip install -e "\.\[([\w,]+)\]"', README)
    assert named and set(",".join(named).split(",")) <= extras


def _floors_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_floors", ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_requirement_has_the_lower_bound_ci_installs(tmp_path):
    """.ci/min_versions.sh installs exactly the lower bounds pyproject.toml states, for the dependencies and the
    test extra (.ci/dev_floors.sh those of the docs and typecheck extras); a requirement without a lower bound is
    refused, so none can join untested."""
    module = _floors_module()
    floors = module.floors(ROOT / "pyproject.toml")
    pins = dict(f.split("==") for f in floors)
    assert {"jax", "jaxlib", "flax", "optax", "chex", "numpy", "orbax-checkpoint", "pytest"} <= set(pins)
    assert pins["jax"] == pins["jaxlib"]
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project]\ndependencies = ["jax>=0.7.0", "optax"]\n[project.optional-dependencies]\ntest = []\n')
    with pytest.raises(SystemExit, match="optax: no lower bound"):
        module.floors(bad)
    # The docs build and the type check on their extras' bounds (.ci/dev_floors.sh).
    dev = dict(f.split("==") for f in module.floors(ROOT / "pyproject.toml", ("docs", "typecheck")))
    assert set(dev) == {"sphinx", "myst-parser", "furo", "mypy"}
    with pytest.raises(SystemExit, match="no extra named nope"):
        module.floors(ROOT / "pyproject.toml", ("docs", "nope"))


def _numbers(text: str) -> list[str]:
    """Decimal numbers in ``text`` (not version-like names such as Apache-2.0)."""
    return re.findall(r"(?<![\w.])(?<![A-Za-z]-)-?\d+\.\d+(?:e-?\d+)?", text)


def _shown_in(number: str, values: list[float]) -> bool:
    """``number`` is one of ``values`` rounded to the digits it shows."""
    d = Decimal(number)
    tol = float(Decimal(1).scaleb(d.as_tuple().exponent)) / 2 * (1 + 1e-9)
    return any(abs(v - float(d)) <= tol for v in values)


def test_readme_numbers_come_from_linked_benchmark_files():
    """Outside code, every decimal number the README states sits in a paragraph or list item that links a file in
    benchmarks/ or the experiment catalog, and that file holds the number (to the digits shown)."""
    items = re.split(r"\n(?=- )|\n\n", _prose(README))
    checked = 0
    for item in items:
        numbers = _numbers(item)
        if not numbers:
            continue
        sources = [s for s in re.findall(r"\]\(([^)#\s]+)", item)
                   if s.startswith("benchmarks/") or s == "cbo_jax/experiments/catalog.py"]
        assert sources, f"numbers {numbers} without a linked benchmarks/ file or the catalog:\n{item}"
        values = [float(v) for src in sources for v in _numbers((ROOT / src).read_text().replace("−", "-"))]
        missing = [n for n in numbers if not _shown_in(n, values)]
        assert not missing, f"{missing} are not in {sources}"
        checked += len(numbers)
    assert checked >= 3


def test_changelog_has_the_current_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)


def _results_rows() -> dict[str, str]:
    """docs/results.md's table rows: first cell (without backticks) -> the rest of the row."""
    text = (ROOT / "docs" / "results.md").read_text()
    return {m.group(1).replace("`", ""): m.group(2) for m in re.finditer(r"^\| (.+?) \| (.+) \|$", text, re.M)}


def test_results_page_names_every_file_and_config_key():
    """docs/results.md lists every file a run writes and the top-level keys of each
    config.json; a file or key added to the code and not to the page fails here."""
    import jax

    import cbo_jax.federated as fl
    from cbo_jax import models
    from cbo_jax._results import RUN_FILES
    from cbo_jax.config import to_dict
    from cbo_jax.experiments.federated import default_config
    from cbo_jax.federated.runner import _config_record

    rows = _results_rows()
    files = {name.rstrip("/") for name in rows}
    assert set(RUN_FILES) | {"history.npz", "options.json", ".lock"} <= files

    def listed(writer: str) -> set[str]:
        """The row's keys: its backticked names outside parentheses (those explain a key)."""
        cell, depth, kept = rows[writer].split("|")[0], 0, ""
        for ch in cell:
            depth += (ch == "(") - (ch == ")")
            kept += ch if depth == 0 and ch != ")" else ""
        return set(re.findall(r"`(\w+)`", kept))

    model = models.mlp_mnist(hidden=(2,), num_classes=3, input_shape=(2, 2))
    alg = fl.fedavg(model, fl.FedAvgConfig(), 4)
    assert set(_config_record(alg, None, 2, 1, jax.random.key(0))) == listed("fl.run(..., out=DIR) without config")
    assert set(to_dict(default_config("fedcbo"))) | {"model"} == listed(
        "cbo-jax run, cbo-jax demo, fedcbo-table1, fedcbo-noise")


@pytest.mark.slow  # CI builds the docs in its own step too
def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q", "-b", "html",
           "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert (out / "index.html").is_file()
    assert (out / "reproductions.html").is_file()

