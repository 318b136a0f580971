"""Figures for files, without pyplot.

The library writes its plots with :class:`matplotlib.figure.Figure` objects directly.
It never calls ``matplotlib.use`` or touches pyplot's figure registry, so running an
experiment inside a notebook leaves the notebook's own backend (inline plots) alone.

A figure from :func:`subplots` saved to a path is written as the results files are
(:func:`cbo_jax.runtime.writer.replace_bytes`): whole or not at all, never through a symbolic link
planted in the file's place (refused, naming it), a full disk named with the space.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path


@functools.cache
def _file_figure():
    from matplotlib.figure import Figure

    class FileFigure(Figure):
        """A ``Figure`` whose ``savefig(path)`` renders to memory and then replaces ``path`` (``replace_bytes``)."""

        def savefig(self, fname, *args, **kwargs):
            if not isinstance(fname, (str, os.PathLike)):  # a file object: as matplotlib writes it
                return super().savefig(fname, *args, **kwargs)
            from matplotlib import rcParams

            from cbo_jax.runtime.writer import replace_bytes

            path = Path(fname)
            fmt = kwargs.pop("format", None)
            if fmt is None:  # as matplotlib: the suffix's format, else the default one, whose suffix is added
                fmt = path.suffix[1:].lower() if path.suffix else rcParams["savefig.format"]
                if not path.suffix:
                    path = path.with_name(f"{path.name}.{fmt}")
            buf = io.BytesIO()
            super().savefig(buf, *args, format=fmt, **kwargs)
            replace_bytes(path, buf.getvalue())
            return None

    return FileFigure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    """Like ``pyplot.subplots`` but for a figure that is only saved: ``(fig, axes)``."""
    fig = _file_figure()(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)
