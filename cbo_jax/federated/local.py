"""Local training: τ epochs of mini-batch SGD on every agent at once.

One agent's training is a ``lax.scan`` over epochs of a ``lax.scan`` over batches;
:func:`local_train` vmaps it over the agent axis. Every epoch an agent shuffles its
own real samples (padding rows of unequal-size agents are never drawn) and walks
through them in ``ceil(n_max / B)`` batches, the last one partial, like PyTorch's
``DataLoader(shuffle=True, drop_last=False)`` (200 samples with B = 128 give batches
of 128 and 72, as in the FedCBO reference script). The last batch is computed at its
true size (72 rows, not 128 with 56 masked), so no padded row costs a flop when every
agent holds ``n_max`` samples. A batch with no real sample leaves the agent untouched.

The optimizer is optax's SGD with momentum. The FedCBO reference code builds a new
optimizer every round (momentum resets); ``reset_optimizer=True`` does the same, and
``False`` carries the momentum across rounds.

Agent ``j`` shuffles with its own key ``fold_in(key, j)``, so its training does not
depend on how many agents follow it (padding agents of a sharded run).

A model with a training mode (``Model.train_apply``: a Flax module with a ``train`` or
``deterministic`` flag, through :func:`cbo_jax.models.from_flax`) trains in that mode,
with a fresh dropout key for every mini-batch, drawn from a stream of its own (the
shuffles are those of any other model); every loss outside the SGD steps evaluates it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.models import Model, _sample_losses, masked_loss

PyTree = Any

__all__ = ["LocalSGDConfig", "LocalResult", "make_optimizer", "local_train", "agent_loss", "agent_keys", "reduce_sample_losses"]


@dataclasses.dataclass(frozen=True)
class LocalSGDConfig:
    """Local update of FedCBO Algorithm 1, step 2 (defaults: paper §2.4, reference script).

    Attributes:
      epochs: local epochs τ per round.
      batch_size: mini-batch size B.
      lr: learning rate (the splitting scheme's λ2 γ).
      momentum: SGD momentum (0 for plain SGD).
      reset_optimizer: re-initialise the optimizer state every round (reference code).
      agent_chunk: how many agents train in one vectorised kernel: ``None`` (default)
        vmaps all of them at once, one batched matrix product per layer for the whole
        population (the layout accelerators want); ``k`` walks through the agents ``k``
        at a time (``lax.map``), which keeps every product an ordinary 2-D one and holds
        only ``k`` agents' activations in memory. On the 2-core benchmark CPU, ``1`` is the
        faster choice (``benchmarks/RESULTS_fedcbo.md``). Results agree up to float32
        rounding (matrix products of other shapes), not bitwise.
    """

    epochs: int = 10
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    reset_optimizer: bool = True
    agent_chunk: int | None = None

    def __post_init__(self):
        check_types(self)
        _checks.positive_int("epochs", self.epochs)
        _checks.positive_int("batch_size", self.batch_size)
        _checks.positive("lr", self.lr, f32=True)
        m = _checks.non_negative("momentum", self.momentum)
        if not _checks.swept(m) and m >= 1:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if not isinstance(self.reset_optimizer, bool):
            raise ValueError(f"reset_optimizer must be a bool, got {self.reset_optimizer!r}")
        if self.agent_chunk is not None:
            _checks.positive_int("agent_chunk", self.agent_chunk)


def make_optimizer(cfg: LocalSGDConfig) -> optax.GradientTransformation:
    """SGD with step ``lr`` and, where ``momentum > 0``, heavy-ball momentum (a swept momentum,
    :mod:`cbo_jax.federated.sweep`, always: a momentum of 0 then adds nothing)."""
    swept = _checks.swept(cfg.momentum)
    return optax.sgd(cfg.lr, momentum=cfg.momentum if swept or cfg.momentum > 0 else None)


class LocalResult(NamedTuple):
    params: PyTree  # stacked, (N, ...)
    opt_state: PyTree  # stacked
    loss: jax.Array  # (N,) mean mini-batch loss over the last epoch


def _train_one(model: Model, cfg: LocalSGDConfig, opt: optax.GradientTransformation, params, opt_state, x, y, count, key,
               prox=None, correction=None):
    n_max = x.shape[0]
    b = cfg.batch_size
    full, rest = divmod(n_max, b)  # ``full`` batches of B rows, then one of ``rest`` rows (no padded rows)

    dropout = model.train_apply is not None  # training mode: a fresh key every mini-batch

    def grad_step(carry, batch):
        params, opt_state = carry
        idx, mask = batch[:2]
        bkey = batch[2] if dropout else None
        loss, grads = jax.value_and_grad(lambda p: masked_loss(model, p, x[idx], y[idx], mask, key=bkey))(params)
        if prox is not None:  # FedProx: + (mu / 2) |p - anchor|^2 in the minimised objective, not in the reported loss
            mu, anchor = prox
            grads = jax.tree_util.tree_map(lambda g, p, a: g + mu * (p - a).astype(g.dtype), grads, params, anchor)
        if correction is not None:  # SCAFFOLD: a constant term added to every mini-batch gradient
            grads = jax.tree_util.tree_map(lambda g, c: g + c.astype(g.dtype), grads, correction)
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        has_data = jnp.any(mask)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, o: jnp.where(has_data, a, o), new, old)  # noqa: E731
        return (keep(new_params, params), keep(new_opt, opt_state)), (loss, has_data)

    def epoch(carry, key):
        # Real samples first, in random order; padding rows sort last and are masked. The
        # last batch holds the n_max - full·B remaining slots at their true size.
        u = jnp.where(jnp.arange(n_max) < count, jax.random.uniform(key, (n_max,)), 2.0)
        perm = jnp.argsort(u)
        mask = jnp.arange(n_max) < count
        # dropout keys: one per batch from a stream of their own (the shuffle's draw is unchanged)
        bkeys = jax.random.split(jax.random.fold_in(key, 1), full + 1) if dropout else None
        losses, has = [], []
        if full:
            xs = (perm[: full * b].reshape(full, b), mask[: full * b].reshape(full, b))
            carry, (lf, hf) = jax.lax.scan(grad_step, carry, xs + ((bkeys[:full],) if dropout else ()))
            losses.append(lf)
            has.append(hf)
        if rest:
            carry, (lr, hr) = grad_step(carry, (perm[full * b:], mask[full * b:]) + ((bkeys[full],) if dropout else ()))
            losses.append(lr[None])
            has.append(hr[None])
        losses, has = jnp.concatenate(losses), jnp.concatenate(has)
        mean_loss = jnp.sum(losses * has) / jnp.maximum(jnp.sum(has), 1)
        return carry, mean_loss

    (params, opt_state), losses = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, cfg.epochs))
    return params, opt_state, losses[-1]


def agent_keys(key: jax.Array, num_agents: int) -> jax.Array:
    """``(N,)`` per-agent keys ``fold_in(key, j)``: agent ``j``'s stream whatever ``N`` is."""
    return jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(num_agents))


