"""FedPD and FedSGLD: primal-dual federated learning, noise-free and with a Langevin oracle.

Both algorithms solve the consensus problem ``min_x (1/N) Σ_i F_i(x)`` (``F_i`` the mean
loss of node ``i``) by an augmented-Lagrangian splitting (FedPD, Zhang et al. 2020;
the FedSGLD paper's Algorithm 1; REFERENCE_NOTES §3). Per round ``r``, every node ``i``
in parallel (vmapped):

1. approximately minimises (FedPD) or samples (FedSGLD) its local objective

       L_i(x') = F_i(x') + <λ_i, x' - x0_i> + (γ/2) ||x' - x0_i||²,

   with ``Q`` stochastic steps of the *oracle* (:func:`sgld_oracle`, Algorithm 2):
   ``h = ∇̂L_i(x)`` on a Poisson-subsampled mini-batch, clipped to
   ``h / max(1, ||h|| / C)``, then ``x ← x - η_q h + sqrt(η_q) ε ξ``, ``ξ ~ N(0, I)``.
   FedSGLD keeps ``η_q = η`` for the burn-in ``q ≤ Q0``, then ``η_q = η (q - Q0)^(-1/3)``
   and returns the running average of the post-burn-in iterates; FedPD uses a fixed
   step, no noise, and returns the last iterate;
2. dual update ``λ_i ← λ_i + η_λ γ (x_i - x0_i)``;
3. sends ``x0_i^+ = x_i + λ_i / γ``.

The server averages the messages, ``x0^new = (1/N) Σ_i x0_i^+``, and broadcasts with
momentum, ``x0_i ← x0^new + β (x0^new - x0^old)`` (``β = 0``: FedPD's plain broadcast).

**Poisson subsampling with fixed shapes.** A node's padded data has ``n_max`` rows of
which ``n_i`` are real. Each oracle step draws an independent Bernoulli(``q``) mask over
the ``n_max`` rows (padding rows always off), so every real sample is in the batch with
probability ``q`` independently of the others: exactly Poisson subsampling, as the
privacy accounting assumes. The batch gradient is the masked *sum* of per-sample
gradients divided by the *expected* batch size ``q n_i`` (not by the realised size):
``g = (1 / (q n_i)) Σ_j m_j ∇ℓ_j(x)``. This is an unbiased estimate of ``∇F_i(x)``,
its shape never depends on the draw (one compiled program, vmappable over nodes of
unequal sizes), and an empty batch simply gives ``g = 0``. The cost is a forward and
backward pass over all ``n_max`` rows per step, which is cheap for the linear models
this benchmark uses. ``q = 1`` is the full-batch gradient.

Naming: the notes write η for three things (the oracle step, the dual step and the
momentum coefficient); here they are three parameters, ``lr`` (η), ``dual_lr`` (η_λ,
default 1 so that ``λ_i ← λ_i + γ (x_i - x0_i)`` as in FedPD) and ``server_momentum``
(β). The oracle's noise scale ε is called ``noise`` to keep ε for differential privacy.
The oracle is the Euler–Maruyama discretisation of ``dX = -∇L_i dt + sqrt(2T) dW``
with temperature ``T = ε² / 2``: its iterates sample ``exp(-L_i / T)`` as ``η → 0``.

The "noisy FedPD" baseline of the paper's high-noise case is :func:`fedpd` with
``noise > 0``: the same per-step noise ``sqrt(η) ε ξ`` (and the same clipping and Poisson
batches) injected into FedPD's local SGD, but without the Langevin sampling structure:
fixed step, no running average, the last iterate is sent.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import Algorithm, AgentData, RoundInfo
from cbo_jax.federated.padding import agent_keys, agents_in, resize_rows
from cbo_jax.models import Model, cross_entropy

PyTree = Any

__all__ = ["SGLDConfig", "FedSGLDConfig", "FedPDConfig", "OracleSpec", "OracleResult", "PrimalDualState",
           "sgld_oracle", "step_sizes", "fedsgld", "fedpd", "global_norm", "clip_by_global_norm", "temperature",
           "poisson_grad", "node_loss"]

AVERAGES = ("uniform", "ema", "last")


def _clip_norm(name: str, value) -> float | None:
    if value is None:
        return None
    return _checks.positive(name, value)


def _non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


class OracleSpec(NamedTuple):
    """What the oracle kernel (and the privacy accountant) needs, whichever algorithm."""

    steps: int  # Q
    burn_in: int  # Q0 (steps with the fixed step size)
    lr: float  # η
    noise: float  # ε
    clip_norm: float | None  # C (None: no clipping)
    sampling_rate: float  # q
    decay: bool  # η (q - Q0)^(-1/3) after the burn-in
    average: str  # "uniform" | "ema" | "last"
    avg_decay: float  # σ of the exponential moving average


@dataclasses.dataclass(frozen=True)
class SGLDConfig:
    """The SGLD oracle of FedSGLD (Algorithm 2).

    Attributes:
      steps: ``Q``, oracle iterations per round.
      burn_in: ``Q0 < Q``, iterations with the fixed step ``η`` (burn-in); the running
        average covers the ``Q - Q0`` iterations after it.
      lr: ``η``.
      noise: ``ε``, the noise is ``sqrt(η_q) ε ξ`` (temperature ``T = ε²/2``).
      clip_norm: ``C`` for ``h / max(1, ||h|| / C)`` (global norm over all parameters);
        ``None`` disables clipping (and any privacy guarantee).
      sampling_rate: Poisson sampling probability ``q`` of each sample per step.
      decay: use ``η (q - Q0)^(-1/3)`` after the burn-in (``False``: fixed ``η``).
      average: ``"uniform"``: the plain mean of the post-burn-in iterates
        (``x_avg ← σ_t x_avg + (1 - σ_t) x`` with ``σ_t = (t-1)/t``); ``"ema"``:
        constant ``σ = avg_decay``; ``"last"``: no averaging.
      avg_decay: ``σ`` of the ``"ema"`` average, in ``[0, 1)``.
    """

    steps: int = 40
    burn_in: int = 20
    lr: float = 0.01
    noise: float = 0.5
    clip_norm: float | None = 10.0
    sampling_rate: float = 0.1
    decay: bool = True
    average: str = "uniform"
    avg_decay: float = 0.9

    def __post_init__(self):
        q = _checks.positive_int("steps (Q)", self.steps)
        q0 = _non_negative_int("burn_in (Q0)", self.burn_in)
        if q0 >= q:
            raise ValueError(f"burn_in (Q0) must be < steps (Q) so that the oracle samples after the burn-in; "
                             f"got Q0={q0}, Q={q}")
        _checks.positive("lr (eta)", self.lr)
        _checks.non_negative("noise (epsilon of the SGLD oracle)", self.noise)
        _clip_norm("clip_norm (C)", self.clip_norm)
        _checks.fraction("sampling_rate (q)", self.sampling_rate)
        _checks.one_of("average", self.average, AVERAGES)
        s = _checks.non_negative("avg_decay", self.avg_decay)
        if s >= 1:
            raise ValueError(f"avg_decay must lie in [0, 1), got {self.avg_decay!r}")

    def spec(self) -> OracleSpec:
        return OracleSpec(self.steps, self.burn_in, float(self.lr), float(self.noise),
                          None if self.clip_norm is None else float(self.clip_norm), float(self.sampling_rate),
                          bool(self.decay), self.average, float(self.avg_decay))


@dataclasses.dataclass(frozen=True)
class FedSGLDConfig:
    """FedSGLD (Algorithm 1) with the SGLD oracle.

    Attributes:
      oracle: the local :class:`SGLDConfig`.
      gamma: ``γ`` of the augmented Lagrangian (penalty and dual scale).
      dual_lr: ``η_λ`` of the dual update ``λ ← λ + η_λ γ (x - x0)``.
      server_momentum: ``β`` of the broadcast ``x0 + β (x0^new - x0^old)``, in ``[0, 1)``.
      warm_start: each round's oracle chain starts from the node's last iterate
        (``False``: from the broadcast ``x0_i``).
      delta: the ``δ`` of the reported ``(ε, δ)`` privacy guarantee, in ``(0, 1)``.
    """

    oracle: SGLDConfig = SGLDConfig()
    gamma: float = 1.0
    dual_lr: float = 1.0
    server_momentum: float = 0.0
    warm_start: bool = True
    delta: float = 1e-5

    def __post_init__(self):
        if not isinstance(self.oracle, SGLDConfig):
            raise ValueError(f"oracle must be an SGLDConfig, got {type(self.oracle).__name__}")
        _checks.positive("gamma", self.gamma)
        _checks.positive("dual_lr", self.dual_lr)
        m = _checks.non_negative("server_momentum", self.server_momentum)
        if m >= 1:
            raise ValueError(f"server_momentum must lie in [0, 1), got {self.server_momentum!r}")
        _check_delta(self.delta)

    def spec(self) -> OracleSpec:
        return self.oracle.spec()


@dataclasses.dataclass(frozen=True)
class FedPDConfig:
    """FedPD (Zhang et al. 2020; REFERENCE_NOTES §3, reference code) and its noisy variant.

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
        _checks.positive_int("local_steps (Q)", self.local_steps)
        _checks.positive("lr", self.lr)
        _checks.positive("gamma", self.gamma)
        _checks.fraction("sampling_rate (q)", self.sampling_rate)
        _checks.non_negative("noise (epsilon of the injected noise)", self.noise)
        _clip_norm("clip_norm (C)", self.clip_norm)
        _check_delta(self.delta)

    @property
    def dual_lr(self) -> float:
        return 1.0

    @property
    def server_momentum(self) -> float:
        return 0.0

    def spec(self) -> OracleSpec:
        return OracleSpec(self.local_steps, self.local_steps, float(self.lr), float(self.noise),
                          None if self.clip_norm is None else float(self.clip_norm), float(self.sampling_rate),
                          False, "last", 0.0)


