"""The SGLD oracle of FedSGLD (Algorithm 2) and its Poisson-subsampled gradient.

The oracle is the Euler–Maruyama discretisation of ``dX = -∇L dt + sqrt(2T) dW`` with
temperature ``T = ε² / 2``: ``Q`` steps

    x ← x - η_q clip(h) + sqrt(η_q) ε ξ,    h = ∇̂L(x),   clip(h) = h / max(1, ||h|| / C),

``ξ ~ N(0, I)``, with ``η_q = η`` during the burn-in ``q ≤ Q0`` and then
``η_q = η (q - Q0)^(-1/3)`` (if ``decay``); it returns the running average of the
post-burn-in iterates (or the last iterate). Its iterates sample ``exp(-L / T)`` as
``η → 0``. Clipping is optax's global-norm clipping.

**Two clipping modes** (``SGLDConfig.clipping``):

* ``"batch"`` (the paper's Algorithm 2, the default): ``clip`` acts on the whole
  mini-batch gradient ``h`` of the augmented Lagrangian ``L_i`` (eq. (19)), including the
  dual term ``λ_i`` and the proximal pull ``γ (x - x0_i)``.
* ``"per_sample"`` (beyond the paper, as in DP-SGD, Abadi et al. 2016): only the data
  term is clipped, sample by sample (:func:`poisson_clipped_grad`),

      h = (1 / (q n_i)) Σ_{j ∈ B} clip(∇f_j(x)) + λ_i + γ (x - x0_i),

  and the oracle does not clip ``h`` again. ``λ_i``, ``x`` and ``x0_i`` are functions of
  earlier releases, so the unclipped terms cost no privacy; the accounting is in
  :mod:`cbo_jax.federated.privacy`.

**Poisson subsampling with fixed shapes** (:func:`poisson_grad`). A node's padded data
has ``n_max`` rows of which ``n_i`` are real. Each step draws an independent
Bernoulli(``q``) mask over the ``n_max`` rows (padding rows always off), so every real
sample is in the batch with probability ``q`` independently of the others: exactly
Poisson subsampling, as the privacy accounting assumes. The gradient is the masked
*sum* of per-sample gradients divided by the *expected* batch size ``q n_i``: an
unbiased estimate of ``∇F_i``, whose shape never depends on the draw; an empty batch
gives ``g = 0``. :func:`poisson_clipped_grad` draws the same mask and clips each sampled
per-sample gradient before the sum (its estimate of ``∇F_i`` is biased where clipping
is active).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.models import Model, zero_padding

PyTree = Any

# optax >= 0.2.5 names it optax.tree.norm (optax.global_norm is deprecated there).
_global_norm = optax.tree.norm if hasattr(getattr(optax, "tree", None), "norm") else optax.global_norm

__all__ = ["SGLDConfig", "OracleSpec", "OracleResult", "CLIPPING", "step_sizes", "sgld_oracle", "poisson_grad",
           "poisson_clipped_grad", "temperature"]


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
    clipping: str = "batch"  # "batch" (Algorithm 2: clip h) | "per_sample" (clip each ∇f_j, not λ, γ(x - x0))


AVERAGES = ("uniform", "ema", "last")
CLIPPING = ("batch", "per_sample")


def check_clip_norm(name: str, value) -> float | None:
    if value is None:
        return None
    return _checks.positive(name, value, f32=True)


def _non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


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
      clipping: what ``C`` clips. ``"batch"`` (Algorithm 2, the default): the whole
        mini-batch gradient of the augmented Lagrangian. ``"per_sample"`` (beyond the
        paper, DP-SGD style): each sampled per-sample gradient of the data loss ``F_i``,
        summed and divided by the expected batch size ``q n_i``; ``λ_i + γ (x - x0_i)``
        is added unclipped (module docstring; needs a ``clip_norm``). It materialises
        one gradient per padded sample and step (memory ``n_max ×`` the parameters).
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
    clipping: str = "batch"

    def __post_init__(self):
        check_types(self)
        q = _checks.positive_int("steps (Q)", self.steps)
        q0 = _non_negative_int("burn_in (Q0)", self.burn_in)
        if q0 >= q:
            raise ValueError(f"burn_in (Q0) must be < steps (Q) so that the oracle samples after the burn-in; "
                             f"got Q0={q0}, Q={q}")
        _checks.positive("lr (eta)", self.lr, f32=True)
        _checks.non_negative("noise (epsilon of the SGLD oracle)", self.noise, f32=True)
        check_clip_norm("clip_norm (C)", self.clip_norm)
        _checks.fraction("sampling_rate (q)", self.sampling_rate)
        _checks.one_of("average", self.average, AVERAGES)
        if not isinstance(self.decay, bool):
            raise ValueError(f"decay must be a bool, got {self.decay!r}")
        s = _checks.non_negative("avg_decay", self.avg_decay)
        if s >= 1:
            raise ValueError(f"avg_decay must lie in [0, 1), got {self.avg_decay!r}")
        _checks.one_of("clipping", self.clipping, CLIPPING)
        if self.clipping == "per_sample" and self.clip_norm is None:
            raise ValueError("clipping='per_sample' needs a clip_norm (C); got clip_norm=None")

    def spec(self) -> OracleSpec:
        num = _checks.float_or_swept  # a sweep's traced numbers stay traced (cbo_jax.federated.sweep)
        return OracleSpec(self.steps, self.burn_in, num(self.lr), num(self.noise),
                          None if self.clip_norm is None else num(self.clip_norm), num(self.sampling_rate),
                          bool(self.decay), self.average, num(self.avg_decay), self.clipping)


class OracleResult(NamedTuple):
    last: PyTree  # the last iterate x_Q (where the next chain continues)
    average: PyTree  # the returned iterate (the running average, or x_Q for "last")
    clipped: jax.Array  # "batch": share of the Q steps whose h was clipped; "per_sample": mean over the
    # Q steps of the share of sampled per-sample gradients that were clipped (the grad_fn's aux)


def temperature(noise: float) -> float:
    """The oracle's temperature ``T = ε² / 2``: its iterates sample ``exp(-L / T)``."""
    return 0.5 * float(noise) ** 2