def local_train(model: Model, cfg: LocalSGDConfig, params: PyTree, opt_state: PyTree | None, data: Any,
                key: jax.Array, prox: tuple[float, PyTree] | None = None,
                correction: PyTree | None = None) -> LocalResult:
    """Run :class:`LocalSGDConfig` local training on every agent (vmapped).

    Args:
      model: the agents' model.
      params: stacked parameters ``(N, ...)``.
      opt_state: stacked optimizer state, or ``None`` to start fresh (always fresh when
        ``cfg.reset_optimizer``).
      data: the agents' :class:`~cbo_jax.federated.data.AgentData` (an agent with no
        samples, such as a padding agent, is left untouched).
      key: PRNG key; agent ``j`` uses ``fold_in(key, j)``.
      prox: ``(mu, anchor)``: FedProx's proximal term ``(mu / 2) |θ - anchor|²`` added to every
        agent's objective (``anchor`` stacked as ``params``); ``None``: plain SGD.
      correction: a stacked pytree (as ``params``) added to every mini-batch gradient of its agent,
        ``g_j(θ) + correction[j]`` (SCAFFOLD's ``c - c_j``); ``None``: none (the same program as
        without the argument).
    """
    n_params = jax.tree_util.tree_leaves(params)[0].shape[0]
    if n_params != data.counts.shape[0]:
        raise ValueError(f"params holds {n_params} agents but the data {data.counts.shape[0]}: one model per agent")
    opt = make_optimizer(cfg)
    if opt_state is None or cfg.reset_optimizer:
        opt_state = jax.vmap(opt.init)(params)
    args = (params, opt_state, data.x, data.y, data.counts, agent_keys(key, data.counts.shape[0]))
    mu = None if prox is None else prox[0]
    args = args + tuple(t for t in (None if prox is None else prox[1], correction) if t is not None)

    def one(p, s, xi, yi, c, k, *rest):  # rest: the agent's anchor, then its correction, those given
        a = rest[0] if prox is not None else None
        corr = rest[-1] if correction is not None else None
        return _train_one(model, cfg, opt, p, s, xi, yi, c, k, prox=None if prox is None else (mu, a),
                          correction=corr)
    if cfg.agent_chunk is None:
        return LocalResult(*jax.vmap(one)(*args))
    return LocalResult(*jax.lax.map(lambda a: one(*a), args, batch_size=cfg.agent_chunk))


