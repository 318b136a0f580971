"""Resampling triggers step by step against CBXpy's own trigger classes (fast, no dynamics).

The default suite only exercises :mod:`cbo_jax.resampling` through one padding test (an
``UpdateStagnation`` that always fires) and the 100-step CBXpy comparisons, which are
marked slow. These tests drive each trigger through a short hand-made sequence and check
every fire decision against ``cbx.utils.resampling`` fed the same numbers, so a wrong
reduction (``min`` for ``max``), a broken ring buffer, ``>=`` for ``>`` or a missing
reset of the wait counter is caught in the default run.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import resampling as R

from _stack import enable_x64

cbx_res = pytest.importorskip("cbx.utils.resampling")


@pytest.fixture(autouse=True)
def _x64():
    with enable_x64(True):
        yield


def _cbx_consensus_dyn(c):
    """A stand-in for CBXpy's dynamic: one run, its consensus ``c`` (shape (d,))."""
    c = np.asarray(c, np.float64)
    return SimpleNamespace(M=1, active_runs_idx=np.array([0]), norm=np.linalg.norm, to_numpy=np.asarray,
                           consensus=c[None, None, :], x=np.zeros((1, 4, c.shape[0])), copy=np.copy)


def test_consensus_stagnation_fires_exactly_when_cbxpy_does():
    """``ConsensusStagnation(patience=3)``: the max of the last three consensus moves below the
    threshold fires; one large move keeps it quiet for ``patience`` checks. Moves here:
    1, 0.05, 0.01, 0.01, 0.5, 0.01, 0.01, 0.01, 0.01 (threshold 0.1)."""
    trig = R.ConsensusStagnation(patience=3, update_thresh=0.1)
    ref = cbx_res.consensus_stagnation(patience=3, update_thresh=0.1)
    pos = np.cumsum([0.0, 1.0, 0.05, 0.01, 0.01, 0.5, 0.01, 0.01, 0.01, 0.01])
    cs = [np.array([p, -2.0 * p]) / np.sqrt(5.0) for p in pos]  # |c_k - c_{k-1}| = the move above
    state = trig.init(jnp.zeros(2), jnp.float64)
    ours, theirs = [], []
    for c in cs:
        fire, state = trig.check(state, consensus=jnp.asarray(c, jnp.float64))
        ours.append(bool(fire))
        theirs.append(len(ref(_cbx_consensus_dyn(c))) > 0)
    assert ours == theirs
    # by hand: fires once the last three moves are all < 0.1, never while the 1.0 or 0.5 is among them
    assert ours == [False, False, False, False, True, False, False, False, True, True]


def test_loss_stagnation_waits_resets_and_fires_as_cbxpy():
    """``LossStagnation(wait_thresh=2)``: each check that does not strictly improve the best
    energy counts; at ``wait_thresh`` it fires and the count starts again (``wait %
    wait_thresh``). cbo_jax's check sees the best energy one step back (CBXpy's timing), so
    CBXpy is fed the previous value."""
    trig = R.LossStagnation(wait_thresh=2)
    ref = cbx_res.loss_update_resampling(wait_thresh=2)
    best = [5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    state = trig.init(None, jnp.float64)
    ours, theirs, prev = [], [], np.inf
    for b in best:
        fire, state = trig.check(state, best_energy=jnp.asarray(b, jnp.float64))
        ours.append(bool(fire))
        theirs.append(len(ref(SimpleNamespace(M=1, best_energy=np.array([prev])))) > 0)
        prev = b
    assert ours == theirs
    assert sum(ours) >= 3  # equal energies are no improvement: it keeps firing every wait_thresh checks
    # after a fire the count restarts: never two fires in a row with wait_thresh = 2
    assert not any(a and b for a, b in zip(ours, ours[1:]))


def test_update_stagnation_compares_the_previous_update_norm():
    """``UpdateStagnation`` fires when the previous step's update norm is below the threshold,
    as CBXpy's ``ensemble_update_resampling`` (``update_diff < update_thresh``)."""
    trig = R.UpdateStagnation(update_thresh=0.1)
    ref = cbx_res.ensemble_update_resampling(update_thresh=0.1)
    state = trig.init(None, jnp.float64)
    fire, state = trig.check(state)
    assert not bool(fire)  # no update known before the first step
    for norm in (1.0, 0.05, 0.2, 0.0999, 0.1):
        state = trig.after_move(state, jnp.asarray(norm))
        fire, state = trig.check(state)
        assert bool(fire) == (len(ref(SimpleNamespace(update_diff=np.array([norm])))) > 0) == (norm < 0.1)
