"""Which hosts must reproduce the bitwise pins (tests/_stack.py)."""

from pathlib import Path

import pytest

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


def test_the_wheel_checks_tests_import_no_test_helpers():
    """.ci/wheel_check.sh runs some test files against the installed wheel with only conftest.py beside
    them: a helper import (``from _stack import ...``) there fails only in CI's wheel step."""
    import re

    root = Path(__file__).resolve().parents[1]
    script = root / ".ci" / "wheel_check.sh"
    if not script.exists():
        pytest.skip("no .ci/ beside the tests")
    listed = re.search(r"SOURCE_FREE_TESTS=\(([^)]*)\)", script.read_text())
    assert listed, "SOURCE_FREE_TESTS not found in .ci/wheel_check.sh"
    files = listed.group(1).split() + ["conftest.py"]
    helpers = {p.stem for p in (root / "tests").glob("_*.py")}
    for name in files:
        text = (root / "tests" / name).read_text()
        used = set(re.findall(r"^\s*(?:from|import)\s+(_\w+)", text, re.M)) & helpers
        assert not used, f"tests/{name} runs against the wheel without the test helpers but imports {sorted(used)}"