def agent_loss(model: Model, params: PyTree, x, y, count, batch_size: int | None = None, reduction: str = "mean"):
    """Loss of one model on one agent's data.

    ``reduction="mean"``: the mean loss over the agent's real samples (:func:`masked_loss`).
    ``reduction="sum_of_batch_means"``: the FedCBO reference code's quantity, the sum
    over consecutive mini-batches of size ``batch_size`` of each batch's mean loss
    (200 samples, B = 128: mean of the first 128 plus mean of the last 72).
    """
    if reduction == "mean":
        return masked_loss(model, params, x, y, jnp.arange(x.shape[0]) < count)
    return reduce_sample_losses(_sample_losses(model, params, x, y), count, batch_size, reduction)


def reduce_sample_losses(per: jax.Array, count, batch_size: int | None = None, reduction: str = "mean") -> jax.Array:
    """An agent's loss from its per-sample losses ``per`` (``(n_max,)``, the first
    ``count`` real): the reduction of :func:`agent_loss`, computed the same way."""
    if jnp.issubdtype(per.dtype, jnp.floating) and jnp.finfo(per.dtype).bits < 32:
        per = per.astype(jnp.float32)  # a bfloat16 / float16 model's losses are summed in float32
    real = jnp.arange(per.shape[0]) < count
    if reduction == "mean":  # the count of ``real``, min(count, n_max), without a second reduction
        return jnp.sum(jnp.where(real, per, 0.0)) / jnp.clip(count, 1, per.shape[0]).astype(per.dtype)
    if reduction == "sum_of_batch_means":
        if batch_size is None:
            raise ValueError("reduction='sum_of_batch_means' needs batch_size")
        batch_size = _checks.positive_int("batch_size", batch_size)
        batch = jnp.arange(per.shape[0]) // batch_size
        num = -(-per.shape[0] // batch_size)
        sums = jax.ops.segment_sum(jnp.where(real, per, 0.0), batch, num)
        cnt = jax.ops.segment_sum(real.astype(per.dtype), batch, num)
        return jnp.sum(jnp.where(cnt > 0, sums / jnp.maximum(cnt, 1.0), 0.0))
    raise ValueError(f"reduction must be 'mean' or 'sum_of_batch_means', got {reduction!r}")
