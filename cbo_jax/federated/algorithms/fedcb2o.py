"""FedCB²O: consensus-based bi-level optimization against attacks (FedCB²O Algorithms 1–2).

García Trillos, Akash, Li, Riedl and Zhu (§3.4, Algorithms 1–2). Per round ``n``:

1. LocalUpdate: every agent trains τ epochs of mini-batch SGD on its own training data
   (the benign agents on their training split, the attackers on their flipped data).
2. For every benign agent ``j`` (synchronously, from the models after step 1):

   a. ``A_n ← ProbSampling(P^j, M)`` (Algorithm 2): never-observed agents first (only
      those, when at most ``M`` are left), then ``∝ P^{j,i}``;
   b. download ``θ_i, i ∈ A_n``; evaluate them on ``j``'s VALIDATION split: the mean
      loss ``L_j^i`` and the class-wise losses ``L_{j,c}(θ_i)``;
   c. ``P^{j,i} ← (1-ζ) P^{j,i} + ζ exp(-κ L_j^i)``, eq. (3.12) (``P_start``);
   d. robustness criterion, eq. (3.15): ``G^i = max_c [ L_{j,c}(θ_i) - L_{j,c}(θ_j) ]`` over the classes
      present in the validation split (upper-level objective of the bi-level problem);
   e. ``m_j = Σ_i θ_i μ_i / Σ_i μ_i``, ``μ_i = exp(-α G^i)`` over the downloads
      (eq. (3.13)), and ``θ_j ← θ_j - λ1 γ (θ_j - m_j)`` (eq. (3.14));
   f. before round ``T_G`` the energy is the mean validation loss ``L_j^i`` (as FedCBO).
3. The attackers follow their own strategy (:mod:`cbo_jax.federated.attacks`).

``criterion="loss"``: FedCBO with ProbSampling, the attacked baseline. Steps a, c: :mod:`cbo_jax.federated.selection`;
step e: :mod:`cbo_jax.federated.aggregation` (a NaN/inf download weighs nothing; no usable download: the agent keeps
its model). :meth:`FedCB2OConfig.reference_code`: the reference code's form.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax.federated import selection
from cbo_jax.federated.aggregation import Energy, consensus_downloads
from cbo_jax.federated.algorithms.base import Algorithm, diverged, per_agent_fields
from cbo_jax.federated.attacks import (AttackData, agent_roles, attacker_average, attacker_selection, check_split,
                                      grouped_local_train)
from cbo_jax.federated.local import LocalSGDConfig, make_optimizer
from cbo_jax.models import Model, init_population

PyTree = Any

__all__ = ["FedCB2OConfig", "FedCB2OState", "FedCB2OInfo", "class_losses", "robustness_criterion", "g_energy",
           "fedcb2o"]

CRITERIA = ("G", "loss")


@dataclasses.dataclass(frozen=True)
class FedCB2OConfig:
    """FedCB²O parameters (defaults: the paper's experiment, §3.5).

    Attributes:
      M: downloads per benign agent per round.
      lambda1, gamma: the step ``λ1 γ`` of eq. (3.14): 0.04, the paper's numbers (γ = its lr
        0.004, λ2 = 1). The reference code's step is 1 (``gamma=0.1``, :meth:`reference_code`),
        which ``fedcb2o-attack --scale small`` runs: 0.04 needs many rounds.
      alpha: α of ``μ = exp(-α G)``.
      kappa, zeta: ProbSampling's ``P ← (1-ζ) P + ζ exp(-κ L)``, eq. (3.12).
      P_start: ``"first"`` (the first observation sets ``P = exp(-κ L)``) or ``"zero"``
        (the paper's ``P_0 = 0``; :func:`~cbo_jax.federated.selection.update_prob_likelihood`).
      T_G: rounds before which the mean validation loss replaces ``G``.
      criterion: ``"G"`` (FedCB²O) or ``"loss"`` (FedCBO with ProbSampling).
      include_self: put the agent's own model into its average (reference code).
      self_largest: with ``include_self``, from round T_G on give the own model the largest
        weight (its energy is at most the downloads' lowest G), as the reference code does.
      shared_init: every agent starts from one and the same model (the reference code
        deep-copies one model; the paper, and the default, initialise agents independently).
      eval_chunk: benign agents per chunk when evaluating downloads.
      local: local SGD (paper: τ = 5 epochs, batch 64, lr 0.004, momentum 0.9).
    """

    M: int = 20
    lambda1: float = 10.0
    gamma: float = 0.004
    alpha: float = 10.0
    kappa: float = 2.0
    zeta: float = 0.5
    T_G: int = 0
    criterion: str = "G"
    include_self: bool = False
    self_largest: bool = False
    shared_init: bool = False
    eval_chunk: int = 8
    local: LocalSGDConfig = LocalSGDConfig(epochs=5, batch_size=64, lr=0.004, momentum=0.9)
    P_start: str = "first"

    def __post_init__(self):
        check_types(self)
        _checks.positive_int("M", self.M)
        _checks.non_negative("lambda1", self.lambda1, f32=True)
        _checks.positive("gamma", self.gamma, f32=True)
        _checks.aggregation_step(self.lambda1, self.gamma)
        _checks.non_negative("alpha", self.alpha, f32=True)
        _checks.non_negative("kappa", self.kappa, f32=True)
        _checks.fraction("zeta", self.zeta)
        _checks.one_of("P_start", self.P_start, selection.P_STARTS)
        if self.T_G < 0:
            raise ValueError(f"T_G must be >= 0, got {self.T_G!r}")
        _checks.one_of("criterion", self.criterion, CRITERIA)
        if self.self_largest and not self.include_self:
            raise ValueError("self_largest needs include_self=True (it weighs the agent's own model)")
        _checks.positive_int("eval_chunk", self.eval_chunk)

    @property
    def step(self) -> float:
        """The aggregation step ``λ1 γ``."""
        return self.lambda1 * self.gamma

    @classmethod
    def reference_code(cls, **overrides) -> "FedCB2OConfig":
        """The FedCB²O reference script's form: own model in the average with the largest weight
        after T_G, replaced by the average (λ1 γ = 1), one shared initial model, α = 2."""
        kw: dict[str, Any] = dict(include_self=True, self_largest=True, shared_init=True, alpha=2.0, lambda1=10.0,
                                  gamma=0.1)
        kw.update(overrides)
        return cls(**kw)


@per_agent_fields("params", "opt_state")
class FedCB2OState(NamedTuple):
    params: PyTree  # (N, ...) benign agents first, then attackers
    opt_state: PyTree  # (N, ...) used when local.reset_optimizer is False
    P: jax.Array  # (N_b, N) ProbSampling likelihoods of the benign agents (NaN: never observed)
    round: jax.Array
    key: jax.Array


@per_agent_fields("train_loss", "diverged")
class FedCB2OInfo(NamedTuple):
    """Per round, for the benign agents' downloads (``R = N_b`` rows) and every agent's training."""

    idx: jax.Array  # (R, M) downloads
    weights: jax.Array  # (R, M) normalised weights those downloads got in the average
    self_weight: jax.Array  # (R,) weight of the agent's own model (0 when it is not averaged)
    loss: jax.Array  # (R, M) mean validation loss of the downloads (inf for broken models)
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    fallback: jax.Array  # (R,) no usable download: the agent kept its own model
    valid: jax.Array | None  # (R, M) slots that hold a download (ProbSampling may fill fewer than M)
    diverged: jax.Array | None = None  # (N,) agents whose model holds a NaN or an infinity (never averaged)


def class_losses(model: Model, params: PyTree, x: jax.Array, y: jax.Array, count: jax.Array,
                 num_classes: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Validation losses of one model on one agent's data (``count`` real rows of ``x``, ``y``).

    Returns ``(L_c (C,), present (C,), L (,))``: the mean loss over the real samples of each
    class (0 where a class is absent), which classes are present, and the mean over all of them.
    """
    per = model.loss(model.apply(params, x), y)
    real = jnp.arange(x.shape[0]) < count
    onehot = ((y[:, None] == jnp.arange(num_classes)[None, :]) & real[:, None]).astype(per.dtype)
    n_c = jnp.sum(onehot, axis=0)
    per_real = jnp.where(real, per, 0.0)
    l_c = (per_real @ onehot) / jnp.maximum(n_c, 1.0)
    return l_c, n_c > 0, jnp.sum(per_real) / jnp.maximum(count, 1)


def robustness_criterion(l_c_down: jax.Array, l_c_own: jax.Array, present: jax.Array) -> jax.Array:
    """Eq. (3.15): ``G^i = max_c [L_{j,c}(θ_i) - L_{j,c}(θ_j)]`` over the present classes.

    ``l_c_down`` is ``(M, C)``, ``l_c_own`` ``(C,)``, ``present`` ``(C,)``. NaN losses give
    NaN (hence weight zero in the consensus).
    """
    diff = l_c_down - l_c_own[None, :]
    return jnp.max(jnp.where(present[None, :], diff, -jnp.inf), axis=-1)


def g_energy(model: Model, num_classes: int, use_G):
    """The energy of step e for :func:`~cbo_jax.federated.aggregation.consensus_downloads`:
    ``G`` when ``use_G`` (may be traced), else the mean validation loss; the agent's
    own energy is ``0`` (``G``) or its own mean loss."""
    def energy(models, theta_j, x, y, c):
        l_c, _, loss = jax.vmap(lambda p: class_losses(model, p, x, y, c, num_classes))(models)
        l_c_own, present, loss_own = class_losses(model, theta_j, x, y, c, num_classes)
        g = robustness_criterion(l_c, l_c_own, present)
        return Energy(jnp.where(use_G, g, loss), loss, jnp.where(use_G, 0.0, loss_own), loss_own)

    return energy


def fedcb2o(model: Model, cfg: FedCB2OConfig, cluster: ArrayLike, malicious: ArrayLike, num_classes: int | None = None,
            name: str | None = None, *, rule: selection.SelectionRule | None = None) -> Algorithm:
    """Build FedCB²O (or, with ``criterion="loss"``, FedCBO with ProbSampling) under attack.

    Args:
      model: the agents' model (a classifier).
      cfg: :class:`FedCB2OConfig`.
      cluster, malicious: ``(N,)`` cluster ids and attacker mask, benign agents first (as
        :func:`~cbo_jax.federated.attacks.label_flip_rotated` orders them; read by the attackers).
      num_classes: classes of the validation losses (default ``model.num_classes``).
      rule: a :class:`~cbo_jax.federated.selection.SelectionRule` of one's own in place of
        ProbSampling (``cfg.M`` downloads; rows the benign agents, columns all), tried first
        (:func:`~cbo_jax.federated.selection.check_rule`); the name is then ``...-<rule.name>``.

    The round function takes :class:`~cbo_jax.federated.attacks.AttackData` split as
    ``malicious`` says (:func:`~cbo_jax.federated.attacks.check_split`). Agents after the ``N``
    it was built for (padding agents of a sharded run) are never selected and keep their models.
    """
    (cluster, malicious, nb), user_rule = agent_roles(cluster, malicious), rule
    n = cluster.shape[0]
    _checks.downloads(cfg.M, n)
    num_classes = model.num_classes if num_classes is None else _checks.positive_int("num_classes", num_classes)
    if num_classes is None:
        raise ValueError("FedCB²O compares class-wise losses: it needs a classifier (model.num_classes)")
    attackers, default = np.nonzero(malicious)[0], ("fedcb2o" if cfg.criterion == "G" else "fedcbo-probsampling")
    if rule is not None:
        default = f"{default}-{selection.check_rule(rule, cfg.M, nb, n, name or default).name}"
    rule = rule or selection.prob_sampling(cfg.M, cfg.kappa, cfg.zeta, cfg.P_start)

    def init(key: jax.Array) -> FedCB2OState:
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        if cfg.shared_init:  # agent 0's initial model for everyone
            params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a[:1], a.shape), params)
        return FedCB2OState(params, jax.vmap(make_optimizer(cfg.local).init)(params), rule.init(nb, n),
                            jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedCB2OState, data: AttackData):
        check_split(data, nb, n - nb, name or default)
        key, k_local, k_sel, k_att = jax.random.split(state.key, 4)
        trained = grouped_local_train(model, cfg.local, state.params, state.opt_state, data.groups, k_local)
        params = trained.params
        sel = rule.select(k_sel, state.P, state.round)
        use_G = (cfg.criterion == "G") & (state.round >= cfg.T_G)
        own = jax.tree_util.tree_map(lambda a: a[:nb], params)
        val = data.val
        agg = consensus_downloads(g_energy(model, num_classes, use_G), params, sel.idx, own, (val.x, val.y, val.counts),
                                  alpha=cfg.alpha, include_self=cfg.include_self, chunk=cfg.eval_chunk,
                                  valid=sel.valid, self_largest=use_G & cfg.self_largest)
        benign = jax.tree_util.tree_map(lambda t, mj: t - cfg.step * (t - mj), own, agg.consensus)
        P = rule.update(state.P, sel.idx, agg.loss, agg.own_loss, None, sel.valid)
        parts = [benign]
        if attackers.size:
            a_idx, a_valid = attacker_selection(k_att, cluster, malicious, cfg.M)
            sizes = jnp.concatenate([g.counts for g in data.groups]).astype(jnp.float32)
            parts.append(attacker_average(params, jnp.asarray(attackers), a_idx, a_valid, sizes))
        # Agents after the N real ones (padding) keep their models.
        new = jax.tree_util.tree_map(lambda t, *ps: jnp.concatenate(ps + (t[n:],), axis=0), params, *parts)
        info = FedCB2OInfo(sel.idx, agg.weights, agg.self_weight, agg.loss, trained.loss, agg.fallback, sel.valid,
                           diverged(new, n))
        return FedCB2OState(new, trained.opt_state, P, state.round + 1, key), info

    return Algorithm(name or default, init, round_fn, lambda s: ("agent", s.params), cfg, model=model, takes=AttackData,
                     build=lambda c: fedcb2o(model, c, cluster, malicious, num_classes, name, rule=user_rule))
