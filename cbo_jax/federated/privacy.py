"""(ε, δ) differential privacy of the SGLD oracle, per device and per round.

The accounting uses Google's ``dp-accounting`` library (its Rényi-DP accountant,
``dp_accounting.rdp.RdpAccountant``, for the Poisson-subsampled Gaussian mechanism of
Mironov, Talwar and Zhang 2019). This module only maps the oracle's parameters onto
that mechanism; the bounds are the library's.

**The mechanism.** One oracle step of node ``i`` (Algorithm 2) is

    x ← x - η_q clip(h) + sqrt(η_q) ε ξ,   ξ ~ N(0, I),   clip(h) = h / max(1, ||h|| / C),

where ``h`` is computed from a Poisson sample (each record independently with
probability ``q``) of node ``i``'s training set. The data enter only through
``η_q clip(h)``; dividing by ``η_q``, the step releases ``clip(h) + N(0, σ_q² I)`` with
``σ_q = ε / sqrt(η_q)``.

**Sensitivity.** The oracle clips the *mini-batch* gradient (the whole ``h``), not each
per-sample gradient as DP-SGD does. Adding or removing one record from the sampled
batch can then move ``clip(h)`` anywhere inside the ball of radius ``C``, so the only
general bound on the change is ``Δ = 2C`` (the ball's diameter). The noise multiplier
handed to the accountant is therefore

    z_q = σ_q / Δ = ε / (2 C sqrt(η_q)).

(With per-sample clipping and a sum normalised by the expected batch size ``q n_i``,
``Δ`` would be ``C / (q n_i)``, far smaller; that is not what Algorithm 2 does.)

**What the accounting assumes.**

* Neighbouring datasets differ by adding or removing one record of *one device's*
  training set (record-level DP of that device's data); the guarantee is local: it does
  not rely on the server averaging over devices or on any trusted party.
* Every oracle iterate is released (a conservative upper bound: the device actually
  sends only ``x_i + λ_i / γ`` once per round, a post-processing of its iterates, the
  running average and the dual, all of which are themselves post-processing).
* The ``Q`` steps of a round and the rounds compose adaptively; per round the events
  are ``Q`` Poisson-subsampled Gaussian mechanisms with multipliers ``z_1, ..., z_Q``
  (constant ``z`` during the burn-in, growing as ``η_q`` decays afterwards). After
  ``r`` rounds the RDP curve is ``r`` times one round's; ε is the library's RDP-to-(ε, δ)
  conversion at the optimal order.
* The Poisson mask is secret and exactly Bernoulli(``q``) per record per step (as the
  fixed-shape implementation draws it), the Gaussian noise is exact (floating-point
  effects are ignored), the initial model is data-independent, and the dataset sizes
  ``n_i`` are public.
* No clipping (``C = None``) or no noise (``ε = 0``) gives ``ε = ∞``. The low-noise case
  of the paper (noise ``10^-4``) gives a multiplier so small that the guarantee is
  vacuous; the accountant reports that honestly (a huge or infinite ε).

Since ``q``, ``C``, ``η`` and ``ε`` are shared by all devices, every device has the same
guarantee; :meth:`PrivacyReport.per_device` spells it out as a ``(rounds, N)`` table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from cbo_jax import _checks

__all__ = ["PrivacyReport", "noise_multipliers", "round_event", "account", "SENSITIVITY_FACTOR"]

# Δ = SENSITIVITY_FACTOR · C for the clipped mini-batch gradient (see the module docstring).
SENSITIVITY_FACTOR = 2.0


def _spec(cfg):
    return cfg.spec() if hasattr(cfg, "spec") else cfg


def _delta(delta) -> float:
    d = _checks.finite_number("delta", delta)
    if not 0 < d < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return d


def _step_sizes(spec) -> np.ndarray:
    q = np.arange(1, spec.steps + 1, dtype=np.float64)
    if not spec.decay:
        return np.full(spec.steps, float(spec.lr))
    return np.where(q <= spec.burn_in, spec.lr, spec.lr * np.maximum(q - spec.burn_in, 1.0) ** (-1.0 / 3.0))


def noise_multipliers(cfg) -> np.ndarray:
    """``(Q,)`` noise multipliers ``z_q = ε / (2 C sqrt(η_q))`` of one round's oracle steps.

    ``cfg``: an ``SGLDConfig``, ``FedSGLDConfig``, ``FedPDConfig`` or ``OracleSpec``.
    Zero noise gives 0; no clipping gives 0 as well (unbounded sensitivity).
    """
    spec = _spec(cfg)
    etas = _step_sizes(spec)
    if spec.clip_norm is None or spec.noise == 0:
        return np.zeros_like(etas)
    return spec.noise / (SENSITIVITY_FACTOR * spec.clip_norm * np.sqrt(etas))


def round_event(cfg, sampling_rate: float | None = None):
    """One round of one device as a ``dp_accounting`` event: ``Q`` composed
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z_q))`` (equal ``z`` grouped)."""
    import dp_accounting

    spec = _spec(cfg)
    q = float(spec.sampling_rate if sampling_rate is None else sampling_rate)
    zs = noise_multipliers(spec)
    events = []
    values, counts = np.unique(zs, return_counts=True)
    for z, c in zip(values, counts):
        ev = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(float(z)))
        events.append(ev if c == 1 else dp_accounting.SelfComposedDpEvent(ev, int(c)))
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """Per-round privacy of every device.

    Attributes:
      epsilon: ``(rounds,)`` ε after rounds ``1..R`` (same for every device).
      delta: δ.
      order: ``(rounds,)`` the optimal RDP order at each round.
      noise_multipliers: ``(Q,)`` the ``z_q`` of one round.
      sampling_rate: ``q``.
      sensitivity: ``Δ = 2C`` (``inf`` without clipping).
    """

    epsilon: np.ndarray
    delta: float
    order: np.ndarray
    noise_multipliers: np.ndarray
    sampling_rate: float
    sensitivity: float

    def per_device(self, num_devices: int) -> np.ndarray:
        """``(rounds, N)`` ε of each device after each round."""
        return np.repeat(self.epsilon[:, None], _checks.positive_int("num_devices", num_devices), axis=1)

    def final(self) -> dict:
        eps = float(self.epsilon[-1])
        return {"epsilon": eps if math.isfinite(eps) else float("inf"), "delta": self.delta}


@contextlib.contextmanager
def _quiet_absl():
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl is a dependency of dp-accounting
        yield
        return
    old = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(old)


def account(cfg, rounds: int, delta: float | None = None, orders=None) -> PrivacyReport:
    """(ε, δ) of each device after each of ``rounds`` rounds of the oracle ``cfg``.

    Args:
      cfg: a ``FedSGLDConfig`` / ``FedPDConfig`` (their ``delta`` is the default δ),
        an ``SGLDConfig`` or an ``OracleSpec``.
      rounds: number of communication rounds.
      delta: δ in ``(0, 1)`` (default: ``cfg.delta``).
      orders: RDP orders (default: the library's).
    """
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    r = _checks.positive_int("rounds", rounds)
    if delta is None:
        delta = getattr(cfg, "delta", None)
        if delta is None:
            raise ValueError("delta is required (the config has no delta)")
    d = _delta(delta)
    spec = _spec(cfg)
    zs = noise_multipliers(spec)
    sens = math.inf if spec.clip_norm is None else SENSITIVITY_FACTOR * spec.clip_norm
    if np.any(zs <= 0):
        eps = np.full(r, np.inf)
        return PrivacyReport(eps, d, np.full(r, np.nan), zs, spec.sampling_rate, sens)
    acc = dp_accounting.rdp.RdpAccountant(orders) if orders is not None else dp_accounting.rdp.RdpAccountant()
    with _quiet_absl():
        # The library logs (and then skips) fractional orders near 1 whose series fail to
        # converge for small multipliers; those orders never give the minimum there.
        acc.compose(round_event(spec))
    one_round = acc.rdp
    eps, order = np.empty(r), np.empty(r)
    for k in range(1, r + 1):
        eps[k - 1], order[k - 1] = rdp_lib.compute_epsilon(acc.orders, k * one_round, d)
    return PrivacyReport(eps, d, order, zs, spec.sampling_rate, sens)
