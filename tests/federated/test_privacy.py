"""The privacy accountant of the SGLD oracle (cbo_jax.federated.privacy)."""

from __future__ import annotations

import numpy as np
import pytest

from cbo_jax.federated import privacy
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig
from cbo_jax.federated.langevin import SGLDConfig


def test_accountant_matches_dp_accounting_directly():
    import dp_accounting

    C, lr, noise, q, Q, Q0, delta = 1.0, 0.01, 0.5, 0.1, 8, 4, 1e-5
    cfg = FedSGLDConfig(oracle=SGLDConfig(steps=Q, burn_in=Q0, lr=lr, noise=noise, clip_norm=C, sampling_rate=q),
                        delta=delta)
    rep = privacy.account(cfg, rounds=5)
    assert rep.epsilon.shape == (5,) and np.all(np.isfinite(rep.epsilon))
    assert np.all(np.diff(rep.epsilon) > 0)
    assert rep.sensitivity == 2 * C
    # By hand: η_q = η for q <= Q0, then η (q - Q0)^(-1/3); z_q = noise / (2 C sqrt(η_q)).
    etas = [lr] * Q0 + [lr * (t - Q0) ** (-1 / 3) for t in range(Q0 + 1, Q + 1)]
    zs = [noise / (2 * C * np.sqrt(e)) for e in etas]
    np.testing.assert_allclose(rep.noise_multipliers, zs, rtol=1e-12)
    for rounds in (1, 5):
        acc = dp_accounting.rdp.RdpAccountant()
        for _ in range(rounds):
            for z in zs:
                acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
        assert rep.epsilon[rounds - 1] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    assert rep.per_device(30).shape == (5, 30)
    # Constant multiplier (noisy FedPD): one self-composed event of rounds·Q steps.
    pd_cfg = FedPDConfig(local_steps=Q, lr=lr, noise=noise, clip_norm=C, sampling_rate=q, delta=delta)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise / (2 * C * np.sqrt(lr)))),
                3 * Q)
    assert privacy.account(pd_cfg, rounds=3).epsilon[-1] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    # No noise or no clipping: no guarantee.
    assert np.isinf(privacy.account(FedPDConfig(), rounds=2).epsilon).all()
    assert np.isinf(privacy.account(dataclass_replace_clip_none(cfg), rounds=2).epsilon).all()


def dataclass_replace_clip_none(cfg):
    import dataclasses

    return dataclasses.replace(cfg, oracle=dataclasses.replace(cfg.oracle, clip_norm=None))


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        FedSGLDConfig(delta=delta)
    with pytest.raises(ValueError, match="delta"):
        privacy.account(FedSGLDConfig(), rounds=1, delta=delta)


@pytest.mark.parametrize("orders, match", [
    ([], "non-empty"),
    (8.0, "1-D"),
    ([float("nan"), 8.0], "finite"),
    ([0.5, 8.0], ">= 1"),
])
def test_account_refuses_bad_orders(orders, match):
    """``orders=[]`` failed with NumPy's "argmin of an empty sequence", a scalar with "iteration
    over a 0-d array", and a NaN order was silently dropped by the library."""
    with pytest.raises(ValueError, match=f"orders.*{match}|{match}.*orders"):
        privacy.account(SGLDConfig(steps=4, burn_in=2), rounds=1, delta=1e-5, orders=orders)


@pytest.mark.parametrize("q", [0.0, 2.0, -0.1, float("nan")])
def test_round_event_refuses_a_sampling_rate_outside_0_1(q):
    """``round_event(cfg, sampling_rate=2.0)`` built a PoissonSampledDpEvent with probability 2
    (NaN likewise) without a word."""
    with pytest.raises(ValueError, match="sampling_rate"):
        privacy.round_event(SGLDConfig(steps=4, burn_in=2), sampling_rate=q)
