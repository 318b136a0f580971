"""Which hosts must reproduce the bitwise pins (tests/_stack.py)."""

from _stack import _cpu_flags, pinned_host

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx fma avx2 bmi2
processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx fma avx2 bmi2
"""


def test_cpu_flags_reads_the_first_processor():
    assert _cpu_flags(ZEN3) == ("AuthenticAMD", {"fpu", "sse2", "avx", "fma", "avx2", "bmi2"})


def test_pinned_host_is_an_amd_cpu_with_avx2_and_without_avx512():
    assert pinned_host(ZEN3, "x86_64")
    assert not pinned_host(ZEN3.replace("avx2 bmi2", "avx2 avx512f bmi2"), "x86_64")  # Zen 4: wider vectors
    assert not pinned_host(ZEN3.replace("AuthenticAMD", "GenuineIntel"), "x86_64")
    assert not pinned_host(ZEN3.replace(" avx2", ""), "x86_64")
    assert not pinned_host(ZEN3, "aarch64")
    assert not pinned_host("", "x86_64")
