"""FedCBO: consensus-based optimization for clustered federated learning.

Algorithm 1 of Carrillo, García Trillos, Li and Zhu (§2.3; equation numbers of the arXiv
version), the splitting scheme eq. (18) of the particle system eq. (4). Per round ``n``:

1. ``G_n``: the participating agents (all of them in the paper).
2. LocalUpdate: τ epochs of mini-batch SGD (step ``λ2 γ``) on each agent's data.
3. LocalAggregation, for every ``j`` in ``G_n`` synchronously (from the models after 2):

   a. ``A_n ← ε-greedySampling(P^j, G_n, M)`` (Algorithm 2, Remark 3): ``⌊εM⌋`` random picks
      from ``G_n``, the rest the top-``P^j`` agents of the remaining ones, never ``j`` itself.
      With fewer than ``M`` other participants the slots left over are empty
      (``FedCBOInfo.valid``): they weigh nothing in (19) and leave ``P`` unchanged;
   b. ``L_j^i``: loss of each downloaded ``θ_i`` on ``j``'s own training data;
   c. ``m_j = Σ_i θ_i μ_i / Σ_i μ_i``, ``μ_i = exp(-α L_j^i)``              (19)
   d. ``θ_j ← θ_j - λ1 γ (θ_j - m_j)`` [+ Appendix E noise, JMLR eq. (70),
      ``σ1 √γ |θ_j - m_j| z`` (isotropic) or ``σ1 √γ (θ_j - m_j) ∘ z`` (anisotropic),
      ``z`` drawn from agent ``j``'s own stream ``fold_in(key, j)``]                (20)
   e. ``P^{j,i} ← P^{j,i} + (L_j^j - L_j^i)`` for ``i ∈ A_n``                 (21)

Steps b–c are :func:`cbo_jax.federated.aggregation.consensus_downloads` (or, with
``eval_by="model"``, :func:`~cbo_jax.federated.aggregation.consensus_by_model`) with the
energy ``L_j^i`` (log-space weights; a non-finite download gets weight zero, and an
agent with no usable download keeps its own model). Steps a and e are a selection rule
(:mod:`cbo_jax.federated.selection`): ε-greedy, uniform, or FedCB²O's ProbSampling.
``eval_chunk`` (:mod:`cbo_jax.federated.memory`): downloads evaluated at once; ``downloads``
(:func:`cbo_jax.federated.exchange.exchange_downloads`): how they travel on a mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax.config import check_types
from cbo_jax import population as pop
from cbo_jax.federated import selection
from cbo_jax.federated.selection import SelectionRule
from cbo_jax.federated.aggregation import (DownloadMap, consensus_by_model, consensus_downloads, group_loss,
                                           loss_energy)
from cbo_jax.federated.algorithms.base import (AgentData, Algorithm, diverged, participants, per_agent_fields,
                                               tree_where_rows)
from cbo_jax.federated.local import LocalSGDConfig, local_train, make_optimizer
from cbo_jax.models import Model, init_population
from cbo_jax.sde import diffusion, per_particle_normal

PyTree = Any

__all__ = ["FedCBOConfig", "FedCBOState", "FedCBOInfo", "fedcbo", "loss_energy"]

LOSS_REDUCTIONS = ("mean", "sum_of_batch_means")


@dataclasses.dataclass(frozen=True)
class FedCBOConfig:
    """FedCBO parameters (defaults: the paper's §2.4 and the authors' reference script).

    Attributes:
      M: downloads per agent per round (``1 <= M <= N - 1``).
      lambda1, gamma: the aggregation step is ``λ1 γ``; ``γ`` is also the time step of
        the Appendix E noise (of scale ``σ1 √γ``). Defaults: ``γ = 0.1`` as in the paper's
        splitting (local learning rate ``λ2 γ = 0.1`` with ``λ2 = 1``) and
        ``λ1 = 9.8``, so that ``λ1 γ = 0.98`` as in the reference script.
      alpha: α of the weights μ = exp(-α L), eq. (19).
      selection: ``"epsilon_greedy"`` (Remark 3), ``"uniform"``, or ``"prob_sampling"``
        (FedCB²O's ProbSampling, the FedCBO baseline of the FedCB²O paper).
      eps0, eps_decay, eps_min: ε(n) = max(eps0 - eps_decay·n, eps_min), ``eps_min <= eps0``.
      noise: Appendix E aggregation noise, ``"none"``, ``"isotropic"`` or ``"anisotropic"``.
      sigma1: its strength σ1.
      noise_gamma: the noise's time step γ_noise, its scale ``σ1 √γ_noise`` (none: ``gamma``,
        eq. (70) as written). The isotropic noise multiplies the spread about m by
        ``(1 - λ1γ)² + σ1² γ_noise d`` per round (``d`` parameters), so as written it is
        stable only for ``σ1 < 1/√(γ d)``. ``fedcbo-noise`` runs 0.01, the value that fits
        Appendix E's rows (the reference script adds no noise: ``--Gamma 0.98 --Sigma 0``;
        0.01 is only its ``--Gamma`` argument's default).
      loss_reduction: ``"mean"`` (paper) or ``"sum_of_batch_means"`` (reference code)
        for the losses in (19) and (21).
      participation: share of agents in ``G_n`` each round (1 = all, as the paper).
      eval_chunk: agents per chunk when evaluating downloaded models (with
        ``eval_by="model"``: agents' data sets per forward pass of one model).
      eval_by: ``"agent"`` evaluates each agent's ``M`` downloads on its data, ``eval_chunk``
        agents at a time (:func:`~cbo_jax.federated.aggregation.consensus_downloads`);
        ``"model"`` evaluates each model on the data of the agents that downloaded it
        (:func:`~cbo_jax.federated.aggregation.consensus_by_model`): the same results up to
        float rounding, faster on a CPU, and no per-agent copy of the ``M`` downloads.
      local: the local SGD configuration.
      kappa, zeta, P_start: κ, ζ and the first observation's rule of ProbSampling (unused
        otherwise; :func:`~cbo_jax.federated.selection.update_prob_likelihood`).
    """

    M: int = 200
    lambda1: float = 9.8
    gamma: float = 0.1
    alpha: float = 10.0
    selection: str = "epsilon_greedy"
    eps0: float = 0.5
    eps_decay: float = 0.01
    eps_min: float = 0.1
    noise: str = "none"
    sigma1: float = 0.0
    noise_gamma: float | None = None
    loss_reduction: str = "mean"
    participation: float = 1.0
    eval_chunk: int = 4
    eval_by: str = "agent"
    local: LocalSGDConfig = LocalSGDConfig()
    kappa: float = 2.0
    zeta: float = 0.5
    P_start: str = "first"

    def __post_init__(self):
        check_types(self)
        _checks.positive_int("M", self.M)
        _checks.non_negative("lambda1", self.lambda1, f32=True)
        _checks.positive("gamma", self.gamma, f32=True)
        _checks.aggregation_step(self.lambda1, self.gamma)
        _checks.non_negative("alpha", self.alpha, f32=True)
        _checks.one_of("selection", self.selection, tuple(selection.RULES))
        _checks.non_negative("kappa", self.kappa, f32=True)
        _checks.fraction("zeta", self.zeta)
        _checks.one_of("P_start", self.P_start, selection.P_STARTS)
        _checks.unit_interval("eps0", self.eps0)
        _checks.non_negative("eps_decay", self.eps_decay, f32=True)
        _checks.unit_interval("eps_min", self.eps_min)
        if self.selection == "epsilon_greedy":  # the other rules draw no ε
            _checks.epsilon_floor(self.eps0, self.eps_min)
        _checks.one_of("noise", self.noise, ("none", "isotropic", "anisotropic"))
        _checks.non_negative("sigma1", self.sigma1, f32=True)
        if self.noise_gamma is not None:
            _checks.positive("noise_gamma", self.noise_gamma, f32=True)
        _checks.one_of("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)
        _checks.fraction("participation", self.participation)
        _checks.positive_int("eval_chunk", self.eval_chunk)
        _checks.one_of("eval_by", self.eval_by, ("agent", "model"))

    @property
    def step(self) -> float:
        """The aggregation step λ1 γ of eq. (20)."""
        return self.lambda1 * self.gamma

    def rule(self) -> SelectionRule:
        """The selection rule of ``selection`` (a rule of one's own: ``fedcbo(..., rule=)``)."""
        if self.selection == "epsilon_greedy":
            return selection.epsilon_greedy(self.M, self.eps0, self.eps_decay, self.eps_min)
        if self.selection == "prob_sampling":
            return selection.prob_sampling(self.M, self.kappa, self.zeta, self.P_start)
        if self.selection != "uniform":  # a name added to selection.RULES: else the run would draw uniformly
            raise ValueError(f"selection={self.selection!r} is not a built-in rule; pass a rule of your own as "
                             "fedcbo(model, cfg, num_agents, rule=...)")
        return selection.uniform(self.M)


@per_agent_fields("params", "opt_state", "P")
class FedCBOState(NamedTuple):
    params: PyTree  # (N, ...) every agent's model θ_j
    opt_state: PyTree  # (N, ...) kept only when local.reset_optimizer is False
    P: jax.Array  # (N, N) likelihood matrix of eq. (21), row j selects for agent j
    round: jax.Array  # rounds done
    key: jax.Array


@per_agent_fields("active", "idx", "is_random", "train_loss", "fallback", "valid", "diverged")
class FedCBOInfo(NamedTuple):
    """Per round: ``G_n``, the downloads, ε, the local loss, who kept its own model."""

    active: jax.Array  # (N,) agents in G_n
    idx: jax.Array  # (N, M) downloaded agents
    is_random: jax.Array  # (N, M) the downloads picked uniformly at random
    eps: jax.Array  # ε of the round
    train_loss: jax.Array  # (N,) mean mini-batch loss of the last local epoch
    fallback: jax.Array  # (N,) no usable download: the agent kept its own model
    valid: jax.Array | None = None  # (N, M) slots holding a download (ProbSampling, participation < 1; None: all)
    diverged: jax.Array | None = None  # (N,) agents whose model holds a NaN or an infinity (weight 0 in every average)


def fedcbo(model: Model, cfg: FedCBOConfig, num_agents: int, *, downloads: DownloadMap | None = None,
           rule: SelectionRule | None = None) -> Algorithm:
    """Build FedCBO for ``num_agents`` agents training ``model``.

    ``downloads``: how the ``M`` downloads reach each agent (default: gathered from the
    population in memory; on a device mesh,
    :func:`cbo_jax.federated.exchange.exchange_downloads` moves only the requested rows).
    ``rule``: a :class:`~cbo_jax.federated.selection.SelectionRule` of one's own (``cfg.M``
    downloads), tried on the host first (:func:`~cbo_jax.federated.selection.check_rule`);
    the algorithm is then named ``fedcbo-<rule.name>``.
    """
    n = _checks.positive_int("num_agents", num_agents)
    _checks.downloads(cfg.M, n)
    own, user_rule = rule is not None, rule
    rule = selection.check_rule(rule, cfg.M, n, n, "fedcbo", cfg.participation < 1) if own else cfg.rule()
    name = f"fedcbo-{rule.name}" if own else "fedcbo"
    energy = group_loss(model, cfg) if cfg.eval_by == "model" else loss_energy(model, cfg)
    if cfg.eval_by == "model" and downloads is not None:
        raise ValueError("eval_by='model' reads the models in place, so it takes no `downloads` map; "
                         "a sharded run (--shard / mesh) needs eval_by='agent'")

    def init(key: jax.Array) -> FedCBOState:
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return FedCBOState(params, jax.vmap(make_optimizer(cfg.local).init)(params), rule.init(n, n),
                           jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedCBOState, data: AgentData) -> tuple[FedCBOState, FedCBOInfo]:
        key, k_part, k_local, k_sel, k_noise = jax.random.split(state.key, 5)
        active = participants(k_part, data.agent_mask, cfg.participation)
        trained = local_train(model, cfg.local, state.params, state.opt_state, data, k_local)
        params = tree_where_rows(active, trained.params, state.params)
        opt_state = tree_where_rows(active, trained.opt_state, state.opt_state)
        if cfg.participation < 1:  # downloads from G_n only (the candidate columns are the N real agents)
            sel = rule.select(k_sel, state.P, state.round, active[:state.P.shape[1]])
            mask = jnp.broadcast_to(active[:, None], sel.idx.shape)  # a non-participant downloads nothing
            valid: jax.Array | None = mask if sel.valid is None else mask & sel.valid
        else:  # every (valid) agent participates; all valid: the paper's unmasked draw (selection._random_order)
            cand = None if data.valid is None else data.agent_mask[:state.P.shape[1]]
            sel = rule.select(k_sel, state.P, state.round, cand)
            valid = sel.valid
        if cfg.eval_by == "model":
            agg = consensus_by_model(energy, params, sel.idx, (data.x, data.y, data.counts),
                                     alpha=cfg.alpha, group=cfg.eval_chunk, valid=valid)
        else:
            agg = consensus_downloads(energy, params, sel.idx, params, (data.x, data.y, data.counts), alpha=cfg.alpha,
                                      chunk=cfg.eval_chunk, downloads=downloads, valid=valid)
        diff = pop.tree_sub(params, agg.consensus)
        new = jax.tree_util.tree_map(lambda t, d: t - cfg.step * d, params, diff)
        if cfg.noise != "none" and (_checks.swept(cfg.sigma1) or cfg.sigma1 > 0):  # a swept σ1 of 0: no noise
            z = per_particle_normal(k_noise, diff, jnp.arange(data.counts.shape[0]))
            scale = cfg.sigma1 * jnp.sqrt(cfg.gamma if cfg.noise_gamma is None else cfg.noise_gamma)
            new = jax.tree_util.tree_map(lambda t, dz: t + scale * dz, new, diffusion(cfg.noise, diff, z))
        params = tree_where_rows(active, new, params)
        P = rule.update(state.P, sel.idx, agg.loss, agg.own_loss, active, valid)
        info = FedCBOInfo(active, sel.idx, sel.is_random, sel.eps, trained.loss, agg.fallback & active, valid,
                          diverged(params, data.agent_mask))
        return FedCBOState(params, opt_state, P, state.round + 1, key), info

    return Algorithm(name, init, round_fn, lambda s: ("agent", s.params), cfg, model=model,
                     build=lambda c: fedcbo(model, c, n, downloads=downloads, rule=user_rule))
