"""FedPD and FedSGLD: primal-dual federated learning, noise-free and with a Langevin oracle.

Both algorithms solve the consensus problem ``min_x (1/N) Σ_i F_i(x)`` (``F_i`` the mean
loss of node ``i``) by an augmented-Lagrangian splitting (FedPD, Zhang et al. 2020;
the FedSGLD paper's §3, Algorithm 1). Per round ``r``, every node ``i``
in parallel (vmapped):

1. approximately minimises (FedPD) or samples (FedSGLD) its local objective

       L_i(x') = F_i(x') + <λ_i, x' - x0_i> + (γ/2) ||x' - x0_i||²,

   with ``Q`` stochastic steps of the *oracle* (:func:`sgld_oracle`, Algorithm 2):
   ``h = ∇̂L_i(x)`` on a Poisson-subsampled mini-batch, clipped to
   ``h / max(1, ||h|| / C)``, then ``x ← x - η_q h + sqrt(η_q) ε ξ``, ``ξ ~ N(0, I)``.
   FedSGLD keeps ``η_q = η`` for the burn-in ``q ≤ Q0``, then ``η_q = η (q - Q0)^(-1/3)``
   and returns the running average of the post-burn-in iterates; FedPD uses a fixed
   step, no noise, and returns the last iterate. Algorithm 2 starts each round's chain
   at the broadcast point, ``x_i^{r+1,0} = x_{0,i}`` (FedSGLD's default,
   ``warm_start=False``); ``warm_start=True`` continues from the node's last iterate;
2. dual update ``λ_i ← λ_i + η_λ γ (x_i - x0_i)``;
3. sends ``x0_i^+ = x_i + λ_i / γ``.

The server averages the messages, ``x0^new = (1/N) Σ_i x0_i^+``, and broadcasts with
momentum, ``x0_i ← x0^new + β (x0^new - x0^old)`` (``β = 0``: FedPD's plain broadcast).
A message holding a NaN or an infinity (a diverged node: ``info.diverged``) is left out of the
average; with no finite message the server keeps ``x0^old``. The oracle and its
Poisson-subsampled gradient are :mod:`cbo_jax.federated.langevin`.

Naming: the paper's Algorithms 1–2 write η for the oracle step, the dual step and the momentum
coefficient; here they are ``lr`` (η), ``dual_lr`` (η_λ, default 1 so that ``λ_i ← λ_i + γ (x_i -
x0_i)`` as in FedPD) and ``server_momentum`` (β). The oracle's noise scale ε is ``noise``.
The oracle is the Euler–Maruyama discretisation of ``dX = -∇L_i dt + sqrt(2T) dW``
with temperature ``T = ε² / 2``: its iterates sample ``exp(-L_i / T)`` as ``η → 0``.

Clipping: Algorithm 2 clips the whole ``h`` (``SGLDConfig(clipping="batch")``, the default);
``"per_sample"`` (beyond the paper, DP-SGD style) clips each sampled ``∇f_j`` and adds
``λ_i + γ (x - x0_i)`` unclipped, with per-device privacy accounting (:mod:`cbo_jax.federated.privacy`).

The "noisy FedPD" baseline of the paper's high-noise case is :func:`fedpd` with
``noise > 0``: the noise ``sqrt(η) ε ξ`` at the same ``ε`` (and the same clipping and Poisson
batches) injected into FedPD's local SGD, but without the Langevin sampling structure:
fixed step, no running average, the last iterate is sent. With its step fixed at ``η`` it
injects more noise per round than FedSGLD, whose steps decay after the burn-in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.federated.algorithms.base import AgentData, Algorithm, broadcast, diverged, per_agent_fields
from cbo_jax.federated.langevin import (OracleSpec, SGLDConfig, check_clip_norm, poisson_clipped_grad, poisson_grad,
                                       sgld_oracle)
from cbo_jax.federated.local import agent_keys
from cbo_jax.models import Model, masked_loss

PyTree = Any

__all__ = ["SGLDConfig", "FedSGLDConfig", "FedPDConfig", "PrimalDualState", "PrimalDualInfo", "fedsgld", "fedpd"]

@dataclasses.dataclass(frozen=True)
class FedSGLDConfig:
    """FedSGLD (Algorithm 1) with the SGLD oracle.

    Attributes:
      oracle: the local :class:`SGLDConfig`.
      gamma: ``γ`` of the augmented Lagrangian (penalty and dual scale).
      dual_lr: ``η_λ`` of the dual update ``λ ← λ + η_λ γ (x - x0)``.
      server_momentum: ``β`` of the broadcast ``x0 + β (x0^new - x0^old)``, in ``[0, 1)``.
      warm_start: ``False`` (default, Algorithm 2: ``x_i^{r+1,0} = x_{0,i}``): each
        round's oracle chain starts at the broadcast point ``x0_i``. ``True``: it
        continues from the node's last oracle iterate of the previous round (the
        ``warm_start_*`` variants of ``fedsgld-synthetic``; the same privacy accounting,
        since the last iterate is counted as released).
      delta: the ``δ`` of the reported ``(ε, δ)`` privacy guarantee, in ``(0, 1)``.
    """

    oracle: SGLDConfig = SGLDConfig()
    gamma: float = 1.0
    dual_lr: float = 1.0
    server_momentum: float = 0.0
    warm_start: bool = False
    delta: float = 1e-5

    def __post_init__(self):
        check_types(self)
        _checks.positive("gamma", self.gamma, f32=True)
        _checks.positive("dual_lr", self.dual_lr, f32=True)
        m = _checks.non_negative("server_momentum", self.server_momentum)
        if m >= 1:
            raise ValueError(f"server_momentum must lie in [0, 1), got {self.server_momentum!r}")
        _check_delta(self.delta)

    def spec(self) -> OracleSpec:
        return self.oracle.spec()


@dataclasses.dataclass(frozen=True)
class FedPDConfig:
    """FedPD (Zhang et al. 2020, as in its authors' reference code) and its noisy variant.

    Local step ``x ← x - lr (∇̂F_i(x) + λ + γ (x - x0)) [+ sqrt(lr) ε ξ]`` for ``Q``
    steps; then ``λ += γ (x - x0)``; send ``x + λ/γ``; the server averages.

    Attributes:
      local_steps: ``Q``.
      lr: local step size.
      gamma: ``γ`` (the reference code's ``μ``).
      sampling_rate: Poisson mini-batch probability ``q`` (1: full batch).
      noise: ``ε`` of injected noise ``sqrt(lr) ε ξ`` (0: FedPD; > 0: the noisy-FedPD
        baseline, same noise without SGLD sampling).
      clip_norm: ``C`` (``None``: no clipping).
      warm_start: start each round from the node's previous local iterate.
      delta: ``δ`` for privacy reporting of the noisy variant, in ``(0, 1)``.
    """

    local_steps: int = 40
    lr: float = 0.01
    gamma: float = 1.0
    sampling_rate: float = 0.1
    noise: float = 0.0
    clip_norm: float | None = None
    warm_start: bool = True
    delta: float = 1e-5

    def __post_init__(self):
        check_types(self)
        _checks.positive_int("local_steps (Q)", self.local_steps)
        _checks.positive("lr", self.lr, f32=True)
        _checks.positive("gamma", self.gamma, f32=True)
        _checks.fraction("sampling_rate (q)", self.sampling_rate)
        _checks.non_negative("noise (epsilon of the injected noise)", self.noise, f32=True)
        check_clip_norm("clip_norm (C)", self.clip_norm)
        _check_delta(self.delta)

    @property
    def dual_lr(self) -> float:
        return 1.0

    @property
    def server_momentum(self) -> float:
        return 0.0

    def spec(self) -> OracleSpec:
        num = _checks.float_or_swept
        return OracleSpec(self.local_steps, self.local_steps, num(self.lr), num(self.noise),
                          None if self.clip_norm is None else num(self.clip_norm), num(self.sampling_rate),
                          False, "last", 0.0)


def _check_delta(delta) -> float:
    d = _checks.finite_number("delta", delta)
    if not 0 < d < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return d


# --------------------------------------------------------------------------- algorithms


@per_agent_fields("x", "lam", "x0")
class PrimalDualState(NamedTuple):
    x: PyTree  # (N, ...) each node's last local iterate (where a warm-started chain continues)
    lam: PyTree  # (N, ...) duals λ_i
    x0: PyTree  # (N, ...) each node's anchor x0_i (the last broadcast)
    server: PyTree  # x0^new of the last round (no agent axis): the server model
    round: jax.Array
    key: jax.Array


@per_agent_fields("train_loss", "clipped", "diverged")
class PrimalDualInfo(NamedTuple):
    train_loss: jax.Array  # (N,) F_i at the node's returned iterate
    clipped: jax.Array  # (N,) batch clipping: share of the oracle steps whose h was clipped; per-sample
    # clipping: mean over the steps of the share of sampled per-sample gradients that were clipped
    diverged: jax.Array | None = None  # (N,) the node's message held a NaN or an infinity: left out of the average


def _primal_dual(name: str, model: Model, cfg, num_agents: int) -> Algorithm:
    n = _checks.positive_int("num_agents", num_agents)
    spec = cfg.spec()
    gamma, dual_lr, beta = (_checks.float_or_swept(v) for v in (cfg.gamma, cfg.dual_lr, cfg.server_momentum))

    def init(key):
        k_model, k_state = jax.random.split(key)
        server = model.init(k_model)
        stacked = broadcast(server, n)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, stacked)
        return PrimalDualState(stacked, zeros, stacked, server, jnp.zeros((), jnp.int32), k_state)

    per_sample = spec.clipping == "per_sample"

    def local(x_start, lam, x0, xi, yi, ci, key):
        def grad_fn(p, k):
            if per_sample:  # clip each ∇f_j (DP-SGD style); the oracle does not clip h again
                g, share = poisson_clipped_grad(model, p, xi, yi, ci, k, spec.sampling_rate, spec.clip_norm)
            else:  # Algorithm 2: the oracle clips the whole h
                g, share = poisson_grad(model, p, xi, yi, ci, k, spec.sampling_rate), None
            # + ∇ of <λ, p - x0> + (γ/2)||p - x0||², eq. (19)
            h = jax.tree_util.tree_map(lambda gi, li, pi, ai: gi + li + gamma * (pi - ai), g, lam, p, x0)
            return (h, share) if per_sample else h

        return sgld_oracle(grad_fn, x_start, key, spec, has_aux=per_sample)

    def round_fn(state: PrimalDualState, data: AgentData):
        key, k_local = jax.random.split(state.key)
        rows = data.counts.shape[0]
        # Algorithm 2: x_i^{r+1,0} = x_{0,i}, the anchor of this round's L_i; or a warm start.
        start = state.x if cfg.warm_start else state.x0
        res = jax.vmap(local)(start, state.lam, state.x0, data.x, data.y, data.counts, agent_keys(k_local, rows))
        x_out = res.average
        lam = jax.tree_util.tree_map(lambda l, a, b: l + dual_lr * gamma * (a - b), state.lam, x_out, state.x0)
        msg = jax.tree_util.tree_map(lambda a, l: a + l / gamma, x_out, lam)
        bad = diverged(msg, data.agent_mask)  # a NaN or an infinity never reaches the server's average
        valid = data.agent_mask & ~bad
        x0_new = jax.tree_util.tree_map(lambda m, old: jnp.where(jnp.any(valid), jnp.sum(jnp.where(
            valid.reshape((rows,) + (1,) * (m.ndim - 1)), m, 0), axis=0) / jnp.sum(valid).astype(m.dtype), old),
            msg, state.server)
        x0_bcast = jax.tree_util.tree_map(lambda new, old: new + beta * (new - old), x0_new, state.server)
        train_loss = jax.vmap(lambda p, xi, yi, ci: masked_loss(model, p, xi, yi, jnp.arange(xi.shape[0]) < ci))(
            x_out, data.x, data.y, data.counts)
        new = PrimalDualState(res.last, lam, broadcast(x0_bcast, rows), x0_new, state.round + 1, key)
        return new, PrimalDualInfo(train_loss, res.clipped, bad)

    return Algorithm(name, init, round_fn, lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.server)),
                     cfg, model=model, build=lambda c: _primal_dual(name, model, c, n))


def fedsgld(model: Model, cfg: FedSGLDConfig, num_agents: int) -> Algorithm:
    """FedSGLD (Algorithm 1 with the SGLD oracle of Algorithm 2) as a pure ``(init, round)`` pair.

    The server model (``eval_models``) is the average ``x0^new`` of the last round. Variants:
    ``cfg.warm_start`` (chain start) and ``cfg.oracle.clipping`` (batch or per-sample).
    """
    if not isinstance(cfg, FedSGLDConfig):
        raise ValueError(f"cfg must be a FedSGLDConfig, got {type(cfg).__name__}")
    return _primal_dual("fedsgld", model, cfg, num_agents)


def fedpd(model: Model, cfg: FedPDConfig, num_agents: int) -> Algorithm:
    """FedPD (noise-free) or, with ``cfg.noise > 0``, the noisy-FedPD baseline."""
    if not isinstance(cfg, FedPDConfig):
        raise ValueError(f"cfg must be a FedPDConfig, got {type(cfg).__name__}")
    return _primal_dual("noisy_fedpd" if cfg.noise > 0 else "fedpd", model, cfg, num_agents)
