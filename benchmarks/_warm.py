"""Untimed warm-up before each timed run of an interleaved benchmark.

On the 2-core benchmark machine (a virtual machine) a core that idled for a few hundred
milliseconds runs the next 50–150 ms up to 1.9x slower (benchmarks/RESULTS_cbx.md, "Cold
cores"). The NumPy peers (CBXpy) are single-threaded, so they leave the second core idle;
a short cbo_jax run timed right after one of them runs partly on a cold core, while the
peer, timed right after cbo_jax, always starts warm. Before each timed run, the library
about to be timed therefore runs its own work, untimed, for ``--warmup-ms`` (both sides
alike: a throwaway peer instance stepping, or the compiled cbo_jax run).
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_MS = 100.0


def warm_for(seconds: float, work: Callable[[], object]) -> None:
    """Call ``work()`` (at least once when ``seconds > 0``) until ``seconds`` have passed."""
    if seconds <= 0:
        return
    t0 = time.perf_counter()
    work()
    while time.perf_counter() - t0 < seconds:
        work()


def warm_jax(seconds: float, fn: Callable[[], object]) -> None:
    """``fn()`` returns JAX arrays (dispatched asynchronously): run it, waiting each time."""
    import jax

    warm_for(seconds, lambda: jax.block_until_ready(fn()))


def warm_steps(seconds: float, dyn, sched) -> None:
    """Step a throwaway CBXpy-style instance (``dyn.step()``, ``sched.update(dyn)``) for ``seconds``."""

    def work():
        dyn.step()
        sched.update(dyn)

    warm_for(seconds, work)


def add_argument(parser) -> None:
    """The ``--warmup-ms`` option (default 100; 0 gives the earlier, cold protocol)."""
    parser.add_argument("--warmup-ms", type=float, default=DEFAULT_MS,
                        help="before each timed run, run the same library's own work untimed for this "
                             "many milliseconds (default %(default)s; 0: off; benchmarks/_warm.py)")
