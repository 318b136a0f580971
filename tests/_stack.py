"""The software stack and host the bitwise pins were recorded with.

Some checks compare against numbers pinned bit for bit (tests/pinned/, pinned particles).
They reproduce exactly with the JAX (and jaxlib) that CI installs; another XLA may round
float32 and float64 reductions differently. Those checks are exact on ``PINNED_JAX`` and
hold to a stated rounding tolerance elsewhere (each names its measured difference).

So may XLA:CPU's legacy emitter and XLA's backend optimisation turned off, which
tests/conftest.py selects for the default test run (they compile faster): the exact checks
need XLA's default code generation too (:func:`default_codegen`): CI's slow step compiles
with the default emitters (``CBO_JAX_TEST_FUSION_EMITTERS=1``), and its tests that compare
with pins turn the optimisation back on (the fixture ``optimized_xla``).

The pinned federated runs (float32 training) depend on the CPU as well: XLA:CPU compiles for
the host's vector instructions. They were recorded with jax 0.10.2 on an AMD EPYC (Zen 3:
AVX2 and FMA, no AVX-512); on an Intel Xeon with AVX-512 (2026-11-25) the same JAX gave them
within 1.0e-6 of the pins (fedcbo_probsampling's first-layer kernel), on one device and on 8,
not bitwise. They are exact only where :func:`on_pinned_stack` holds: the pinned JAX on an AMD
CPU with AVX2 and FMA and without AVX-512, taken to round like the recording host. On that
Xeon the other exact checks (a batched float64 run against single runs, one CBXpy comparison
over 100 steps) still held, so they depend on the JAX version alone (:func:`on_pinned_jax`).

Recording host per pin: a pin recorded later on another kind of CPU (the pinned federated run
that FedCBO's draw from the participating agents moved, recorded on that Intel Xeon) is exact
only on its own kind. :func:`host_kind` names a kind (``"amd-avx2"``: :data:`PINNED_HOST_KIND`,
the kind above; ``"intel-avx512"``: that Xeon; ``"amd-avx512"``: an AMD CPU with AVX-512, where
the pins of the baselines added in issue 62 were recorded), a pin file stores the kind each run was
recorded on, and ``on_pinned_stack(recorded_on=kind)`` asks for that kind instead of the default
(a kind is taken, as above, to round like the host that recorded on it).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import jax

if hasattr(jax, "enable_x64"):  # the context manager ``with enable_x64(True): ...`` on every supported JAX
    enable_x64 = jax.enable_x64
else:  # pragma: no cover - JAX < 0.8 (CI's oldest-versions step runs 0.7.0)
    from jax.experimental import enable_x64  # noqa: F401

PINNED_JAX = "0.10.2"
PINNED_HOST_KIND = "amd-avx2"  # the host kind of pinned_host(): AMD, AVX2 and FMA, no AVX-512


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


@functools.cache
def pinned_host(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """True on the kind of CPU the pins were recorded on: x86-64 AMD with AVX2 and FMA and
    without AVX-512 (XLA vectorises reductions by the widest vectors the host has)."""
    machine = platform.machine() if machine is None else machine
    if machine != "x86_64":  # Windows ("AMD64") has no /proc/cpuinfo either
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    vendor, flags = _cpu_flags(cpuinfo)
    return vendor == "AuthenticAMD" and {"avx2", "fma"} <= flags and "avx512f" not in flags


@functools.cache
def host_kind(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """The kind of CPU, as far as XLA:CPU's float rounding goes: ``"<vendor>-<vectors>"``,
    vendor ``amd``/``intel`` (else the vendor_id, lower case), vectors ``avx512`` (AVX-512F),
    ``avx2`` (AVX2 and FMA) or ``x86``; another architecture: its machine name. The pins'
    kind, :data:`PINNED_HOST_KIND`, is exactly :func:`pinned_host`'s."""
    machine = platform.machine() if machine is None else machine
    if machine != "x86_64":
        return machine.lower() or "unknown"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "x86_64-unknown"
    vendor, flags = _cpu_flags(cpuinfo)
    name = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(vendor, vendor.lower() or "unknown")
    vectors = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "x86"
    return f"{name}-{vectors}"


def default_codegen() -> bool:
    """True unless XLA:CPU compiles with its legacy elemental emitter
    (``--xla_cpu_use_fusion_emitters=false`` in ``XLA_FLAGS``, which tests/conftest.py adds to
    the default test run to compile faster) or with its backend optimisation off (JAX's
    ``jax_disable_most_optimizations``, also the default test run's). The pins were recorded
    with XLA's default fusion emitters, optimised; the legacy one may round float32 kernels
    otherwise (a FedCBO round differs in its last bits), so exact comparisons need the default."""
    if jax.config.values.get("jax_disable_most_optimizations", False):
        return False
    flags = os.environ.get("XLA_FLAGS", "").replace("--", " ").split()
    return not any(f.lower() in ("xla_cpu_use_fusion_emitters=false", "xla_cpu_use_fusion_emitters=0") for f in flags)


def on_pinned_jax() -> bool:
    """True with the JAX the pins were recorded with, compiling with XLA's default code
    generation (:func:`default_codegen`)."""
    return jax.__version__ == PINNED_JAX and default_codegen()


def on_pinned_stack(recorded_on: str | None = None) -> bool:
    """True where the pinned federated runs must reproduce exactly: the pinned JAX on the pinned kind
    of CPU, or on ``recorded_on`` (a :func:`host_kind`) for a pin recorded on another kind."""
    if recorded_on is None or recorded_on == PINNED_HOST_KIND:
        return on_pinned_jax() and pinned_host()
    return on_pinned_jax() and host_kind() == recorded_on
