"""Progress bars: redrawn in place on a terminal, printed rarely into a log file."""

import io
import sys

import jax
import jax.numpy as jnp
import pytest

import cbo_jax as cj
from cbo_jax import _progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _draws(text: str) -> list[str]:
    return [line for line in text.replace("\r", "\n").split("\n") if line.strip()]


@pytest.fixture
def no_tqdm_env(monkeypatch):
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)


def test_a_bar_into_a_log_file_prints_every_30_s_at_most(monkeypatch, no_tqdm_env):
    """Into a log file the bar prints its first and last state and nothing between them when
    the run takes under 30 s: every set_postfix of its own would print a copy."""
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    bar = _progress.progress_bar(100, desc="run", unit="round")
    assert bar.mininterval == _progress.LOG_INTERVAL_S == 30.0
    for i in range(100):
        _progress.advance(bar, 1, {"loss": f"{i}"})
    bar.close()
    draws = _draws(log.getvalue())
    assert len(draws) == 2, draws
    assert "0/100" in draws[0] and "100/100" in draws[1] and "loss=99" in draws[1]


def test_a_bar_on_a_terminal_redraws_at_tqdms_pace(monkeypatch, no_tqdm_env):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    bar = _progress.progress_bar(3, desc="run", unit="step", initial=1)
    assert bar.mininterval == 0.1 and bar.n == 1
    bar.close()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert _progress._to_log(type(bar)) is True
    # tqdm's own setting wins, in a log too (tqdm reads it when imported: not set here)
    monkeypatch.setenv("TQDM_MININTERVAL", "5")
    assert _progress._to_log(type(bar)) is False


def test_a_notebook_bar_is_left_as_it_is(monkeypatch, no_tqdm_env):
    class NotebookBar:
        pass

    NotebookBar.__module__ = "tqdm.notebook"
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert _progress._to_log(NotebookBar) is False
    assert _progress._to_log(type("Bar", (), {})) is True


def test_simulate_with_progress_into_a_log(monkeypatch, no_tqdm_env):
    """simulate(progress=True) into a log: two prints for a short run, the best energy in the last."""
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    dyn = cj.cbo(lambda x: jnp.sum(x ** 2, -1), sigma1=0.5, dt=0.05)
    x0 = jax.random.normal(jax.random.key(0), (50, 2))
    res = cj.simulate(dyn, x0, jax.random.key(1), 40, chunk_size=5, progress=True)
    draws = _draws(log.getvalue())
    assert len(draws) == 2, draws
    assert "40/40" in draws[-1] and f"best={float(jnp.min(res.state.best_energy)):.4g}" in draws[-1]


def test_a_late_beat_is_a_stop_only_when_the_process_used_no_cpu(monkeypatch):
    """A beat 2 s late while the process ran (its CPU clock moved: a long call holding the
    interpreter, a loaded machine) is work; 2 s late with the CPU clock still is a stop."""
    from cbo_jax import _progress

    monkeypatch.setattr(_progress, "_last_beat", 100.0)
    monkeypatch.setattr(_progress, "_last_cpu", 50.0)
    now = 100.0 + _progress.BEAT_S + 2.0
    assert _progress._stop(now, 51.5) == 0.0  # busy
    assert _progress._stop(now, 50.01) == pytest.approx(2.0)  # stopped
    assert _progress._stop(100.0 + _progress.BEAT_S + 0.5, 50.0) == 0.0  # on time
