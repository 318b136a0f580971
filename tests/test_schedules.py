"""α schedules and number rules in closed form (found by mutation testing: marker ``reference``).

The default suite runs the effective-sample-size schedule only on full, finite populations
with the schedule's own numbers, and never checks ``Multiply``'s lower bound or that a
``Chain`` applies every rule; these tests pin each against closed forms or a float64
NumPy effective sample size.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import schedules

from _stack import enable_x64


def _np_ess(e, alpha):
    """J_eff(α) = (Σ w)² / Σ w², w = e^{-α (E - E_min)} over the given (finite, kept) energies."""
    w = np.exp(-alpha * (e - e.min()))
    return w.sum() ** 2 / (w ** 2).sum()


@pytest.fixture(autouse=True)
def _x64():
    with enable_x64(True):
        yield


ENERGY = np.random.default_rng(0).exponential(size=12)


@pytest.mark.reference
def test_ess_schedule_targets_eta_times_the_valid_agents():
    """With a mask (a random batch) and a non-finite energy, α solves J_eff(α) = η n_valid over the
    valid agents only, not η N."""
    e = ENERGY.copy()
    e[3] = np.inf
    mask = np.ones(12, bool)
    mask[[0, 5, 7]] = False
    sched = schedules.EffectiveSampleSize(eta=0.5, iterations=60)
    a = float(sched.update(jnp.asarray(1.0), jnp.asarray(e), jnp.asarray(mask)))
    keep = mask & np.isfinite(e)
    np.testing.assert_allclose(_np_ess(e[keep], a), 0.5 * keep.sum(), rtol=1e-8)


@pytest.mark.reference
def test_ess_schedule_reads_swept_numbers_from_params():
    """``update(..., params=...)`` (a parameter sweep's point) uses the given η, not the schedule's own."""
    sched = schedules.EffectiveSampleSize(eta=0.5, iterations=60)
    p = schedules.EffectiveSampleSizeParams(eta=0.25, alpha0=1.0, alpha_min=1e-6, alpha_max=1e5)
    a = float(sched.update(jnp.asarray(1.0), jnp.asarray(ENERGY), params=p))
    np.testing.assert_allclose(_np_ess(ENERGY, a), 0.25 * 12, rtol=1e-8)


@pytest.mark.reference
def test_multiply_is_clipped_to_its_bounds():
    """``Multiply``: ``v ← clip(factor · v, minimum, maximum)``."""
    down = schedules.Multiply(0.5, minimum=0.3)
    v = 1.0
    seen = []
    for _ in range(3):
        v = float(down.update(v))
        seen.append(v)
    assert seen == [0.5, 0.3, 0.3]
    up = schedules.Multiply(3.0, maximum=10.0)
    assert [float(up.update(3.0)), float(up.update(4.0))] == [9.0, 10.0]


@pytest.mark.reference
def test_chain_applies_every_rule_in_order():
    """``Chain(r1, r2, r3).update(v) = r3(r2(r1(v)))`` (CBXpy's ``scheduler([...])``)."""
    chain = schedules.Chain(schedules.Constant(1.0), schedules.Multiply(2.0), schedules.Multiply(3.0, maximum=5.0))
    assert chain.init() == 1.0
    assert float(chain.update(1.0)) == 5.0  # 1 → 1 → 2 → min(6, 5)
    assert float(chain.update(0.5)) == 3.0  # 0.5 → 0.5 → 1 → 3
