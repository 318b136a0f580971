"""The one loop under every run: compiled chunks on the device, the host's work in between.

:func:`cbo_jax.simulate` (the steps of a particle system) and :func:`cbo_jax.federated.run`
(the rounds of a federated algorithm) are the same loop: a state advanced by a jitted
``lax.scan`` of some steps at a time, and between two scans the host's work: the progress
bar, the rows written, an evaluation, a checkpoint, an early stop. :func:`drive` is that loop;
:class:`Output` groups what a run writes and shows, checked once; :class:`RunFiles` holds the
open files of one run (the results directory's lock, the rows' writer, the progress bar) and
closes them however the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable

from cbo_jax import _checks

__all__ = ["Output", "RunFiles", "drive"]


@dataclasses.dataclass(frozen=True)
class Output:
    """What a run writes and shows.

    Attributes:
      directory: the results directory (``None``: nothing is written).
      overwrite: replace the results already there.
      resume: continue the run the directory holds (federated runs).
      extend: with ``resume``, allow another number of rounds.
      tensorboard: also write TensorBoard event files.
      progress: show a progress bar.
      plots: draw the run's curves to ``metrics.png`` (federated runs).
      log_every: write every this many steps (particle runs; ``None``: about 1000 rows).
      checkpoint_every: checkpoint every this many rounds (federated runs).
    """

    directory: Path | None = None  # a str is taken too
    overwrite: bool = False
    resume: bool = False
    extend: bool = False
    tensorboard: bool = False
    progress: bool = False
    plots: bool = True
    log_every: int | None = None
    checkpoint_every: int | None = None

    def __post_init__(self):
        _checks.flags(overwrite=self.overwrite, resume=self.resume, extend=self.extend, tensorboard=self.tensorboard,
                      progress=self.progress, plots=self.plots)
        for name in ("log_every", "checkpoint_every"):
            if getattr(self, name) is not None:
                _checks.positive_int(name, getattr(self, name))
        if self.directory is not None:
            object.__setattr__(self, "directory", Path(self.directory))  # a str given
        if self.extend and not self.resume:  # extend alone would silently start a new run of the extended length
            raise ValueError("extend continues a run: it needs resume=True")
        if self.resume and self.overwrite:  # the run would resume and silently ignore overwrite
            raise ValueError("resume continues the results in out and overwrite replaces them: give one of them")
        if self.directory is None:
            unused = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                      if f.name not in ("directory", "progress", "plots") and getattr(self, f.name) != f.default]
            if unused:
                raise ValueError(f"{', '.join(unused)} concern the files of out=DIRECTORY, and out is not given")

    @property
    def files(self) -> Path:
        """The results directory (an error when there is none: the caller checked ``directory``)."""
        if self.directory is None:
            raise ValueError("this run writes no files (out=None)")
        return self.directory


class RunFiles(contextlib.ExitStack):
    """The open files of one run, closed however it ends: the rows' writer and the progress bar
    (:meth:`finish`, or at exit), then the results directory's lock. ``writer`` and ``bar`` are
    ``None`` where the run writes nothing or shows no bar."""

    def __init__(self):
        super().__init__()
        self.writer: Any = None
        self.bar: Any = None
        self._streams = self.enter_context(contextlib.ExitStack())

    def hold(self, directory: Path, **results_dir) -> None:
        """Take the results directory (:class:`cbo_jax.runtime.results.ResultsDir`: created, locked,
        checked for earlier results and planted links) until the run ends."""
        from cbo_jax.runtime.results import ResultsDir

        self.enter_context(ResultsDir(directory, **results_dir))

    def open_writer(self, directory: Path, **kwargs) -> Any:
        """The rows' writer (:class:`cbo_jax.runtime.writer.MetricsWriter`)."""
        from cbo_jax.runtime.writer import MetricsWriter

        self.writer = self._streams.enter_context(MetricsWriter(directory, **kwargs))
        return self.writer

    def open_bar(self, total: int, *, desc: str, unit: str, initial: int = 0) -> Any:
        """The progress bar (:func:`cbo_jax.runtime.progress.progress_bar`)."""
        from cbo_jax.runtime.progress import progress_bar

        self.bar = progress_bar(total, desc=desc, unit=unit, initial=initial)
        self._streams.callback(self.bar.close)
        return self.bar

    def finish(self) -> None:
        """Close the writer and the bar now (the directory stays held): the rows are on disk."""
        self._streams.close()


def drive(state: Any, done: int, total: int, *, next_stop: Callable[[int], int],
          scan: Callable[[Any, int, int], tuple[Any, Any]], length: Callable[[int, int], int],
          at_stop: Callable[[Any, int, int, list], tuple[Any, int, bool]]) -> tuple[Any, int]:
    """Advance ``state`` from step ``done`` to ``total``; return ``(state, steps done)``.

    The host stops at ``next_stop(done)`` (an evaluation, a checkpoint, the end of a chunk); to get
    there it runs ``scan(state, done, n) -> (state, record)`` for ``n = length(done, stop)`` steps
    at a time (the compiled scans), then ``at_stop(state, start, done, records) -> (state, done,
    halt)`` with the ``(n, record)`` of the scans since ``start``: the host's work, which may take
    back steps that ran after every run had stopped (``done``) and end the run early (``halt``).
    Where the scans end changes no number: a scan of ``n`` steps is ``n`` steps.
    """
    while done < total:
        stop = next_stop(done)
        start, records = done, []
        while done < stop:
            n = length(done, stop)
            state, record = scan(state, done, n)
            records.append((n, record))
            done += n
        state, done, halt = at_stop(state, start, done, records)
        if halt:
            break
    return state, done
