"""Progress bars (tqdm's) for long simulations and federated runs.

On a terminal or in a notebook a bar redraws in place, at most ten times a second (tqdm's
default). Written to a file or a pipe (a batch job's log, CI), every redraw is another
carriage-return-separated copy of the line, so there a bar prints at most once every
:data:`LOG_INTERVAL_S` seconds, plus its first and last state. tqdm's own ``TQDM_MININTERVAL``
environment variable, where set, decides instead.

Numbers beside the bar (``postfix``) are set without a redraw of their own: they appear with
the next move, so they never print more often than the bar.
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOG_INTERVAL_S = 30.0
"""Least seconds between two prints of a bar whose output is not a terminal."""


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0) -> Any:
    """A ``tqdm.auto`` bar over ``total`` units, quieter when its output is a log file."""
    from tqdm.auto import tqdm

    kwargs: dict[str, Any] = {}
    if _to_log(tqdm):
        # maxinterval too: tqdm's monitor thread otherwise forces a redraw every 10 s once it
        # has raised the bar's miniters.
        kwargs.update(mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, **kwargs)


def advance(bar: Any, n: int, postfix: dict | None = None) -> None:
    """Move ``bar`` by ``n`` units, with ``postfix`` beside it (drawn with the move, if drawn)."""
    if postfix is not None:
        bar.set_postfix(postfix, refresh=False)
    bar.update(n)


def _to_log(cls: type) -> bool:
    """True when a bar of tqdm class ``cls`` writes to something other than a terminal."""
    if "notebook" in getattr(cls, "__module__", ""):  # a widget in Jupyter or Colab: redrawn in place
        return False
    if "TQDM_MININTERVAL" in os.environ:  # the user's own setting
        return False
    stream = sys.stderr  # where tqdm writes by default
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return True
