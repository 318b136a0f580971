import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads twice over.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite is compile-bound (tiny arrays, many distinct programs): XLA:CPU's legacy
# elemental emitter compiles this package's programs in 0.6-0.85x the time of jaxlib 0.10's
# default fusion emitters, and the suite runs about 20 % faster for it (benchmarks/RESULTS_compile.md).
# Results may differ in the last bits (float rounding of other kernels), so the bitwise
# pins are compared exactly only under XLA's defaults (tests/_stack.py: default_codegen);
# CI's slow step, with every pinned run, keeps the defaults (CBO_JAX_TEST_XLA_DEFAULTS=1).
# The flag is added only where this jaxlib knows it (an unknown XLA flag aborts the
# process): probed once in a subprocess; pytest-xdist's workers inherit the result.
LEGACY_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters=false"


def use_legacy_emitter(environ=os.environ, run=subprocess.run) -> str:
    """Add the flag to ``environ["XLA_FLAGS"]`` where it applies; say what the run compiles with.

    ``run``: how the probe's subprocess is run (``subprocess.run``; tests/test_stack.py passes
    others)."""
    flags = environ.get("XLA_FLAGS", "")
    if environ.get("CBO_JAX_TEST_XLA_DEFAULTS") == "1":
        return "XLA's defaults (CBO_JAX_TEST_XLA_DEFAULTS=1)"
    if environ.get("CBO_JAX_TEST_FUSION_EMITTERS") == "1":
        return "XLA's default fusion emitters (CBO_JAX_TEST_FUSION_EMITTERS=1)"
    if "xla_cpu_use_fusion_emitters" in flags:  # chosen by the caller (or by the controller of these workers)
        return f"XLA_FLAGS={flags.strip()!r}"
    unknown = "XLA's defaults (this jaxlib has no xla_cpu_use_fusion_emitters)"
    if environ.get("CBO_JAX_TEST_LEGACY_EMITTER") == "0":  # the controller's probe said no
        return unknown
    probe = [sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1.0)"]
    env = dict(environ, XLA_FLAGS=f"{flags} {LEGACY_EMITTER_FLAG}".strip(), JAX_PLATFORMS="cpu")
    try:
        known = run(probe, env=env, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        known = False
    environ["CBO_JAX_TEST_LEGACY_EMITTER"] = "1" if known else "0"
    if not known:
        return unknown
    environ["XLA_FLAGS"] = env["XLA_FLAGS"]
    return f"XLA_FLAGS={env['XLA_FLAGS']!r} (the legacy emitter: faster compiles, pins compared to 1e-5)"


CODEGEN = use_legacy_emitter()

# And XLA's backend optimisation off (LLVM at -O0, no expensive passes: JAX's own switch
# ``jax_disable_most_optimizations``, known to every supported JAX): the default run took 0.51x
# the time with it (benchmarks/RESULTS_compile.md). Tests that run long simulations rather than
# compile many small programs, and those that compare with pins bit for bit, ask for the
# optimised code back (``optimized_xla``). The environment variable carries the setting to the
# commands tests start. CI's slow step compiles with the default fusion emitters and this
# setting (CBO_JAX_TEST_FUSION_EMITTERS=1: the pinned comparisons there, optimised, are exact);
# CBO_JAX_TEST_XLA_DEFAULTS=1 keeps XLA's defaults for everything.
OPTIMIZATIONS_ENV = "JAX_DISABLE_MOST_OPTIMIZATIONS"
if os.environ.get("CBO_JAX_TEST_XLA_DEFAULTS") != "1":
    os.environ.setdefault(OPTIMIZATIONS_ENV, "1")


def pytest_report_header(config):
    optimised = "off" if os.environ.get(OPTIMIZATIONS_ENV) in ("1", "true", "True") else "XLA's default"
    return f"XLA:CPU code generation: {CODEGEN}; backend optimisation: {optimised}"


@contextlib.contextmanager
def full_optimisation():
    """Programs compiled inside get XLA's full backend optimisation, whatever the run's default,
    and so do the commands started inside (the environment variable)."""
    import jax

    name = "jax_disable_most_optimizations"
    before = bool(jax.config.values.get(name, False))
    before_env = os.environ.get(OPTIMIZATIONS_ENV)
    jax.config.update(name, False)
    os.environ[OPTIMIZATIONS_ENV] = "0"
    # The switch is not part of JAX's cache keys: a program an earlier test of this process compiled
    # unoptimised would be reused as it is (a pinned run then differed from its pin by an ulp).
    jax.clear_caches()
    try:
        yield
    finally:
        jax.config.update(name, before)
        if before_env is None:
            os.environ.pop(OPTIMIZATIONS_ENV, None)
        else:
            os.environ[OPTIMIZATIONS_ENV] = before_env


@pytest.fixture
def optimized_xla():
    """The test's programs, and the commands it starts, get XLA's full backend optimisation
    (:func:`full_optimisation`): for tests whose time goes into running a long simulation
    rather than compiling, and for comparisons with pins that are exact where XLA optimises."""
    with full_optimisation():
        yield


# The cbo-jax command's persistent compilation cache stays off in tests (also in the commands they start):
# tests that count compilations must see every one, and a test run writes nothing under ~/.cache.
os.environ["CBO_JAX_COMPILATION_CACHE"] = "0"

# Property tests (tests/test_config.py): in CI every run draws the same examples, so a
# submission never fails on a case no earlier run saw; elsewhere they are drawn anew.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True)
    if os.environ.get("CI"):
        _hyp_settings.load_profile("ci")
except ImportError:  # hypothesis is in the test extra; a bare install skips these tests
    pass


# Modules whose tests share one long fixture: the 8-device subprocess of tests/test_sharding.py
# takes minutes. CI's slow step runs with `--dist loadfile` (one module, one pytest-xdist worker,
# the fixture once); these modules go first so that it starts while the other workers take the
# rest instead of being left for the end. Paths relative to tests/.
TESTS = Path(__file__).resolve().parent
LONG_FIRST = ("test_sharding.py",)


def _in_tests(path) -> str:
    """``path`` relative to tests/, with ``/`` (``federated/test_runner.py``)."""
    try:
        return Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:  # a test file outside tests/
        return str(path)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _in_tests(item.path) not in LONG_FIRST)  # stable: the order is kept otherwise


