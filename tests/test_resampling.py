"""Resampling triggers step by step against CBXpy's own trigger classes (fast, no dynamics).

The default suite only exercises :mod:`cbo_jax.resampling` through one padding test (an
``UpdateStagnation`` that always fires) and the 100-step CBXpy comparisons, which are
marked slow. These tests drive each trigger through a short hand-made sequence and check
every fire decision against ``cbx.utils.resampling`` fed the same numbers, so a wrong
reduction (``min`` for ``max``), a broken ring buffer, ``>=`` for ``>`` or a missing
reset of the wait counter is caught in the default run. Like the kicks and the update norm
below, they were found unchecked by mutation testing (marker ``reference``, docs/development.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives
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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
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


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_update_stagnation_norm_is_divided_by_n():
    """``UpdateStagnation`` reads ``|x_k - x_{k-1}|_F / N``. Noise off and α = 0: the first step
    moves the particles by ``λ1 dt (x_0 - x̄_0)``; with a threshold of twice that norm over
    ``N`` the trigger fires at step 2 (one step of lag, as CBXpy), not before."""
    n, lam, dt = 10, 1.0, 0.1
    x0 = np.random.default_rng(2).uniform(-2, 2, (n, 2))
    norm1 = lam * dt * np.linalg.norm(x0 - x0.mean(0)) / n
    rs = R.Resampling(R.UpdateStagnation(update_thresh=2 * norm1), sigma=0.0)
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=lam, sigma1=0.0, dt=dt, alpha=0.0, noise="none", resampling=rs, dtype="float64")
        res = cj.simulate(cj.cbo(objectives.Quadratic(), cfg), x0, jax.random.key(0), 2)
    assert list(np.asarray(res.history["resamplings"])) == [0, 1]


@pytest.mark.reference
def test_resampling_kick_is_sigma_sqrt_dt_normal():
    """A resampling moves every particle by ``σ_r √dt ξ`` (CBXpy's ``apply_resampling_default``).
    Nothing else moves the particles here, so the second step's increments (the first that
    fires) have variance ``σ_r² dt`` (6 standard errors)."""
    n, d, sig_r, dt = 2000, 2, 0.5, 0.04
    x0 = np.random.default_rng(3).uniform(-1, 1, (n, d))
    rs = R.Resampling(R.UpdateStagnation(update_thresh=1.0), sigma=sig_r)
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.0, sigma1=0.0, dt=dt, alpha=1.0, noise="none", resampling=rs, dtype="float64")
        dyn = cj.cbo(objectives.Quadratic(), cfg)
        s1 = jax.jit(dyn.step)(dyn.init(x0, jax.random.key(0)))
        s2 = jax.jit(dyn.step)(s1)
    np.testing.assert_array_equal(np.asarray(s1.x), x0)  # no kick before the first update norm is known
    inc = (np.asarray(s2.x) - x0).ravel()
    var, want = inc.var(), sig_r ** 2 * dt
    assert abs(var / want - 1) < 6 * np.sqrt(2 / inc.size), (var, want)
