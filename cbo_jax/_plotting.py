"""Figures for files, without pyplot.

The library writes its plots with :class:`matplotlib.figure.Figure` objects directly.
It never calls ``matplotlib.use`` or touches pyplot's figure registry, so running an
experiment inside a notebook leaves the notebook's own backend (inline plots) alone.
"""

from __future__ import annotations


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    """Like ``pyplot.subplots`` but for a figure that is only saved: ``(fig, axes)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)
