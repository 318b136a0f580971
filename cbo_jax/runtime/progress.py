"""Progress bars (tqdm's) for long simulations and federated runs.

On a terminal or in a notebook a bar redraws in place, at most ten times a second (tqdm's
default). Written to a file or a pipe (a batch job's log, CI), every redraw is another
carriage-return-separated copy of the line, so there a bar prints at most once every
:data:`LOG_INTERVAL_S` seconds, plus its first and last state. tqdm's own ``TQDM_MININTERVAL``
environment variable, where set, decides instead.

Numbers beside the bar (``postfix``) are set without a redraw of their own: they appear with
the next move, so they never print more often than the bar. Until its first move a bar says
:data:`COMPILING`: the first chunk of steps or rounds compiles before it returns (half a minute
for a large run, with the bar at 0 % and no word).

:class:`Stopwatch` is the clock of a run's ``elapsed_s`` and ``seconds``: the time of its work,
without the time the process was stopped.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any

LOG_INTERVAL_S = 30.0
"""Least seconds between two prints of a bar whose output is not a terminal."""

COMPILING = "compiling…"
"""A bar's postfix until its first move."""


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0) -> Any:
    """A ``tqdm.auto`` bar over ``total`` units, quieter when its output is a log file; it says
    :data:`COMPILING` until :func:`advance` first moves it."""
    from tqdm.auto import tqdm

    kwargs: dict[str, Any] = {}
    if _to_log(tqdm):
        # maxinterval too: tqdm's monitor thread otherwise forces a redraw every 10 s once it
        # has raised the bar's miniters.
        kwargs.update(mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, postfix=COMPILING, **kwargs)


def advance(bar: Any, n: int, postfix: dict | None = None) -> None:
    """Move ``bar`` by ``n`` units, with ``postfix`` beside it (drawn with the move, if drawn)."""
    if postfix is not None:
        bar.set_postfix(postfix, refresh=False)
    elif getattr(bar, "postfix", None) == COMPILING:
        bar.set_postfix_str("", refresh=False)
    bar.update(n)


# --------------------------------------------------------------------------------------
# the run's clock
# --------------------------------------------------------------------------------------

BEAT_S = 0.25
"""Seconds between two beats of the thread that watches for stops."""
LATE_S = 1.0
"""A beat later than this (beyond :data:`BEAT_S`), with the process's CPU clock still in between
(less than :data:`BUSY` of the gap), means the process did not run: stopped (Ctrl-Z, ``SIGSTOP``,
a batch scheduler's suspend). That time is not work. A beat late because the process was busy
(its CPU clock ran: a long call holding the interpreter, a loaded machine) is work."""
BUSY = 0.1

_lock = threading.Lock()
_watches: weakref.WeakSet = weakref.WeakSet()  # the live stopwatches: the thread beats while there are any
_thread: threading.Thread | None = None
_last_beat = 0.0
_last_cpu = 0.0  # the process's CPU time (every thread's) at the last beat
_stopped_s = 0.0  # the stops the thread has seen, in total


def _stop(now: float, cpu: float) -> float:
    """Seconds stopped since the last beat (under ``_lock``): the lateness of a beat when the
    process used (almost) no CPU time meanwhile, else 0."""
    late = now - _last_beat - BEAT_S
    return late if late > LATE_S and cpu - _last_cpu < BUSY * late else 0.0


def _beat() -> None:
    global _thread, _last_beat, _last_cpu, _stopped_s
    while True:
        time.sleep(BEAT_S)
        with _lock:
            now, cpu = time.perf_counter(), time.process_time()
            _stopped_s += _stop(now, cpu)
            _last_beat, _last_cpu = now, cpu
            if not _watches:
                _thread = None
                return


def _stopped(now: float) -> float:
    """Seconds stopped up to ``now`` (under ``_lock``), a stop the thread has not seen yet included."""
    return _stopped_s + (_stop(now, time.process_time()) if _thread is not None else 0.0)


def _after_fork() -> None:  # the child has no watching thread: the next stopwatch starts one
    global _lock, _thread, _last_beat, _last_cpu
    _lock, _thread, _last_beat, _last_cpu = threading.Lock(), None, time.perf_counter(), time.process_time()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Stopwatch:
    """Seconds of work since it was made, plus ``offset`` (the work of earlier processes of a
    resumed run): the wall time less the time the process was stopped and continued (Ctrl-Z
    and ``fg``, ``SIGSTOP`` and ``SIGCONT``, a batch scheduler's suspend and resume), which a
    wall clock counted as work. A thread beats every :data:`BEAT_S` seconds while a stopwatch
    lives; a beat more than :data:`LATE_S` seconds late, the process's CPU clock still
    meanwhile, marks a stop. Calling it gives the seconds; they never go backwards."""

    def __init__(self, offset: float = 0.0):
        global _thread, _last_beat, _last_cpu
        self.offset = float(offset)
        with _lock:
            now = time.perf_counter()
            if _thread is None:
                _last_beat, _last_cpu = now, time.process_time()
                thread = threading.Thread(target=_beat, name="cbo_jax-stopwatch", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no threads here: a wall clock
                    thread = None
                _thread = thread
            _watches.add(self)
            self._start, self._stopped = now, _stopped(now)
        self._shown = 0.0

    def __call__(self) -> float:
        with _lock:
            now = time.perf_counter()
            work = now - self._start - (_stopped(now) - self._stopped)
        self._shown = max(self._shown, work)
        return self.offset + self._shown


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
