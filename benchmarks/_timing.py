"""The best wall time of repeated calls of a JAX function (what the timed tables report)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(fn: Callable, *args, repeats: int = 3, warm: bool = True) -> float:
    """The minimum over ``repeats`` calls of ``fn(*args)``, each waited for
    (``jax.block_until_ready``: dispatch is asynchronous); ``warm``: one untimed call first
    (compilation, first-touch allocation)."""
    import jax

    if warm:
        jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best