# The tests of the real MNIST files (the full 60000 + 10000 images, not the bundled subset) read
# them from the directory CBO_JAX_DATA_DIR names. Without it a test skips saying how to run it;
# in CI (the CI variable set, as CI services and `CI=true bash .ci/run` do) it fails instead,
# so that CI never passes with them silently left out.
REAL_MNIST_HOW = ("set CBO_JAX_DATA_DIR to the directory holding mnist/ with the four MNIST IDX files "
                  "(train-images-idx3-ubyte.gz etc.; ../shared/data beside this checkout) to run this test")


def in_ci(environ=os.environ) -> bool:
    """Whether the tests run in CI: ``CI`` set to anything but empty, ``0``, ``false`` or ``no``."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def real_mnist(environ=os.environ):
    """``(directory, MNIST)``: the real MNIST files from ``$CBO_JAX_DATA_DIR``, read.

    When the variable is unset or the files cannot be read, the calling test is skipped with the
    reason and the way to run it, or, in CI (:func:`in_ci`), it fails with them (called in the
    test's body, not by a fixture: a fixture's failure is reported as an error, not a failure)."""
    __tracebackhide__ = True  # the skip is reported at the calling test's line
    from cbo_jax.federated import mnist

    directory = environ.get("CBO_JAX_DATA_DIR")
    if not directory:
        why = f"CBO_JAX_DATA_DIR is not set: {REAL_MNIST_HOW}"
    else:
        try:
            return directory, mnist.load_mnist("idx", directory)
        except mnist.DataError as err:
            why = f"CBO_JAX_DATA_DIR={directory!r} holds no readable MNIST IDX files ({err}): {REAL_MNIST_HOW}"
    if in_ci(environ):
        pytest.fail(f"CI must run the tests of the real MNIST files: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def tfds(monkeypatch, tmp_path):
    """``tensorflow_datasets`` (the test is skipped without it), with Python's temporary
    directory set to the test's own: tfds makes an empty directory for every split it opens
    without local metadata (``DatasetInfo.initialize_from_bucket``, ``mkdtemp("tfds")``) and
    never removes it, so each mock-data test left two in the system's /tmp."""
    module = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return module
