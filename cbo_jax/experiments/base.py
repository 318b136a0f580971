"""What every reproduction is made of: the :class:`Experiment` record, the options several
reproductions share (:class:`ReproduceOptions`, :class:`ResumeOptions`, :class:`ScaleOptions`,
:class:`MNISTOptions`, :class:`SeedOption`: dataclasses whose flags :func:`cbo_jax.config.add_options`
generates) and the argparse types of the options (counts and seeds, each a one-line usage error
naming the flag when out of range).

A reproduction's options are one frozen dataclass (``Experiment.options``): each field a flag
with its default, its type, choices and short names given with :func:`cbo_jax.config.option`,
its help the field's description in the class docstring; a shared group is a field whose type is
one of the classes here. ``run`` reads the parsed flags (``args.<field>``).

The reproductions (:mod:`cbo_jax.experiments.rastrigin_success`, ...) import these from here;
:func:`cbo_jax.experiments.registry` imports the reproductions, so the package's
``__init__`` holds none of what they need.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Callable

from cbo_jax.config import Field, add_options, option

__all__ = ["Experiment", "ReproduceOptions", "ResumeOptions", "ScaleOptions", "MNISTOptions", "SeedOption",
           "positive_int", "nonnegative_int", "seed", "jax_seed"]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A named reproduction.

    ``options``: the frozen dataclass of its own options (:meth:`add_arguments` adds their
    flags; the command adds :class:`ReproduceOptions` and, when resumable,
    :class:`ResumeOptions` before them). ``resumable``: it is made of federated runs, each in
    its own directory under ``--output``, and takes ``--resume`` (finished runs are read
    back, an unfinished one continues from its last checkpoint) and ``--checkpoint-every``
    (``args.resume`` and ``args.checkpoint_every`` reach ``run``).
    """

    name: str
    summary: str
    published: str
    options: type
    run: Callable[[argparse.Namespace], dict]
    resumable: bool = False

    def add_arguments(self, parser) -> dict[str, Field]:
        """Add the reproduction's own flags to ``parser`` (an ``argparse`` parser or group),
        generated from :attr:`options`; returns ``dest -> Field``."""
        return add_options(parser, self.options)


def _int_option(text: str, low: int, high: int | None, high_text: str = "") -> int:
    """An integer in ``[low, high]`` from an option's text, else a one-line usage error."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
    if high is not None and v > high:
        raise argparse.ArgumentTypeError(f"must be at most {high_text or high}, got {v}")
    return v


def positive_int(text: str) -> int:
    """argparse ``type`` for a count option (``--runs``, ``--seeds``, ``--rounds``, ...): an
    integer from 1 to ``2**31 - 1`` (JAX counts in int32), else a one-line usage error."""
    return _int_option(text, 1, 2**31 - 1, "2**31 - 1 (JAX counts in int32)")


def nonnegative_int(text: str) -> int:
    """argparse ``type`` for a count that may be 0 (``--steps``, ``--T-G``): an integer from 0 to
    ``2**31 - 1`` (JAX counts in int32; a larger count would run until killed)."""
    return _int_option(text, 0, 2**31 - 1, "2**31 - 1 (JAX counts in int32)")


def seed(text: str) -> int:
    """argparse ``type`` for a reproduction's ``--seed``/``--data-seed``: an integer from 0 to
    ``2**32 - 1`` (NumPy's generators refuse negative seeds; in this range a seed is the same
    JAX key with or without 64-bit mode)."""
    return _int_option(text, 0, 2**32 - 1, "2**32 - 1")


def jax_seed(text: str) -> int:
    """argparse ``type`` for a seed that only keys JAX (``cbo-jax optimize``): an integer from 0 to
    ``2**64 - 1``, each its own key (:func:`cbo_jax._checks.as_key`; below ``2**32`` the key
    ``jax.random.key(seed)``). Negative seeds are refused: 64 bits of key data cannot tell
    ``-2**63 .. 2**64 - 1`` apart, and ``-1`` would be the key of ``2**32 - 1``."""
    return _int_option(text, 0, 2**64 - 1, "2**64 - 1")


@dataclasses.dataclass(frozen=True)
class ReproduceOptions:
    """The options of every reproduction (``cbo-jax reproduce NAME``), before its own.

    Attributes:
      output: results directory (default results/NAME)
      overwrite: replace the results already in OUTPUT
      no_progress: no progress bar (the results are the same)
    """

    output: Path | None = None
    overwrite: bool = False
    no_progress: bool = False


@dataclasses.dataclass(frozen=True)
class ResumeOptions:
    """The options of a reproduction made of federated runs (``Experiment.resumable``).

    Attributes:
      resume: continue a reproduction stopped part-way in OUTPUT, with the same options: its
        finished runs are read back, an unfinished one continues from its last checkpoint
        (--checkpoint-every) or starts again
      checkpoint_every: checkpoint each run every ROUNDS rounds (OUTPUT/RUN/seedS/checkpoint),
        so that --resume continues it from there
    """

    resume: bool = False
    checkpoint_every: int | None = option(None, type=positive_int, metavar="ROUNDS")


@dataclasses.dataclass(frozen=True)
class ScaleOptions:
    """The size of a reproduction made of federated runs (``fedcbo-*``, ``fedcb2o-*``): one of
    its module's ``SCALES``, and the overrides of its seeds and rounds.

    Attributes:
      scale: the settings: small (a CPU-sized run) or paper (the paper's, GPU-sized)
      seeds: number of seeds (default: 3 small, 1 paper)
      rounds: override the scale's number of rounds T
    """

    scale: str = option("small", choices=("paper", "small"))
    seeds: int | None = option(None, type=positive_int)
    rounds: int | None = option(None, type=positive_int)


@dataclasses.dataclass(frozen=True)
class MNISTOptions:
    """Where a reproduction on rotated MNIST reads the images from.

    Attributes:
      source: MNIST source: auto (CBO_JAX_DATA_DIR, else bundled), idx, tfds, bundled
      data_dir: directory of the MNIST IDX files (default CBO_JAX_DATA_DIR), or the
        tensorflow-datasets data directory (--source tfds)
    """

    source: str = "auto"
    data_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class SeedOption:
    """The seed of a reproduction's runs.

    Attributes:
      seed: seed of the runs' randomness (0 to 2**32 - 1)
    """

    seed: int = option(0, type=seed)  # the argparse type seed() above (the field is not bound yet)
