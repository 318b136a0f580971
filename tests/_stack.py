"""The software stack the bitwise pins were recorded with.

Some checks compare against numbers pinned bit for bit (tests/pinned/, pinned particles).
They reproduce exactly with the JAX (and jaxlib) that CI installs; another XLA may round
float32 and float64 reductions differently. Those checks are exact on ``PINNED_JAX`` and
hold to a stated rounding tolerance elsewhere (each names its measured difference).
"""

from __future__ import annotations

import jax

PINNED_JAX = "0.10.2"


def on_pinned_jax() -> bool:
    return jax.__version__ == PINNED_JAX