def step_sizes(spec: OracleSpec, dtype=jnp.float32) -> jax.Array:
    """``(Q,)`` step sizes: ``η`` for ``q ≤ Q0``, then ``η (q - Q0)^(-1/3)`` (if ``decay``), the
    steps counted ``q = 1, ..., Q`` (Algorithm 2 counts from 0: its decay starts one step later;
    docs/guides/fedsgld.md). ``dtype``: the chain's (:func:`sgld_oracle` passes its parameters')."""
    if hasattr(spec, "spec"):
        spec = spec.spec()
    q = jnp.arange(1, spec.steps + 1, dtype=dtype)
    if not spec.decay:
        return jnp.full((spec.steps,), spec.lr, dtype)
    return jnp.where(q <= spec.burn_in, spec.lr, spec.lr * jnp.maximum(q - spec.burn_in, 1.0) ** (-1.0 / 3.0))


def _chain_dtype(tree: PyTree):
    """The dtype the oracle's scalars (step sizes, averaging factors, normalisers) take for
    parameters ``tree``: float32, or the parameters' own where wider (a float64 chain)."""
    return jnp.result_type(jnp.float32, *(leaf.dtype for leaf in jax.tree_util.tree_leaves(tree)))


def _normal_tree(key: jax.Array, tree: PyTree) -> PyTree:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(treedef, [jax.random.normal(k, l.shape, l.dtype) for k, l in zip(keys, leaves)])


def sgld_oracle(grad_fn: Callable[[PyTree, jax.Array], PyTree], x: PyTree, key: jax.Array, spec,
                has_aux: bool = False) -> OracleResult:
    """The SGLD oracle (Algorithm 2; module docstring) for one node; vmap it over nodes.

    ``grad_fn(x, key_q)`` is a stochastic gradient of the local objective; ``spec`` an
    :class:`OracleSpec` or a config with a ``spec()`` method. A ``lax.scan`` over ``q``.
    The chain starts at ``x`` (Algorithm 2: the broadcast point ``x0_i``).

    With ``spec.clipping == "batch"`` the oracle clips ``h = grad_fn(...)`` to
    ``spec.clip_norm``. With ``"per_sample"`` the clipping is ``grad_fn``'s job (e.g.
    :func:`poisson_clipped_grad`) and ``h`` is used as it is. ``has_aux``: ``grad_fn``
    returns ``(h, share)``, ``share`` a scalar in ``[0, 1]`` (the share of clipped
    per-sample gradients) that ``OracleResult.clipped`` averages over the steps.
    """
    if hasattr(spec, "spec"):
        spec = spec.spec()
    dtype = _chain_dtype(x)
    etas = step_sizes(spec, dtype)
    q0 = spec.burn_in
    batch_clip = spec.clip_norm is not None and spec.clipping == "batch"
    clip = optax.clip_by_global_norm(spec.clip_norm) if batch_clip else None

    def step(carry, inp):
        x, avg = carry
        q, eta, k = inp
        k_grad, k_noise = jax.random.split(k)
        if has_aux:
            h, clipped = grad_fn(x, k_grad)
            clipped = jnp.asarray(clipped, jnp.float32)
        else:
            h = grad_fn(x, k_grad)
            clipped = jnp.zeros((), bool)
        if clip is not None:
            batch_clipped = _global_norm(h) > spec.clip_norm
            clipped = jnp.maximum(clipped, batch_clipped.astype(jnp.float32)) if has_aux else batch_clipped
            h, _ = clip.update(h, optax.EmptyState())
        x = jax.tree_util.tree_map(lambda a, g: a - eta.astype(a.dtype) * g, x, h)
        if _checks.swept(spec.noise) or spec.noise > 0:  # a swept ε of 0 adds 0
            scale = jnp.sqrt(eta) * spec.noise
            x = jax.tree_util.tree_map(lambda a, z: a + scale.astype(a.dtype) * z, x, _normal_tree(k_noise, x))
        if spec.average == "last":
            avg = x
        else:
            t = q - q0  # position in the sampling phase (1, 2, ...); <= 0 during burn-in
            sigma = (t - 1.0) / jnp.maximum(t, 1.0) if spec.average == "uniform" else jnp.where(t == 1, 0.0,
                                                                                               spec.avg_decay)
            sigma = jnp.where(t >= 1, sigma, 0.0)
            avg = jax.tree_util.tree_map(lambda m, a: sigma.astype(a.dtype) * m + (1 - sigma).astype(a.dtype) * a, avg, x)
        return (x, avg), clipped

    qs = jnp.arange(1, spec.steps + 1, dtype=dtype)
    (x, avg), clipped = jax.lax.scan(step, (x, x), (qs, etas, jax.random.split(key, spec.steps)))
    return OracleResult(x, avg, jnp.mean(clipped.astype(jnp.float32)))


