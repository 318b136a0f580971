"""The modules that moved into :mod:`cbo_jax.runtime`, importable by their old names (deprecated).

``import cbo_jax.checkpoint``, ``from cbo_jax import provenance`` and
``from cbo_jax.writer import write_summary`` still work, with a :class:`DeprecationWarning`
naming the new place; ``python -m cbo_jax.notebook`` still runs. The old name is the same
module object as the new one (``sys.modules`` holds it under both names once the old one is
imported), so whatever is set on it through either name is seen through the other. No file
is left at the old place: a finder at the end of ``sys.meta_path`` answers the old names
that no file answers. ``cbo_jax.checkpoint`` and ``cbo_jax.writer`` are also
attributes of the package (``cj.checkpoint.save``), set by ``cbo_jax/__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

# old name -> new name
MOVED = {
    "cbo_jax.checkpoint": "cbo_jax.runtime.checkpoint",
    "cbo_jax.compilation_cache": "cbo_jax.runtime.compilation_cache",
    "cbo_jax.distributed": "cbo_jax.runtime.distributed",
    "cbo_jax.notebook": "cbo_jax.runtime.notebook",
    "cbo_jax.provenance": "cbo_jax.runtime.provenance",
    "cbo_jax.report": "cbo_jax.runtime.report",
    "cbo_jax.writer": "cbo_jax.runtime.writer",
    # private modules, internal in cbo_jax.runtime: no stable surface, resolvable for code that reaches in
    "cbo_jax._plotting": "cbo_jax.runtime.plotting",
    "cbo_jax._progress": "cbo_jax.runtime.progress",
    "cbo_jax._repr": "cbo_jax.runtime.display",
    "cbo_jax._results": "cbo_jax.runtime.results",
}


def message(old: str) -> str:
    """The deprecation message for ``old`` (pyproject.toml's pytest filter matches its start)."""
    return (f"{old} moved to {MOVED[old]}; the old name is deprecated and will be removed in a future "
            f"release: import {MOVED[old]}")


class _Loader(importlib.abc.Loader):
    """Loads an old name as the module at its new name."""

    def __init__(self, old: str):
        self.old = old

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder module; exec_module puts the real one in its place in sys.modules

    def exec_module(self, module: ModuleType) -> None:
        # stacklevel 2: the frame that imported (the import system's own frames are skipped)
        warnings.warn(message(self.old), DeprecationWarning, stacklevel=2)
        # The import system returns (and binds on the parent package) what sys.modules holds
        # under the old name after exec_module: the module at the new name itself.
        sys.modules[self.old] = importlib.import_module(MOVED[self.old])

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code: ``python -m OLD`` (runpy) runs the new module as ``__main__``."""
        warnings.warn(message(self.old), DeprecationWarning, stacklevel=2)
        spec = importlib.util.find_spec(MOVED[self.old])
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "get_code"):
            raise ImportError(f"no code for {MOVED[self.old]}", name=fullname)
        return loader.get_code(MOVED[self.old])

    def is_package(self, fullname: str) -> bool:
        return False


class Finder(importlib.abc.MetaPathFinder):
    """Answers the old names of :data:`MOVED`, and only those."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        new = importlib.util.find_spec(MOVED[fullname])
        return importlib.util.spec_from_loader(fullname, _Loader(fullname),
                                               origin=new.origin if new is not None else None)


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once; a reload of the package does not add another)."""
    if not any(type(f).__module__ == __name__ and type(f).__name__ == "Finder" for f in sys.meta_path):
        sys.meta_path.append(Finder())
