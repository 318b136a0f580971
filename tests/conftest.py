import os
import tempfile

import pytest

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads twice over.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The cbo-jax command's persistent compilation cache stays off in tests (also in the commands they start):
# tests that count compilations must see every one, and a test run writes nothing under ~/.cache.
os.environ["CBO_JAX_COMPILATION_CACHE"] = "0"

# Property tests (tests/test_properties.py): in CI every run draws the same examples, so a
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
# rest instead of being left for the end.
LONG_FIRST = ("test_sharding.py",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)  # stable: the order is kept otherwise


@pytest.fixture
def tfds(monkeypatch, tmp_path):
    """``tensorflow_datasets`` (the test is skipped without it), with Python's temporary
    directory set to the test's own: tfds makes an empty directory for every split it opens
    without local metadata (``DatasetInfo.initialize_from_bucket``, ``mkdtemp("tfds")``) and
    never removes it, so each mock-data test left two in the system's /tmp."""
    module = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return module
