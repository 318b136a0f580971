"""(ε, δ) differential privacy of the SGLD oracle, per device and per round.

The paper (FedSGLD, §3.3) defines Poisson subsampling (Definition 3.1) and clipping
(Definition 3.2) and promises a DP analysis, but gives no theorem. This module supplies a
standard one: every oracle step is a Poisson-subsampled Gaussian mechanism, accounted
with Google's ``dp-accounting`` library. This module only maps the oracle's parameters
onto that mechanism; the bounds are the library's.

**The analysis the accountant implements.** ``dp_accounting.rdp.RdpAccountant`` with the
add-or-remove-one neighbouring relation: the Rényi DP of the Poisson-subsampled
Gaussian mechanism (Mironov, Talwar and Zhang 2019, "Rényi differential privacy of the
sampled Gaussian mechanism": exact at integer orders, a numerical bound at fractional
ones), additive composition of RDP over steps and rounds (Mironov 2017), and the
RDP-to-(ε, δ) conversion of Canonne, Kamath and Steinke 2020 (Proposition 12; also
Asoodeh et al. 2020), minimised over the orders.

**The mechanism.** One oracle step of node ``i`` (Algorithm 2) is

    x ← x - η_q (g + a) + sqrt(η_q) ε ξ,   ξ ~ N(0, I),

where ``g`` is the only term that reads a Poisson sample (each record independently with
probability ``q``) of node ``i``'s training set and ``a`` is a function of earlier
releases. Given those releases the step is an invertible affine map of
``g + N(0, σ_q² I)`` with ``σ_q = ε / sqrt(η_q)``: a Gaussian mechanism on ``g`` with
noise multiplier ``z_q = σ_q / Δ``, ``Δ`` the ℓ2 sensitivity of ``g`` to one record.
The sampled-Gaussian analysis needs, for a record ``s`` added to the dataset, that
``g`` is unchanged when ``s`` is not sampled and moves by at most ``Δ`` when it is.

**Batch clipping** (``clipping="batch"``, Algorithm 2, the default): ``g = clip(h)``, the
clipped mini-batch gradient of the whole augmented Lagrangian (``a = 0``). Adding ``s``
to the sampled batch can move ``clip(h)`` anywhere inside the ball of radius ``C``, so
the only general bound is ``Δ = 2C`` (the ball's diameter), and

    z_q = ε / (2 C sqrt(η_q)),

the same for every device.

**Per-sample clipping** (``clipping="per_sample"``, beyond the paper, DP-SGD style,
Abadi et al. 2016): ``g = (1 / (q n_i)) Σ_{j ∈ B} clip(∇f_j)`` and
``a = λ_i + γ (x - x0_i)``. Each record's clipped gradient depends on that record only,
so adding ``s`` changes the sum by exactly ``clip(∇f_s)`` if ``s`` is sampled and by
nothing otherwise: ``||Δ sum|| ≤ C``. The normaliser ``q n_i`` is a constant of the
mechanism, fixed from device ``i``'s published training-set size ``n_i`` (it is not
recomputed for the neighbouring dataset; the guarantee is for that mechanism, as in
DP-SGD implementations that divide by the expected batch size). Hence

    Δ_i = C / (q n_i),    z_{q,i} = σ_q / Δ_i = ε q n_i / (C sqrt(η_q)).

The multiplier grows with the device's data size: a device with more records gets a
smaller ε, and the smallest device has the largest ε (the RDP of the subsampled
Gaussian decreases with ``z``). :func:`account` therefore needs the devices' sizes and
reports ε per device, with ``PrivacyReport.epsilon`` the largest (the guarantee every
device has). ``a`` carries ``λ_i``, ``x`` and ``x0_i``: the dual and the iterate are
functions of node ``i``'s earlier (released) iterates, ``x0_i`` of the broadcasts; the
RDP accountant composes adaptively, so ``a`` costs nothing extra.

**What the accounting assumes** (both modes).

* Neighbouring datasets differ by adding or removing one record of *one device's*
  training set (record-level DP of that device's data); the guarantee is local: it does
  not rely on the server averaging over devices or on any trusted party.
* Every oracle iterate is released (a conservative upper bound: the device actually
  sends only ``x_i + λ_i / γ`` once per round, a post-processing of its iterates, the
  running average and the dual, all of which are themselves post-processing). So the
  chain's start (the broadcast ``x0_i``, Algorithm 2, or the last iterate, a warm start)
  does not change the accounting.
* The ``Q`` steps of a round and the rounds compose adaptively; per round the events
  are ``Q`` Poisson-subsampled Gaussian mechanisms with multipliers ``z_1, ..., z_Q``
  (constant ``z`` during the burn-in, growing as ``η_q`` decays afterwards). After
  ``r`` rounds the RDP curve is ``r`` times one round's; ε is the conversion above at
  the optimal order.
* The Poisson mask is secret and exactly Bernoulli(``q``) per record per step (as the
  fixed-shape implementation draws it), the Gaussian noise is exact (floating-point
  effects are ignored), the initial model is data-independent, and the dataset sizes
  ``n_i`` are public.
* No clipping (``C = None``) or no noise (``ε = 0``) gives ``ε = ∞``. The low-noise case
  of the paper (noise ``10^-4``) gives a multiplier so small that the guarantee is
  vacuous; the accountant reports that honestly (a huge or infinite ε).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from cbo_jax import _checks

__all__ = ["PrivacyReport", "sensitivity", "noise_multipliers", "round_event", "account", "SENSITIVITY_FACTOR"]

# Δ = SENSITIVITY_FACTOR · C for the clipped mini-batch gradient (see the module docstring).
SENSITIVITY_FACTOR = 2.0


def _spec(cfg):
    return cfg.spec() if hasattr(cfg, "spec") else cfg


def _delta(delta) -> float:
    d = _checks.finite_number("delta", delta)
    if not 0 < d < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return d


def _orders(orders):
    """RDP orders as a tuple of floats: a non-empty 1-D sequence of finite numbers >= 1."""
    if orders is None:
        return None
    arr = np.asarray(orders)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"orders must be a non-empty 1-D sequence of RDP orders (numbers >= 1), got {orders!r}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"orders must be finite, got {orders!r}")
    if np.any(arr < 1):
        raise ValueError(f"orders must be >= 1 (Renyi divergence orders), got {orders!r}")
    return tuple(arr.tolist())


def _step_sizes(spec) -> np.ndarray:
    q = np.arange(1, spec.steps + 1, dtype=np.float64)
    if not spec.decay:
        return np.full(spec.steps, float(spec.lr))
    return np.where(q <= spec.burn_in, spec.lr, spec.lr * np.maximum(q - spec.burn_in, 1.0) ** (-1.0 / 3.0))


def _clipping(spec) -> str:
    return getattr(spec, "clipping", "batch")


def _device_size(value) -> int:
    if not _checks.is_integer(value):
        raise ValueError(f"device size n_i must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"device size n_i must be >= 1, got {value!r}")
    return int(value)


def _device_sizes(values) -> tuple[int, ...]:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"device_sizes must be a non-empty 1-D sequence of integers, got shape {arr.shape}")
    return tuple(_device_size(v) for v in arr.tolist())


def sensitivity(cfg, device_size: int | None = None) -> float:
    """ℓ2 sensitivity ``Δ`` of the data term of one oracle step (module docstring).

    ``clipping="batch"``: ``Δ = 2C``; ``clipping="per_sample"``: ``Δ_i = C / (q n_i)``
    with ``n_i = device_size`` (required); no clipping: ``inf``.
    """
    spec = _spec(cfg)
    if spec.clip_norm is None:
        return math.inf
    if _clipping(spec) == "per_sample":
        if device_size is None:
            raise ValueError("per-sample clipping: the sensitivity C / (q n_i) needs the device size n_i")
        return spec.clip_norm / (spec.sampling_rate * _device_size(device_size))
    return SENSITIVITY_FACTOR * spec.clip_norm


def noise_multipliers(cfg, device_size: int | None = None) -> np.ndarray:
    """``(Q,)`` noise multipliers ``z_q = ε / (Δ sqrt(η_q))`` of one round's oracle steps.

    Batch clipping: ``z_q = ε / (2 C sqrt(η_q))``. Per-sample clipping:
    ``z_q = ε q n_i / (C sqrt(η_q))`` for a device with ``n_i = device_size`` records.
    ``cfg``: an ``SGLDConfig``, ``FedSGLDConfig``, ``FedPDConfig`` or ``OracleSpec``.
    Zero noise gives 0; no clipping gives 0 as well (unbounded sensitivity).
    """
    spec = _spec(cfg)
    etas = _step_sizes(spec)
    if spec.clip_norm is None or spec.noise == 0:
        return np.zeros_like(etas)
    if _clipping(spec) == "per_sample":
        return spec.noise / (sensitivity(spec, device_size) * np.sqrt(etas))
    return spec.noise / (SENSITIVITY_FACTOR * spec.clip_norm * np.sqrt(etas))


def round_event(cfg, sampling_rate: float | None = None, device_size: int | None = None):
    """One round of one device as a ``dp_accounting`` event: ``Q`` composed
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z_q))`` (equal ``z`` grouped).
    ``device_size``: ``n_i``, needed for per-sample clipping."""
    import dp_accounting

    spec = _spec(cfg)
    q = _checks.fraction("sampling_rate", spec.sampling_rate if sampling_rate is None else sampling_rate)
    zs = noise_multipliers(spec, device_size)
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
      epsilon: ``(rounds,)`` ε after rounds ``1..R`` of the least protected device (batch
        clipping: every device's).
      delta: δ.
      order: ``(rounds,)`` the optimal RDP order at each round (of that device).
      noise_multipliers: ``(Q,)`` the ``z_q`` of one round (of that device).
      sampling_rate: ``q``.
      sensitivity: ``Δ`` (``2C``; per-sample clipping: ``C / (q n_i)`` of that device;
        ``inf`` without clipping).
      clipping: ``"batch"`` or ``"per_sample"``.
      device_epsilon: ``(rounds, N)`` ε of every device, when the device sizes were given
        (``None`` otherwise).
      device_sizes: the ``n_i`` used, or ``None``.
    """

    epsilon: np.ndarray
    delta: float
    order: np.ndarray
    noise_multipliers: np.ndarray
    sampling_rate: float
    sensitivity: float
    clipping: str = "batch"
    device_epsilon: np.ndarray | None = None
    device_sizes: tuple[int, ...] | None = None

    def per_device(self, num_devices: int | None = None) -> np.ndarray:
        """``(rounds, N)`` ε of each device after each round.

        With per-device accounting (``device_sizes`` given) this is ``device_epsilon``
        (``num_devices``, if given, must match); otherwise every device has ``epsilon``.
        """
        if self.device_epsilon is not None:
            n = self.device_epsilon.shape[1]
            if num_devices is not None and _checks.positive_int("num_devices", num_devices) != n:
                raise ValueError(f"num_devices={num_devices} but the report has {n} devices")
            return self.device_epsilon
        if num_devices is None:
            raise ValueError("num_devices is required when the report was computed without device sizes")
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