def _check_delta(delta) -> float:
    d = _checks.finite_number("delta", delta)
    if not 0 < d < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return d


# --------------------------------------------------------------------------- oracle


def global_norm(tree: PyTree) -> jax.Array:
    """Euclidean norm of all entries of ``tree`` together."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree_util.tree_leaves(tree)))


def clip_by_global_norm(tree: PyTree, clip_norm: float) -> tuple[PyTree, jax.Array]:
    """``h / max(1, ||h|| / C)`` and whether it clipped."""
    norm = global_norm(tree)
    scale = 1.0 / jnp.maximum(1.0, norm / clip_norm)
    return jax.tree_util.tree_map(lambda leaf: leaf * scale.astype(leaf.dtype), tree), norm > clip_norm


def _normal_tree(key: jax.Array, tree: PyTree) -> PyTree:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(treedef, [jax.random.normal(k, l.shape, l.dtype) for k, l in zip(keys, leaves)])


def step_sizes(spec: OracleSpec) -> jax.Array:
    """``(Q,)`` step sizes: ``η`` for ``q ≤ Q0``, then ``η (q - Q0)^(-1/3)`` (if ``decay``)."""
    q = jnp.arange(1, spec.steps + 1, dtype=jnp.float32)
    if not spec.decay:
        return jnp.full((spec.steps,), spec.lr, jnp.float32)
    return jnp.where(q <= spec.burn_in, spec.lr, spec.lr * jnp.maximum(q - spec.burn_in, 1.0) ** (-1.0 / 3.0))


class OracleResult(NamedTuple):
    last: PyTree  # the last iterate x_Q (where the next chain continues)
    average: PyTree  # the returned iterate (the running average, or x_Q for "last")
    clipped: jax.Array  # share of the Q steps whose gradient was clipped


def sgld_oracle(grad_fn: Callable[[PyTree, jax.Array], PyTree], x: PyTree, key: jax.Array,
                spec: OracleSpec | SGLDConfig) -> OracleResult:
    """The SGLD oracle, Algorithm 2, for one node (vmap it over nodes).

    ``Q`` steps ``x ← x - η_q clip(h) + sqrt(η_q) ε ξ`` with ``h = grad_fn(x, key_q)`` a
    stochastic gradient of the local objective, ``clip(h) = h / max(1, ||h|| / C)``,
    ``η_q`` from :func:`step_sizes`; the returned iterate is the running average of the
    post-burn-in iterates (or the last one). A ``lax.scan`` over ``q``.
    """
    if isinstance(spec, SGLDConfig):
        spec = spec.spec()
    etas = step_sizes(spec)
    q0 = spec.burn_in

    def step(carry, inp):
        x, avg = carry
        q, eta, k = inp
        k_grad, k_noise = jax.random.split(k)
        h = grad_fn(x, k_grad)
        if spec.clip_norm is not None:
            h, clipped = clip_by_global_norm(h, spec.clip_norm)
        else:
            clipped = jnp.zeros((), bool)
        x = jax.tree_util.tree_map(lambda a, g: a - eta.astype(a.dtype) * g, x, h)
        if spec.noise > 0:
            scale = jnp.sqrt(eta) * spec.noise
            x = jax.tree_util.tree_map(lambda a, z: a + scale.astype(a.dtype) * z, x, _normal_tree(k_noise, x))
        if spec.average == "last":
            avg = x
        else:
            t = q - q0  # position in the sampling phase (1, 2, ...); <= 0 during burn-in
            if spec.average == "uniform":
                sigma = (t - 1.0) / jnp.maximum(t, 1.0)
            else:
                sigma = jnp.where(t == 1, 0.0, spec.avg_decay)
            sigma = jnp.where(t >= 1, sigma, 0.0)
            avg = jax.tree_util.tree_map(lambda m, a: sigma.astype(a.dtype) * m + (1 - sigma).astype(a.dtype) * a, avg, x)
        return (x, avg), clipped

    qs = jnp.arange(1, spec.steps + 1, dtype=jnp.float32)
    (x, avg), clipped = jax.lax.scan(step, (x, x), (qs, etas, jax.random.split(key, spec.steps)))
    return OracleResult(x, avg, jnp.mean(clipped.astype(jnp.float32)))


# --------------------------------------------------------------------------- algorithms


class PrimalDualState(NamedTuple):
    x: PyTree  # (N, ...) each node's last local iterate (the warm start of its next chain)
    lam: PyTree  # (N, ...) duals λ_i
    x0: PyTree  # (N, ...) each node's anchor x0_i (the last broadcast)
    server: PyTree  # x0^new of the last round (no agent axis): the server model
    round: jax.Array
    key: jax.Array


def poisson_grad(model: Model, params: PyTree, x, y, count, key, q: float) -> PyTree:
    """Unbiased Poisson-subsampled gradient of one node's mean loss (module docstring).

    Every real row is in the batch with probability ``q``; the masked sum of per-sample
    gradients is divided by the expected batch size ``q · n_i``.
    """
    real = jnp.arange(x.shape[0]) < count
    mask = real if q >= 1 else real & jax.random.bernoulli(key, q, real.shape)
    denom = q * jnp.maximum(count, 1).astype(jnp.float32)

    def loss(p):
        per = cross_entropy(model.apply(p, x), y)
        return jnp.sum(jnp.where(mask, per, 0.0)) / denom

    return jax.grad(loss)(params)


def node_loss(model: Model, params: PyTree, x, y, count) -> jax.Array:
    """``F_i``: mean cross-entropy over a node's real samples."""
    per = cross_entropy(model.apply(params, x), y)
    return jnp.sum(jnp.where(jnp.arange(x.shape[0]) < count, per, 0.0)) / jnp.maximum(count, 1)