def poisson_grad(model: Model, params: PyTree, x, y, count, key, q: float) -> PyTree:
    """Unbiased Poisson-subsampled gradient of one node's mean loss (module docstring)."""
    real = jnp.arange(x.shape[0]) < count
    mask = real if q >= 1 else real & jax.random.bernoulli(key, q, real.shape)
    denom = q * jnp.maximum(count, 1).astype(_chain_dtype(params))
    x, y = zero_padding(x, real), zero_padding(y, real)  # NaN padding would reach the gradient (0 · NaN)

    def loss(p):
        per = model.loss(model.apply(p, x), y)
        return jnp.sum(jnp.where(mask, per, 0.0)) / denom

    return jax.grad(loss)(params)


def _per_sample_norms(per: PyTree) -> jax.Array:
    """``(n,)`` Euclidean norms of the per-sample gradients (leaves ``(n, ...)``), global over
    all parameters as in optax's global-norm clipping."""
    sq = [jnp.sum(jnp.reshape(leaf, (leaf.shape[0], -1)).astype(_chain_dtype(leaf)) ** 2, axis=1)
          for leaf in jax.tree_util.tree_leaves(per)]
    return jnp.sqrt(sum(sq))


def poisson_clipped_grad(model: Model, params: PyTree, x, y, count, key, q: float,
                         clip_norm: float) -> tuple[PyTree, jax.Array]:
    """Per-sample clipped Poisson-subsampled gradient of one node's data loss (DP-SGD style).

    The same Bernoulli(``q``) mask as :func:`poisson_grad` (same key, same draw), then

        g = (1 / (q n_i)) Σ_{j sampled} ∇f_j / max(1, ||∇f_j|| / C),

    ``∇f_j`` the gradient of sample ``j``'s loss (one ``vmap``-ed ``grad`` per padded row;
    padding rows are never sampled), ``||·||`` the global norm over all parameters, and
    ``q n_i`` the *expected* batch size, a constant of the mechanism. The terms of the
    augmented Lagrangian that carry no data (``λ_i + γ (x - x0_i)``) are not part of it.

    Returns ``(g, share)``: ``share`` the fraction of the sampled rows whose gradient was
    clipped (0 for an empty batch). ``g`` is a biased estimate of ``∇F_i`` where clipping
    is active; the privacy accounting of this mechanism is
    :func:`cbo_jax.federated.privacy.noise_multipliers` with ``clipping="per_sample"``.
    """
    real = jnp.arange(x.shape[0]) < count
    mask = real if q >= 1 else real & jax.random.bernoulli(key, q, real.shape)
    denom = q * jnp.maximum(count, 1).astype(_chain_dtype(params))
    x, y = zero_padding(x, real), zero_padding(y, real)  # NaN padding would reach the gradient (0 · NaN)

    def sample_grad(xj, yj):
        return jax.grad(lambda p: model.loss(model.apply(p, xj[None]), yj[None])[0])(params)

    # Per-sample gradients serve only for their norms; the clipped sum is then the
    # gradient of the weighted loss Σ_j w_j f_j with the weights held fixed (the same
    # vector, without a tensordot over the stacked per-sample gradients).
    norms = _per_sample_norms(jax.vmap(sample_grad)(x, y))
    # min(1, C / ||g_j||) = 1 / max(1, ||g_j|| / C); a zero gradient keeps factor 1.
    scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, jnp.finfo(jnp.float32).tiny))
    weight = jax.lax.stop_gradient(jnp.where(mask, scale, 0.0) / denom)

    def weighted_loss(p):
        per = model.loss(model.apply(p, x), y)
        return jnp.sum(jnp.where(mask, weight * per, 0.0))

    g = jax.grad(weighted_loss)(params)
    n_sampled = jnp.sum(mask)
    share = jnp.sum(mask & (norms > clip_norm)) / jnp.maximum(n_sampled, 1)
    return g, share.astype(jnp.float32)