def _epsilon_curve(spec, rounds: int, delta: float, orders, device_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    acc = dp_accounting.rdp.RdpAccountant(orders) if orders is not None else dp_accounting.rdp.RdpAccountant()
    with _quiet_absl():
        # The library logs (and then skips) fractional orders near 1 whose series fail to
        # converge for small multipliers; those orders never give the minimum there.
        acc.compose(round_event(spec, device_size=device_size))
    one_round = acc.rdp
    eps, order = np.empty(rounds), np.empty(rounds)
    for k in range(1, rounds + 1):
        eps[k - 1], order[k - 1] = rdp_lib.compute_epsilon(acc.orders, k * one_round, delta)
    return eps, order


def account(cfg, rounds: int, delta: float | None = None, orders=None, device_sizes=None) -> PrivacyReport:
    """(ε, δ) of each device after each of ``rounds`` rounds of the oracle ``cfg``.

    Args:
      cfg: a ``FedSGLDConfig`` / ``FedPDConfig`` (their ``delta`` is the default δ),
        an ``SGLDConfig`` or an ``OracleSpec``.
      rounds: number of communication rounds.
      delta: δ in ``(0, 1)`` (default: ``cfg.delta``).
      orders: RDP orders, numbers >= 1 (default: the library's).
      device_sizes: ``(N,)`` training-set sizes ``n_i`` (e.g. ``AgentData.counts``):
        required for per-sample clipping, whose multiplier depends on ``n_i``
        (module docstring); with batch clipping they only shape ``device_epsilon``.
    """
    r = _checks.positive_int("rounds", rounds)
    if delta is None:
        delta = getattr(cfg, "delta", None)
        if delta is None:
            raise ValueError("delta is required (the config has no delta)")
    d = _delta(delta)
    orders = _orders(orders)
    spec = _spec(cfg)
    mode = _clipping(spec)
    sizes = None if device_sizes is None else _device_sizes(device_sizes)
    if mode == "per_sample" and sizes is None:
        raise ValueError("per-sample clipping is accounted per device: pass device_sizes (the n_i of every device)")

    if mode == "batch":
        zs = noise_multipliers(spec)
        sens = sensitivity(spec)
        if np.any(zs <= 0):
            eps, order = np.full(r, np.inf), np.full(r, np.nan)
        else:
            eps, order = _epsilon_curve(spec, r, d, orders, None)
        table = None if sizes is None else np.repeat(eps[:, None], len(sizes), axis=1)
        return PrivacyReport(eps, d, order, zs, spec.sampling_rate, sens, mode, table, sizes)

    # Per-sample clipping: one accounting per distinct device size.
    curves = {}
    for n in sorted(set(sizes)):
        zs = noise_multipliers(spec, n)
        if np.any(zs <= 0):
            curves[n] = (np.full(r, np.inf), np.full(r, np.nan))
        else:
            curves[n] = _epsilon_curve(spec, r, d, orders, n)
    table = np.stack([curves[n][0] for n in sizes], axis=1)
    worst = sizes[int(np.argmax(table[-1]))]  # the least protected device after the last round
    eps, order = curves[worst]
    eps = table.max(axis=1)
    return PrivacyReport(eps, d, order, noise_multipliers(spec, worst), spec.sampling_rate, sensitivity(spec, worst),
                         mode, table, sizes)
