"""The documentation builds with warnings as errors (docs/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # CI builds the docs in its own step too
def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "1", "-q", "-b", "html",
           "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert (out / "index.html").is_file()
    assert (out / "reproductions.html").is_file()


SNIPPETS = sorted((ROOT / "docs" / "snippets").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda p: p.stem)
def test_docs_snippet_runs(snippet, tmp_path):
    """Every code snippet the documentation includes runs as it is shown."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(snippet)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
