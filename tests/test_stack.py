"""Which hosts must reproduce the bitwise pins (tests/_stack.py)."""

import os
from pathlib import Path

import pytest

from _stack import _cpu_flags, default_codegen, on_pinned_jax, on_pinned_stack, pinned_host

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


def test_the_legacy_emitter_is_not_the_pinned_stack(monkeypatch, optimized_xla):
    """The pins were recorded with XLA's default fusion emitters: with the legacy emitter
    (tests/conftest.py's faster-compiling default-run flag) nothing compares exactly."""
    for flags in ("--xla_cpu_use_fusion_emitters=false", "--xla_force_host_platform_device_count=4 "
                  "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_use_fusion_emitters=0"):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert not default_codegen() and not on_pinned_jax() and not on_pinned_stack()
        assert not on_pinned_stack("intel-avx512")
    for flags in ("", "--xla_cpu_use_fusion_emitters=true", "--xla_force_host_platform_device_count=8"):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert default_codegen()
    monkeypatch.delenv("XLA_FLAGS")
    assert default_codegen()


def test_nothing_compares_exactly_with_the_backend_optimisation_off(monkeypatch):
    """The default test run turns XLA's backend optimisation off (tests/conftest.py), CI's slow
    step does not; ``optimized_xla`` turns it back on for one test and restores the run's choice."""
    import jax

    name = "jax_disable_most_optimizations"
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    setting = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
    if os.environ.get("CBO_JAX_TEST_XLA_DEFAULTS") == "1":
        assert setting is None
    else:
        assert setting is not None  # "1" unless the caller chose otherwise
    off = (setting or "0").lower() in ("1", "true")
    assert jax.config.values[name] is off
    assert default_codegen() is not off
    from conftest import full_optimisation

    with full_optimisation():
        assert jax.config.values[name] is False and default_codegen()
        assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "0"  # for the commands a test starts
    assert jax.config.values[name] is off and os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == setting


def test_the_default_run_compiles_with_the_legacy_emitter_unless_told_not_to():
    """conftest.py adds the flag where this jaxlib knows it (every supported one does, 0.7.0 to
    0.10.2; a later one may drop the legacy emitter); CBO_JAX_TEST_XLA_DEFAULTS=1 keeps XLA's
    defaults and CBO_JAX_TEST_FUSION_EMITTERS=1 (CI's slow step) its default emitters."""
    import conftest

    if os.environ.get("CBO_JAX_TEST_XLA_DEFAULTS") == "1" or os.environ.get("CBO_JAX_TEST_LEGACY_EMITTER") == "0":
        assert conftest.LEGACY_EMITTER_FLAG not in os.environ.get("XLA_FLAGS", "") and "defaults" in conftest.CODEGEN
    elif os.environ.get("CBO_JAX_TEST_FUSION_EMITTERS") == "1":
        assert conftest.LEGACY_EMITTER_FLAG not in os.environ.get("XLA_FLAGS", "") and "fusion" in conftest.CODEGEN
    elif os.environ.get("CBO_JAX_TEST_LEGACY_EMITTER") == "1":
        assert conftest.LEGACY_EMITTER_FLAG in os.environ["XLA_FLAGS"] and not default_codegen()


def test_the_probe_adds_the_flag_only_where_jaxlib_knows_it():
    """An unknown XLA flag aborts the process, so the flag goes into XLA_FLAGS only after a
    subprocess ran with it; a refusal (a jaxlib without the legacy emitter), a crash or a
    hang leaves XLA_FLAGS as it was and tells the workers not to probe again."""
    import subprocess

    from conftest import LEGACY_EMITTER_FLAG, use_legacy_emitter

    calls = []

    def runs(rc):
        def run(cmd, env, **kw):
            calls.append(env["XLA_FLAGS"])
            return subprocess.CompletedProcess(cmd, rc)
        return run

    def hangs(cmd, env, **kw):
        raise subprocess.TimeoutExpired(cmd, 120)

    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert "legacy emitter" in use_legacy_emitter(env, runs(0))
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=4 {LEGACY_EMITTER_FLAG}"
    assert calls == [env["XLA_FLAGS"]] and env["CBO_JAX_TEST_LEGACY_EMITTER"] == "1"
    assert use_legacy_emitter(env, runs(0)).startswith("XLA_FLAGS=") and len(calls) == 1  # a worker: no probe
    for refuse in (runs(-6), hangs):
        env = {}
        assert "has no xla_cpu_use_fusion_emitters" in use_legacy_emitter(env, refuse)
        assert "XLA_FLAGS" not in env and env["CBO_JAX_TEST_LEGACY_EMITTER"] == "0"
        assert "has no" in use_legacy_emitter(env, runs(0)) and "XLA_FLAGS" not in env  # workers take the answer
    env = {"CBO_JAX_TEST_XLA_DEFAULTS": "1"}
    assert "defaults" in use_legacy_emitter(env, runs(0)) and env == {"CBO_JAX_TEST_XLA_DEFAULTS": "1"}
    env = {"CBO_JAX_TEST_FUSION_EMITTERS": "1"}
    assert "default fusion emitters" in use_legacy_emitter(env, runs(0)) and env == {"CBO_JAX_TEST_FUSION_EMITTERS": "1"}
    env = {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true"}
    use_legacy_emitter(env, runs(0))
    assert env == {"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true"}  # the caller's choice stands
    assert len(calls) == 2  # the first probe and the refused one


def test_the_wheel_checks_tests_import_no_test_helpers():
    """.ci/wheel_check.sh runs some test files against the installed wheel with only conftest.py (and the
    __init__.py of their folders) beside them: a helper import (``from _stack import ...``) or an import of
    another test file there fails only in CI's wheel step."""
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
        tests = {m for m in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", text, re.M)
                 if (root / "tests" / (m.replace(".", "/") + ".py")).is_file()}
        beside = {f[:-len(".py")].replace("/", ".") for f in files}
        assert tests <= beside, f"tests/{name} imports test files the wheel check does not copy: {sorted(tests - beside)}"
