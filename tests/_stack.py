"""The software stack and host the bitwise pins were recorded with.

Some checks compare against numbers pinned bit for bit (tests/pinned/, pinned particles).
They reproduce exactly with the JAX (and jaxlib) that CI installs on the kind of CPU they
were recorded on. XLA:CPU compiles for the host it runs on, so another XLA, or the same XLA
on a CPU with other vector instructions, may round float32 and float64 reductions
differently. Those checks are exact on the pinned stack and hold to a stated rounding
tolerance elsewhere (each names its measured difference).

The pins were recorded with jax 0.10.2 on an AMD EPYC (family 25, Zen 3: AVX2 and FMA, no
AVX-512). On an Intel Xeon with AVX-512 (2026-11-25), the same JAX gave the pinned federated
runs within 1.0e-6 of the pins (fedcbo_probsampling's
first-layer kernel), on one device and on 8, not bitwise.
"""

from __future__ import annotations

import platform
from pathlib import Path

import jax

PINNED_JAX = "0.10.2"


def _cpu_flags(cpuinfo: str) -> tuple[str, set[str]]:
    """``(vendor_id, flags)`` of the first processor in a ``/proc/cpuinfo`` text."""
    vendor, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return vendor, flags


def pinned_host(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """True on the kind of CPU the pins were recorded on: x86-64 AMD with AVX2 and FMA and
    without AVX-512 (XLA vectorises reductions by the widest vectors the host has)."""
    machine = platform.machine() if machine is None else machine
    if machine not in ("x86_64", "AMD64"):
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    vendor, flags = _cpu_flags(cpuinfo)
    return vendor == "AuthenticAMD" and {"avx2", "fma"} <= flags and "avx512f" not in flags


def on_pinned_stack() -> bool:
    """True where the bitwise pins must reproduce exactly: the pinned JAX on the pinned kind of CPU."""
    return jax.__version__ == PINNED_JAX and pinned_host()