def _broadcast(tree: PyTree, n: int) -> PyTree:
    return jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (n,) + leaf.shape), tree)


def _primal_dual(name: str, model: Model, cfg, num_agents: int) -> Algorithm:
    n = _checks.positive_int("num_agents", num_agents)
    spec = cfg.spec()
    gamma, dual_lr, beta = float(cfg.gamma), float(cfg.dual_lr), float(cfg.server_momentum)

    def init(key):
        k_model, k_state = jax.random.split(key)
        server = model.init(k_model)
        stacked = _broadcast(server, n)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, stacked)
        return PrimalDualState(stacked, zeros, stacked, server, jnp.zeros((), jnp.int32), k_state)

    def local(x_start, lam, x0, xi, yi, ci, key):
        def grad_fn(p, k):
            g = poisson_grad(model, p, xi, yi, ci, k, spec.sampling_rate)
            # ∇ of <λ, p - x0> + (γ/2)||p - x0||²
            return jax.tree_util.tree_map(lambda gi, li, pi, ai: gi + li + gamma * (pi - ai), g, lam, p, x0)

        return sgld_oracle(grad_fn, x_start, key, spec)

    def round_fn(state: PrimalDualState, data: AgentData):
        size = agents_in(data, n)  # n, or more with padding agents (sharded runs): left out of the average
        key, k_local = jax.random.split(state.key)
        start = state.x if cfg.warm_start else state.x0
        res = jax.vmap(local)(start, state.lam, state.x0, data.x, data.y, data.counts, agent_keys(k_local, n, size))
        x_out = res.average
        lam = jax.tree_util.tree_map(lambda l, a, b: l + dual_lr * gamma * (a - b), state.lam, x_out, state.x0)
        msg = jax.tree_util.tree_map(lambda a, l: a + l / gamma, x_out, lam)
        if size == n:
            x0_new = jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), msg)
        else:
            real = jnp.arange(size) < n
            x0_new = jax.tree_util.tree_map(
                lambda m: jnp.sum(jnp.where(real.reshape((size,) + (1,) * (m.ndim - 1)), m, 0), axis=0) / n, msg)
        x0_bcast = jax.tree_util.tree_map(lambda new, old: new + beta * (new - old), x0_new, state.server)
        train_loss = jax.vmap(lambda p, xi, yi, ci: node_loss(model, p, xi, yi, ci))(x_out, data.x, data.y, data.counts)
        info = RoundInfo(resize_rows(jnp.ones((n,), bool), size), jnp.zeros((size, 0), jnp.int32),
                         jnp.zeros((size, 0), bool), jnp.zeros(()), train_loss, jnp.zeros((size,), jnp.int32))
        new = PrimalDualState(res.last, lam, _broadcast(x0_bcast, size), x0_new, state.round + 1, key)
        return new, info

    def eval_models(state):
        return "server", jax.tree_util.tree_map(lambda leaf: leaf[None], state.server)

    def resize(state: PrimalDualState, size: int) -> PrimalDualState:
        return state._replace(x=resize_rows(state.x, size), lam=resize_rows(state.lam, size),
                              x0=resize_rows(state.x0, size))

    return Algorithm(name, init, round_fn, eval_models, cfg, resize)


def fedsgld(model: Model, cfg: FedSGLDConfig, num_agents: int) -> Algorithm:
    """FedSGLD (Algorithm 1 with the SGLD oracle of Algorithm 2) as a pure ``(init, round)`` pair.

    The server model (``eval_models``) is the average ``x0^new`` of the last round.
    """
    if not isinstance(cfg, FedSGLDConfig):
        raise ValueError(f"cfg must be a FedSGLDConfig, got {type(cfg).__name__}")
    return _primal_dual("fedsgld", model, cfg, num_agents)


def fedpd(model: Model, cfg: FedPDConfig, num_agents: int) -> Algorithm:
    """FedPD (noise-free) or, with ``cfg.noise > 0``, the noisy-FedPD baseline."""
    if not isinstance(cfg, FedPDConfig):
        raise ValueError(f"cfg must be a FedPDConfig, got {type(cfg).__name__}")
    return _primal_dual("noisy_fedpd" if cfg.noise > 0 else "fedpd", model, cfg, num_agents)


def temperature(noise: float) -> float:
    """The oracle's temperature ``T = ε² / 2``: its iterates sample ``exp(-L / T)``."""
    return 0.5 * float(noise) ** 2

