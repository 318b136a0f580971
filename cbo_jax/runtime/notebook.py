"""Helpers for the example notebooks, and the script → notebook converter.

The notebooks in ``examples/notebooks/`` are written as plain Python scripts in the
"percent" format: a line ``# %%`` starts a code cell and ``# %% [markdown]`` starts a
Markdown cell whose lines are comments. The scripts run as they are
(``python examples/notebooks/01_cbo_basics.py``), and::

    python -m cbo_jax.runtime.notebook examples/notebooks/*.py

writes the matching ``.ipynb`` files (no outputs) through jupytext, which the test suite keeps in sync
in both directions (script → notebook → script is exact).

Inside the notebooks:

* :func:`small_mode` is the size switch: small problems on a CPU, the full sizes on a
  GPU/TPU, overridden by the environment variable ``CBO_JAX_SMALL`` (``1`` or ``0``);
* :class:`LiveFigure` redraws a matplotlib figure in place while a simulation runs in a
  notebook, and saves it to a file when the code runs as a script.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

__all__ = ["small_mode", "device_summary", "in_notebook", "LiveFigure", "script_to_notebook", "notebook_to_script",
           "notebook_json", "main"]


def small_mode() -> bool:
    """True for the laptop-sized settings: ``$CBO_JAX_SMALL`` if set, else "no accelerator"."""
    env = os.environ.get("CBO_JAX_SMALL")
    if env is not None:
        if env not in ("0", "1"):
            raise ValueError(f"CBO_JAX_SMALL must be 0 or 1, got {env!r}")
        return env == "1"
    import jax

    return jax.default_backend() == "cpu"


def device_summary() -> str:
    """One line: JAX version, backend and devices."""
    import jax

    devs = jax.devices()
    return f"JAX {jax.__version__}, backend {jax.default_backend()}, {len(devs)} x {devs[0].device_kind}"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (Colab included), False in a plain Python process."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython()
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


class LiveFigure:
    """A matplotlib figure shown once and redrawn in place (notebooks) or saved (scripts).

    Args:
      fig: the figure to show.
      path: where :meth:`close` saves it (in a notebook and in a script alike; :meth:`update`
        only redraws the notebook's image); None to not save.
    """

    def __init__(self, fig, path: str | Path | None = None):
        self.fig = fig
        self.path = Path(path) if path is not None else None
        self._handle = None
        if in_notebook():
            from IPython.display import display

            # a PNG rather than the figure itself: shown whatever matplotlib backend is active
            self._handle = display(self._image(), display_id=True)

    def _image(self):
        from IPython.display import Image

        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", dpi=80)
        return Image(data=buf.getvalue(), format="png")

    def update(self) -> None:
        """Redraw after the figure's artists changed."""
        if self._handle is not None:
            self._handle.update(self._image())

    def close(self) -> Path | None:
        """Final redraw; save to ``path`` if given; release the figure. Returns the path."""
        import matplotlib.pyplot as plt

        self.update()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fig.savefig(self.path, dpi=100)
        plt.close(self.fig)
        return self.path


# ----------------------------------------------------------------------------- converter

_CELL_MARKER = "# %%"


def script_to_notebook(text: str) -> dict:
    """A percent-format script as an nbformat-4 notebook dict (cells only, no outputs).

    The cells are parsed by jupytext (``py:percent``); leading and trailing blank lines of a cell
    and empty cells are dropped. The notebook metadata is fixed (a Colab GPU runtime, the Python 3
    kernel), so the ``.ipynb`` text depends on the script only. Needs the ``notebooks`` (or ``test``)
    extra, which installs jupytext.
    """
    import jupytext

    if not any(line.startswith(_CELL_MARKER) for line in text.splitlines()):
        raise ValueError("no '# %%' cells found")
    cells: list[dict] = []
    for parsed in jupytext.reads(text, fmt="py:percent").cells:
        body = parsed.source.strip("\n")
        if not body.strip():
            continue
        cell = {"cell_type": parsed.cell_type, "metadata": {}, "source": body.splitlines(keepends=True)}
        if parsed.cell_type == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {
        "cells": cells,
        "metadata": {
            "accelerator": "GPU",
            "colab": {"provenance": []},
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def notebook_to_script(ipynb_text: str) -> str:
    """The percent-format script of an ``.ipynb`` text (jupytext, without notebook or cell metadata).

    The inverse of :func:`notebook_json` for the repository's notebooks: the test suite checks that
    ``notebook_to_script(notebook_json(script)) == script.read_text()``.
    """
    import jupytext

    nb = jupytext.reads(ipynb_text, fmt="ipynb")
    nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "-all"}
    return jupytext.writes(nb, fmt="py:percent")


def _with_ids(nb: dict, stem: str) -> dict:
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"{stem[:40]}-{i}"
    return nb


def notebook_json(script: str | Path) -> str:
    """The ``.ipynb`` text for ``script`` (deterministic: cell ids from the file name)."""
    path = Path(script)
    nb = _with_ids(script_to_notebook(path.read_text()), path.stem)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m cbo_jax.runtime.notebook SCRIPT.py ...``: write SCRIPT.ipynb beside each script."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m cbo_jax.runtime.notebook SCRIPT.py [SCRIPT.py ...]", file=sys.stderr)
        return 2
    for name in args:
        src = Path(name)
        out = src.with_suffix(".ipynb")
        if src.suffix != ".py":  # a notebook given by mistake would be written over by its own conversion
            print(f"cbo_jax.notebook: error: {name}: expected a .py script", file=sys.stderr)
            return 2
        try:
            out.write_text(notebook_json(src))
        except (OSError, UnicodeDecodeError, ValueError) as err:  # a missing file, no '# %%' cells, ...
            print(f"cbo_jax.notebook: error: {name}: {err}", file=sys.stderr)
            return 2
        print(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
