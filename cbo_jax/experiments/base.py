"""What every reproduction is made of: the :class:`Experiment` record and the argparse types of
its options (counts and seeds, each a one-line usage error naming the flag when out of range).

The reproductions (:mod:`cbo_jax.experiments.rastrigin_success`, ...) import these from here;
:func:`cbo_jax.experiments.registry` imports the reproductions, so the package's
``__init__`` holds none of what they need.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable

__all__ = ["Experiment", "positive_int", "nonnegative_int", "seed", "jax_seed"]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A named reproduction.

    ``resumable``: it is made of federated runs, each in its own directory under
    ``--output``, and takes ``--resume`` (finished runs are read back, an unfinished one
    continues from its last checkpoint) and ``--checkpoint-every`` (``args.resume`` and
    ``args.checkpoint_every`` reach ``run``).
    """

    name: str
    summary: str
    published: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict]
    resumable: bool = False


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
