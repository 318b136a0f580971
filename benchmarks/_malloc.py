"""glibc ``malloc`` settings for the timed NumPy peers (CBXpy).

CBXpy's step allocates several ``(M, N, d)`` float64 temporaries (1.6 MB at N = 10⁴, d = 20).
glibc serves blocks above its ``mmap`` threshold (128 KiB at start, raised dynamically when
such a block is freed) with fresh ``mmap`` pages, so each temporary can cost page faults
on first touch; whether it does depends on the history of the process. Measured on the
2-core benchmark machine (benchmarks/RESULTS_cbx.md): CBXpy's CBO runs 0.66 M
particle-steps/s in a fresh process and 1.05 M/s with the threshold fixed above its
temporaries, and inside a benchmark process its speed flips between the two.

``--malloc tuned`` (:func:`tune`) fixes the thresholds at the start of the process, so the
peer runs at its faster, steady speed: the conservative comparison. The settings are the
same as starting Python with ``MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=134217728``,
and apply to the whole process (cbo_jax's runs too).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 128 << 20
CHOICES = ("system", "tuned")


def tune() -> bool:
    """Fix glibc's ``mmap`` and trim thresholds (64 MiB, 128 MiB); ``False`` where there is no glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def apply(choice: str) -> str:
    """Apply ``--malloc CHOICE``; returns what was applied (for the JSON record)."""
    if choice not in CHOICES:
        raise ValueError(f"--malloc must be one of {CHOICES}, got {choice!r}")
    if choice == "tuned":
        return "tuned (mmap threshold 64 MiB, trim threshold 128 MiB)" if tune() else "system (mallopt unavailable)"
    return "system"


def add_argument(parser, peer: str = "CBXpy") -> None:
    """The ``--malloc`` option of a benchmark that times a NumPy peer (default ``tuned``)."""
    parser.add_argument("--malloc", choices=CHOICES, default="tuned",
                        help=f"glibc malloc thresholds of the process: fixed above {peer}'s temporaries "
                             "(default, benchmarks/_malloc.py) or the system's")
