"""Sphinx configuration for the cbo_jax documentation.

Build (from the repository root)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

# Importing the package must not grab an accelerator or print JAX warnings into the build.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import cbo_jax  # noqa: E402

# -- Project ---------------------------------------------------------------------------
project = "cbo_jax"
author = "cbo_jax developers"
copyright = "2026, cbo_jax developers"
release = cbo_jax.__version__
version = release

# -- Extensions ------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "_generated", "README.md", "Thumbs.db", ".DS_Store"]

# MyST: $...$ and $$...$$ math, amsmath environments, ::: fences, heading anchors.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_dmath_double_inline = True
myst_heading_anchors = 3

# -- autodoc / autosummary / napoleon --------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": False,
}
# Signatures stay readable: type hints go into the description, not the signature line.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
# "Attributes:" sections become field lists; the fields themselves are not documented a
# second time (see _skip_namedtuple_fields), so no duplicate object descriptions.
napoleon_use_ivar = True

# -- HTML ------------------------------------------------------------------------------
try:  # one optional theme package; alabaster ships with Sphinx
    importlib.import_module("furo")
    html_theme = "furo"
except ImportError:
    html_theme = "alabaster"
html_title = f"cbo_jax {release}"
html_static_path: list[str] = []


# -- Generated pages -------------------------------------------------------------------
GENERATED = DOCS / "_generated"


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it already holds exactly that (keeps rebuilds incremental)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _reproductions_table() -> tuple[str, str | None]:
    """The reproductions table from ``cbo_jax.experiments.catalog.reproductions_markdown()``.

    Returns ``(markdown, problem)``. The table is never written by hand: when the catalogue
    cannot be imported, the page says so and the build reports a warning (an error under
    ``-W``).
    """
    try:
        catalog = importlib.import_module("cbo_jax.experiments.catalog")
        table = catalog.reproductions_markdown()
    except Exception as err:  # noqa: BLE001 - reported as a build warning below
        problem = f"cbo_jax.experiments.catalog.reproductions_markdown() failed: {type(err).__name__}: {err}"
        return f"*The reproductions table could not be generated ({problem}).*\n", problem
    return table.rstrip() + "\n", None


_REPRODUCTIONS, _REPRODUCTIONS_PROBLEM = _reproductions_table()
_write_if_changed(GENERATED / "reproductions.md", _REPRODUCTIONS)


# -- Re-exports ------------------------------------------------------------------------
# Packages that re-export names from their submodules get a table linking to the defining
# module instead of documenting every object twice (which Sphinx would flag as duplicates).
REEXPORTING = ("cbo_jax", "cbo_jax.dynamics", "cbo_jax.federated", "cbo_jax.federated.algorithms")


def _reexports(package: str) -> list[str]:
    mod = importlib.import_module(package)
    out = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if getattr(obj, "__name__", None) and type(obj).__name__ == "module":
            out.append(obj.__name__)
        else:
            out.append(f"{obj.__module__}.{obj.__qualname__}")
    return out


# Modules whose code is split over private siblings (``cbo_jax.objectives._planar``,
# ``cbo_jax.federated._eval_metrics``, ...) and re-exported: their summary tables list
# those classes and functions too, as autosummary does for the ones a module defines itself.
SPLIT = ("cbo_jax.objectives", "cbo_jax.federated.data", "cbo_jax.federated.metrics", "cbo_jax.runtime.report")


def _summary(module: str) -> list[str]:
    """The public classes, then functions, that ``module`` defines or takes from a private
    module of its package, each group sorted (autosummary's ``classes + functions``)."""
    import inspect

    mod = importlib.import_module(module)
    package = module if hasattr(mod, "__path__") else module.rpartition(".")[0]
    found: dict[bool, list[str]] = {True: [], False: []}
    for name in sorted(vars(mod)):
        obj = getattr(mod, name)
        home = getattr(obj, "__module__", None) or ""
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if home == module or home.startswith(package + "._"):
            found[inspect.isclass(obj)].append(name)
    return found[True] + found[False]


autosummary_context = {"reexports": {p: _reexports(p) for p in REEXPORTING},
                       "summaries": {m: _summary(m) for m in SPLIT}}

# Several modules share their name with the function they define and their package
# re-exports (``cbo_jax.simulate`` the module vs ``cbo_jax.simulate`` the function;
# likewise ``cbo_jax.dynamics.cbo`` and ``cbo_jax.federated.algorithms.{fedcbo, fedavg,
# ifca, local_only}``). autosummary resolves a dotted name as ``PACKAGE.ATTRIBUTE`` first
# and would document the function in place of the module. A name that is an importable
# module means the module here.
import inspect  # noqa: E402

import sphinx.ext.autosummary as _autosummary  # noqa: E402

_import_by_name_orig = getattr(_autosummary, "_import_by_name", None)


def _import_by_name_preferring_modules(name, *args, **kwargs):
    obj, parent, modname = _import_by_name_orig(name, *args, **kwargs)
    if not inspect.ismodule(obj):
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = None
        if module is not None:
            return module, None, name
    return obj, parent, modname


if _import_by_name_orig is not None:
    _autosummary._import_by_name = _import_by_name_preferring_modules

# The one-line summaries in autosummary tables end at the first ". "; the docstrings cite
# equations as "eq. (4)" and "eqs. (19)-(21)", which are abbreviations, not sentence ends.
if hasattr(_autosummary, "WELL_KNOWN_ABBREVIATIONS"):
    _autosummary.WELL_KNOWN_ABBREVIATIONS = (*_autosummary.WELL_KNOWN_ABBREVIATIONS, "eq.", "eqs.", "Eq.", "Eqs.")


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    """Skip NamedTuple fields: their docstring is Python's "Alias for field number N".

    The classes describe their fields in their own "Attributes:" sections.
    """
    doc = getattr(obj, "__doc__", None) or ""
    if what == "class" and doc.startswith("Alias for field number"):
        return True
    return None


def _report_reproductions_problem(app):
    if _REPRODUCTIONS_PROBLEM:
        from sphinx.util import logging

        logging.getLogger(__name__).warning("reproductions table: %s", _REPRODUCTIONS_PROBLEM)


def setup(app):
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
    app.connect("builder-inited", _report_reproductions_problem)
