"""The code on the documentation's pages is on the pages, and it runs as a reader would run it.

Every fenced ``python`` block of ``docs/*.md`` and ``docs/guides/*.md`` is run: a page's
blocks in order, in one namespace, as one script in a fresh process started in an empty
directory (what the code writes lands there), the way a reader pastes them one after the
other. Two first lines change that (docs/development.md, "The documentation's code"):

- ``# not run`` (and why, after a colon): a fragment whose names are the reader's own;
- ``# examples/NAME.py: OBJECT``: a copy of that top-level function or class of the example
  script, which ``tests/examples/test_scripts.py`` runs; the rest of the block must equal its source.

An error's traceback names the page and its line. The pages' code runs about 2 minutes in all
on 2 CPU cores, so it runs in CI's slow step; the other checks here are quick.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("guides/*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
NOT_RUN = "# not run"
COPY = re.compile(r"# (examples/[\w/]+\.py): (\w+)\n")
# Pages whose time goes into running rather than compiling: XLA's backend optimisation on for
# them (the test run turns it off, tests/conftest.py); index.md's 5000 CBO steps took 64 s without, 18 s with.
LONG_RUNNING = {"index.md"}
# Runs the script (argv[1]) under the page's name (argv[2]): a traceback shows the page's lines.
RUNNER = ("import sys; path, page = sys.argv[1:]; sys.argv = [page]; "
          "exec(compile(open(path, encoding='utf-8').read(), page, 'exec'), {'__name__': '__main__'})")


def _blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ``python`` block of ``page``; ``line``: the code's first line, counted from 0."""
    text = page.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in BLOCK.finditer(text)]


def _script(page: Path) -> str:
    """The page's runnable blocks, each at its own lines; every other line of the page is blank."""
    lines = [""] * (page.read_text(encoding="utf-8").count("\n") + 1)
    for start, code in _blocks(page):
        if not (code.startswith(NOT_RUN) or COPY.match(code)):
            for i, line in enumerate(code.splitlines()):
                lines[start + i] = line
    return "\n".join(lines)


def _name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


RUNNABLE = [page for page in PAGES if _script(page).strip()]


def test_the_pages_show_their_code():
    """No page takes its code from a file (a repository's page renders no ``literalinclude``), and the
    runnable pages are the ones expected (a page whose blocks all opt out would not be noticed)."""
    including = [_name(p) for p in PAGES if "{literalinclude}" in p.read_text(encoding="utf-8")]
    assert not including, f"pages that include code from files: {including}"
    assert not (DOCS / "snippets").exists()
    assert {"index.md", "getting_started.md", "results.md", "guides/fedcb2o.md"} <= {_name(p) for p in RUNNABLE}


def test_copied_blocks_equal_their_source():
    """A block that shows an example's function (``# examples/NAME.py: OBJECT``) is that function, as it is."""
    copies = 0
    for page in PAGES:
        for start, code in _blocks(page):
            m = COPY.match(code)
            if not m:
                continue
            source = (ROOT / m.group(1)).read_text(encoding="utf-8")
            defs = [n for n in ast.parse(source).body if getattr(n, "name", None) == m.group(2)]
            assert len(defs) == 1, f"{_name(page)}:{start + 1}: {m.group(1)} defines no top-level {m.group(2)}"
            shown = code[m.end():].rstrip("\n")
            assert shown == ast.get_source_segment(source, defs[0]), (
                f"{_name(page)}:{start + 1}: the block differs from {m.group(2)} in {m.group(1)}; copy it again")
            copies += 1
    assert copies >= 1  # docs/guides/extending.md shows fedavgm


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_code_runs(page, tmp_path, request):
    """The page's blocks run in order, in one namespace, without an error."""
    script = _script(page)
    if "CBO_JAX_DATA_DIR" in script:  # the real MNIST files: skipped without them, failed in CI
        from conftest import real_mnist

        real_mnist()
    if _name(page) in LONG_RUNNING:
        request.getfixturevalue("optimized_xla")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if "XLA_FLAGS" in script:  # the page sets XLA's flags itself (scaleout.md: 4 simulated devices)
        env.pop("XLA_FLAGS", None)
    path = tmp_path / "page.py"
    path.write_text(script, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(page)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
