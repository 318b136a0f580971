"""FedCB²O: consensus-based bi-level optimization against attacks (FedCB²O Algorithms 1–2).

García Trillos, Akash, Li, Riedl and Zhu, "Defending against diverse attacks in
federated learning through consensus-based bi-level optimization" (REFERENCE_NOTES
§2.2). Per round ``n``:

1. LocalUpdate: every agent trains τ epochs of mini-batch SGD on its own training data
   (the benign agents on their training split, the attackers on their flipped data).
2. For every benign agent ``j`` (synchronously, from the models after step 1):

   a. ``A_n ← ProbSampling(P^j, M)``: never-observed agents first, then ``∝ P^{j,i}``;
   b. download ``θ_i, i ∈ A_n``; evaluate them on ``j``'s VALIDATION split: the mean
      loss ``L_j^i`` and the class-wise losses ``L_{j,c}(θ_i)``;
   c. ``P^{j,i} ← (1-ζ) P^{j,i} + ζ exp(-κ L_j^i)`` (the first observation sets it);
   d. robustness criterion, eq. (3.15):
      ``G^i = max_c [ L_{j,c}(θ_i) - L_{j,c}(θ_j) ]`` over the classes present in the
      validation split (upper-level objective of the bi-level problem);
   e. ``m_j = Σ_i θ_i μ_i / Σ_i μ_i``, ``μ_i = exp(-α G^i)`` (eq. (3.10)'s consensus
      point restricted to the downloads), and ``θ_j ← θ_j - λ1 γ (θ_j - m_j)``;
   f. before round ``T_G`` the energy is the mean validation loss ``L_j^i`` instead of
      ``G^i`` (as FedCBO): models must first become good before class-wise comparisons
      mean anything.
3. The attackers follow their own strategy (:mod:`cbo_jax.federated.attacks`).

``criterion="loss"`` uses the mean validation loss in every round: FedCBO with
ProbSampling, the attacked baseline of the paper (the same attackers, the same
selection, only the energy differs).

Numerics: the weights are computed in log space by :mod:`cbo_jax.consensus`, which is
the reference code's "shift G by its minimum before exp" made exact. A downloaded model
whose parameters hold a NaN/inf, or whose loss or criterion is not finite, gets weight
exactly zero (its row is zeroed before the contraction); if no download of an agent is
usable, the agent keeps its own model. So a broken or hostile model never turns a benign
model into NaN.

Paper versus reference code (REFERENCE_NOTES §2.2): the paper averages the downloads
only and steps by ``λ1 γ``; the reference code always includes the agent's own model
(``include_self=True``, energy ``G = 0`` / its own mean loss) and replaces the model by
the average (``λ1 γ = 1``, the default here: ``λ1 = 10``, ``γ = 0.1``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_weights
from cbo_jax.federated import selection
from cbo_jax.federated.algorithms.base import AgentData, Algorithm
from cbo_jax.federated.attacks import AttackData, attacker_average, attacker_selection, grouped_local_train
from cbo_jax.federated.local import LocalResult, LocalSGDConfig, local_train, make_optimizer
from cbo_jax.federated.padding import resize_rows
from cbo_jax.models import Model, cross_entropy, init_population

PyTree = Any

__all__ = ["FedCB2OConfig", "FedCB2OState", "AttackRoundInfo", "class_losses", "robustness_criterion", "aggregate",
           "fedcb2o"]

CRITERIA = ("G", "loss")


@dataclasses.dataclass(frozen=True)
class FedCB2OConfig:
    """FedCB²O parameters (defaults: the paper's experiment, REFERENCE_NOTES §2.2).

    Attributes:
      M: downloads per benign agent per round.
      lambda1, gamma: the aggregation step is ``λ1 γ`` (default 10 · 0.1 = 1).
      alpha: α of ``μ = exp(-α G)``.
      kappa, zeta: ProbSampling's ``P ← (1-ζ) P + ζ exp(-κ L)``.
      T_G: rounds before which the mean validation loss replaces ``G``.
      criterion: ``"G"`` (FedCB²O) or ``"loss"`` (FedCBO with ProbSampling).
      include_self: put the agent's own model into its average (reference code).
      eval_chunk: benign agents per chunk when evaluating downloads.
      local: local SGD (paper: τ = 5 epochs, batch 64, lr 0.004, momentum 0.9).
    """

    M: int = 20
    lambda1: float = 10.0
    gamma: float = 0.1
    alpha: float = 10.0
    kappa: float = 2.0
    zeta: float = 0.5
    T_G: int = 0
    criterion: str = "G"
    include_self: bool = False
    eval_chunk: int = 8
    local: LocalSGDConfig = LocalSGDConfig(epochs=5, batch_size=64, lr=0.004, momentum=0.9)

    def __post_init__(self):
        _checks.positive_int("M", self.M)
        _checks.non_negative("lambda1", self.lambda1)
        _checks.positive("gamma", self.gamma)
        _checks.non_negative("alpha", self.alpha)
        _checks.non_negative("kappa", self.kappa)
        _checks.fraction("zeta", self.zeta)
        if isinstance(self.T_G, bool) or not isinstance(self.T_G, (int, np.integer)) or self.T_G < 0:
            raise ValueError(f"T_G must be an integer >= 0, got {self.T_G!r}")
        _checks.one_of("criterion", self.criterion, CRITERIA)
        if not isinstance(self.include_self, bool):
            raise ValueError(f"include_self must be a bool, got {self.include_self!r}")
        _checks.positive_int("eval_chunk", self.eval_chunk)
        if not isinstance(self.local, LocalSGDConfig):
            raise ValueError(f"local must be a LocalSGDConfig, got {self.local!r}")

    @property
    def step(self) -> float:
        """The aggregation step ``λ1 γ``."""
        return self.lambda1 * self.gamma


class FedCB2OState(NamedTuple):
    params: PyTree  # (N, ...) benign agents first, then attackers
    opt_state: PyTree  # (N, ...) used when local.reset_optimizer is False
    P: jax.Array  # (N_b, N) ProbSampling likelihoods of the benign agents (NaN: never observed)
    round: jax.Array
    key: jax.Array


class AttackRoundInfo(NamedTuple):
    """Per-round by-products of the attacked algorithms (fixed shapes, scanned).

    Attributes:
      idx: ``(R, M)`` downloads of the first ``R`` agents (the benign ones).
      weights: ``(R, M)`` normalised weights those downloads got in the average.
      self_weight: ``(R,)`` weight of the agent's own model (0 when it is not averaged).
      loss: ``(R, M)`` mean validation loss of the downloads (NaN where not measured).
      train_loss: ``(N,)`` mean mini-batch loss of the last local epoch.
    """

    idx: jax.Array
    weights: jax.Array
    self_weight: jax.Array
    loss: jax.Array
    train_loss: jax.Array


def class_losses(model: Model, params: PyTree, x, y, count, num_classes: int):
    """Validation losses of one model on one agent's data.

    Returns ``(L_c (C,), present (C,), L (,))``: the mean cross-entropy over the real
    samples of each class (0 where a class is absent), which classes are present, and
    the mean over all real samples.
    """
    per = cross_entropy(model.apply(params, x), y)
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


def aggregate(model: Model, cfg: FedCB2OConfig, params: PyTree, idx: jax.Array, val: AgentData, use_G,
              num_classes: int):
    """Steps b, d, e for every benign agent (the first ``idx.shape[0]`` rows of ``params``).

    Args:
      params: every agent's model ``(N, ...)`` after local training.
      idx: ``(N_b, M)`` downloads.
      val: the benign agents' validation splits.
      use_G: (traced) bool, ``G`` if True else the mean validation loss.

    Returns ``(loss (N_b, M), weights (N_b, M), self_weight (N_b,), m)``, ``m`` the
    consensus point of every benign agent.
    """
    nb = idx.shape[0]
    clean_all, finite_all = pop.zero_nonfinite_rows(params)
    own_params = jax.tree_util.tree_map(lambda a: a[:nb], params)

    def one_agent(args):
        idx_j, x_j, y_j, c_j, theta_j = args
        down = pop.gather(clean_all, idx_j)  # (M, ...)
        finite = jnp.take(finite_all, idx_j)
        l_c, _, loss = jax.vmap(lambda p: class_losses(model, p, x_j, y_j, c_j, num_classes))(down)
        l_c_own, present, loss_own = class_losses(model, theta_j, x_j, y_j, c_j, num_classes)
        g = robustness_criterion(l_c, l_c_own, present)
        energy = jnp.where(use_G, g, loss)
        energy = jnp.where(finite, energy, jnp.inf)
        loss = jnp.where(finite, loss, jnp.inf)
        if cfg.include_self:
            e_self = jnp.where(use_G, 0.0, loss_own)
            w_all = consensus_weights(jnp.concatenate([energy, e_self[None]]), cfg.alpha)
            w, w_self = w_all[:-1], w_all[-1]
        else:
            w, w_self = consensus_weights(energy, cfg.alpha), jnp.zeros((), energy.dtype)
        usable = jnp.all(jnp.isfinite(w)) & (jnp.sum(w) + w_self > 0)
        w = jnp.where(usable, w, 0.0)
        w_self = jnp.where(usable, w_self, 1.0)  # nothing usable: keep the own model
        m_j = jax.tree_util.tree_map(
            lambda d, t: jnp.tensordot(w.astype(d.dtype), d, axes=(0, 0)) + w_self.astype(t.dtype) * jnp.where(
                jnp.isfinite(t), t, 0.0), down, theta_j)
        return loss, w, w_self, m_j

    return jax.lax.map(one_agent, (idx, val.x, val.y, val.counts, own_params), batch_size=cfg.eval_chunk)


def train_groups(model: Model, cfg: LocalSGDConfig, params: PyTree, opt_state: PyTree, groups: tuple[AgentData, ...],
                 key: jax.Array, num_real: int) -> LocalResult:
    """:func:`~cbo_jax.federated.attacks.grouped_local_train`, also with inactive padding
    agents after the ``num_real`` real ones (sharded runs, :mod:`cbo_jax.federated.padding`).

    The padding lies in the last group; that group's local-training keys are drawn for
    its real agents only, so the real agents get the keys of the unpadded run.
    """
    total = sum(int(g.counts.shape[0]) for g in groups)
    if total == num_real:
        return grouped_local_train(model, cfg, params, opt_state, groups, key)
    extra = total - num_real
    if extra < 0 or extra >= int(groups[-1].counts.shape[0]):
        raise ValueError(f"the data groups hold {total} agents; expected {num_real} real ones, then padding agents in "
                         f"the last group")
    results, start = [], 0
    for i, (g, k) in enumerate(zip(groups, jax.random.split(key, len(groups)))):
        stop = start + int(g.counts.shape[0])
        rows = lambda t: jax.tree_util.tree_map(lambda a: a[start:stop], t)  # noqa: E731
        real = stop - start - extra if i == len(groups) - 1 else None
        results.append(local_train(model, cfg, rows(params), rows(opt_state), g.x, g.y, g.counts, k, num_real=real))
        start = stop
    cat = lambda *xs: jnp.concatenate(xs, axis=0)  # noqa: E731
    return LocalResult(*(jax.tree_util.tree_map(cat, *[getattr(r, f) for r in results]) for f in LocalResult._fields))


def fedcb2o(model: Model, cfg: FedCB2OConfig, cluster, malicious, num_classes: int | None = None,
            name: str | None = None) -> Algorithm:
    """Build FedCB²O (or, with ``criterion="loss"``, FedCBO with ProbSampling) under attack.

    Args:
      model: the agents' model.
      cfg: :class:`FedCB2OConfig`.
      cluster, malicious: ``(N,)`` cluster ids and attacker mask, benign agents first
        (as :func:`~cbo_jax.federated.attacks.label_flip_rotated` orders them). Only the
        attackers' strategy reads them.
      num_classes: classes of the validation losses (default ``model.num_classes``).

    The round function takes :class:`~cbo_jax.federated.attacks.AttackData`. It also
    takes data with inactive padding agents after the ``N`` real ones (in the last
    training group; :func:`cbo_jax.federated.padding.pad_attack_data`), as a sharded
    ``run_attack(..., mesh=)`` passes it: the state then holds them too (``resize``),
    ProbSampling selects among the ``N`` real agents only (``P`` keeps its ``N``
    columns), the attackers never download them, and their models are left out of
    every average. Random numbers are drawn for the ``N`` real agents.
    """
    cluster = np.asarray(cluster, np.int32)
    malicious = np.asarray(malicious, bool)
    n = cluster.shape[0]
    if malicious.shape != (n,):
        raise ValueError(f"malicious must have one entry per agent ({n}), got shape {malicious.shape}")
    nb = int(np.sum(~malicious))
    if np.any(malicious[:nb]) or nb == 0:
        raise ValueError("the benign agents must come first and there must be at least one")
    if cfg.M > n - 1:
        raise ValueError(f"M (downloads per agent) must satisfy 1 <= M <= N - 1 = {n - 1}, got M={cfg.M}")
    num_classes = model.num_classes if num_classes is None else _checks.positive_int("num_classes", num_classes)
    attackers = np.nonzero(malicious)[0]
    has_attackers = attackers.size > 0

    def init(key: jax.Array) -> FedCB2OState:
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return FedCB2OState(params, jax.vmap(make_optimizer(cfg.local).init)(params), selection.init_prob_likelihood(nb, n),
                            jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedCB2OState, data: AttackData):
        key, k_local, k_sel, k_att = jax.random.split(state.key, 4)
        groups = (data.benign, data.malicious) if has_attackers else (data.benign,)
        trained = train_groups(model, cfg.local, state.params, state.opt_state, groups, k_local, n)
        size = pop.num_agents(trained.params)  # n, or more with padding agents (sharded runs)
        params = trained.params
        idx = selection.prob_sampling(k_sel, state.P, cfg.M)
        use_G = (cfg.criterion == "G") & (state.round >= cfg.T_G)
        loss, w, w_self, m = aggregate(model, cfg, params, idx, data.val, use_G, num_classes)
        benign = jax.tree_util.tree_map(lambda t, mj: t[:nb] - cfg.step * (t[:nb] - mj), params, m)
        P = selection.update_prob_likelihood(state.P, idx, loss, cfg.kappa, cfg.zeta)
        if has_attackers:
            a_idx, a_valid = attacker_selection(k_att, cluster, malicious, cfg.M)
            sizes = jnp.concatenate([data.benign.counts, data.malicious.counts]).astype(jnp.float32)
            bad = attacker_average(params, jnp.asarray(attackers), a_idx, a_valid, sizes)
            new = jax.tree_util.tree_map(lambda b, a: jnp.concatenate([b, a], axis=0), benign, bad)
        else:
            new = benign
        if size != n:  # padding agents keep their (never read) models
            new = jax.tree_util.tree_map(lambda a, t: jnp.concatenate([a, t[n:]], axis=0), new, params)
        info = AttackRoundInfo(idx=idx, weights=w, self_weight=w_self, loss=loss, train_loss=trained.loss)
        return FedCB2OState(new, trained.opt_state, P, state.round + 1, key), info

    def resize(state: FedCB2OState, size: int) -> FedCB2OState:
        # Rows of the models only: P (benign rows, N selectable columns) does not change.
        return state._replace(params=resize_rows(state.params, size), opt_state=resize_rows(state.opt_state, size))

    default = "fedcb2o" if cfg.criterion == "G" else "fedcbo-probsampling"
    return Algorithm(name=name or default, init=init, round=round_fn, eval_models=lambda s: ("agent", s.params),
                     config=cfg, resize=resize)
