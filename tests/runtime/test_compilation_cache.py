"""The cbo-jax command's persistent compilation cache: where it goes, off switch, reuse across processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbo_jax import compilation_cache as cc


def test_default_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.default_dir() == tmp_path / "xdg" / "cbo_jax" / "xla"
    monkeypatch.setenv(cc.ENV, str(tmp_path / "mine"))
    assert cc.default_dir() == tmp_path / "mine"
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv(cc.ENV, off)
        assert cc.default_dir() is None


def test_enable_leaves_the_cache_off_when_told_or_unwritable(monkeypatch, tmp_path):
    monkeypatch.setenv(cc.ENV, "0")  # as the test suite runs (conftest.py)
    assert cc.enable() is None
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    with pytest.warns(UserWarning, match="compilation cache off: cannot use"):
        assert cc.enable(blocker / "cache") is None
    monkeypatch.setattr(cc.os, "access", lambda path, mode: False)  # a read-only directory (root writes anywhere)
    with pytest.warns(UserWarning, match="not writable"):
        assert cc.enable(tmp_path) is None


# One process per run: JAX reads the cache setting once per process. The listener counts the
# compilations served from the cache; every compilation is cached (minimum compile time 0).
_RUN = """
import json, sys
import jax
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(1) if name.endswith("/cache_hits") else None)
from cbo_jax.cli import main
assert main(sys.argv[1:]) == 0
summary = json.load(open(sys.argv[-1] + "/summary.json"))
print(json.dumps({"hits": len(hits), "best_energy": summary["best_energy"],
                  "cache": summary["environment"]["compilation_cache"]}))
"""


def _optimize(out: Path, env: dict) -> dict:
    argv = ["optimize", "--objective", "rastrigin", "--dim", "3", "--particles", "30", "--runs", "2", "--steps", "40",
            "--no-progress", "--output", str(out)]
    proc = subprocess.run([sys.executable, "-c", _RUN, *argv], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_command_reuses_compiled_programs_across_processes(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, cc.ENV: str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    first = _optimize(tmp_path / "a", env)
    assert first["cache"] == str(cache) and first["hits"] == 0 and any(cache.iterdir())
    second = _optimize(tmp_path / "b", env)
    assert second["hits"] > 0  # compiled programs read back, not compiled again
    assert second["best_energy"] == first["best_energy"]  # the same run, the same numbers


@pytest.mark.parametrize("bad", [-5, 1.5, "2G", True, None])
def test_enable_refuses_a_max_size_that_is_not_a_byte_count(monkeypatch, tmp_path, bad):
    """max_size=-5 was silently no limit, 1.5 truncated, "2G" a TypeError; now a ValueError
    naming max_size, before any JAX setting changes (-1 stays "no limit")."""
    import jax

    monkeypatch.setattr(cc, "current_dir", lambda: None)
    calls = []
    monkeypatch.setattr(jax.config, "update", lambda *a: calls.append(a))
    with pytest.raises(ValueError, match="max_size"):
        cc.enable(tmp_path / "c", max_size=bad)
    assert calls == []
    assert cc.enable(tmp_path / "ok", max_size=-1) == tmp_path / "ok"
