"""FedCBO: consensus-based optimization for clustered federated learning.

Algorithm 1 of Carrillo, García Trillos, Li and Zhu (REFERENCE_NOTES §1.2), the
splitting scheme eq. (18) of the particle system eq. (4). Per round ``n``:

1. ``G_n``: the participating agents (all of them in the paper).
2. LocalUpdate: τ epochs of mini-batch SGD (step ``λ2 γ``) on each agent's data.
3. LocalAggregation, for every ``j`` in ``G_n`` synchronously (from the old models):

   a. ``A_n``: ``M`` other agents by ε-greedy sampling on ``P^j`` (Remark 3);
   b. ``L_j^i``: loss of each downloaded ``θ_i`` on ``j``'s own training data;
   c. ``m_j = Σ_i θ_i μ_i / Σ_i μ_i``, ``μ_i = exp(-α L_j^i)``              (19)
   d. ``θ_j ← θ_j - λ1 γ (θ_j - m_j)`` [+ Appendix E noise
      ``σ1 √γ |θ_j - m_j| z`` (isotropic) or ``σ1 √γ (θ_j - m_j) ∘ z`` (anisotropic),
      ``z`` drawn from agent ``j``'s own stream ``fold_in(key, j)``]                (20)
   e. ``P^{j,i} ← P^{j,i} + (L_j^j - L_j^i)`` for ``i ∈ A_n``                 (21)

The weights of (19) are computed in log space (:mod:`cbo_jax.consensus`): identical to
the reference code's ``exp(-α L)`` whenever that does not underflow, and finite when
it does. A downloaded model with non-finite parameters or loss gets weight zero.

The losses of the ``N × M`` downloaded models are evaluated in chunks of
``eval_chunk`` agents (``lax.map``), each chunk gathering its ``(chunk, M)`` models
once and reusing them for the losses and for ``m_j``. XLA's temporary memory is a few
times ``eval_chunk · M · P`` floats for ``P`` parameters per model. Measured at the
paper's scale (N = 1200, M = 200): peak RSS 6.9 GB with ``eval_chunk = 4`` (the
default, also the fastest on CPU) and 11.7 GB with 16 (benchmarks/RESULTS_fedcbo.md).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_weights
from cbo_jax.federated import selection
from cbo_jax.federated.algorithms.base import Algorithm, AgentData, RoundInfo, participants, tree_where_rows
from cbo_jax.federated.local import LocalSGDConfig, agent_loss, local_train, make_optimizer
from cbo_jax.federated.padding import agents_in, padding_downloads, resize_rows
from cbo_jax.models import Model, init_population
from cbo_jax.sde import diffusion, per_particle_normal

PyTree = Any

__all__ = ["FedCBOConfig", "FedCBOState", "fedcbo", "aggregate", "aggregate_sharded", "planned_round_bytes",
           "eval_chunk_for_budget"]

LOSS_REDUCTIONS = ("mean", "sum_of_batch_means")


@dataclasses.dataclass(frozen=True)
class FedCBOConfig:
    """FedCBO parameters (defaults: REFERENCE_NOTES §1.3 and the reference script).

    Attributes:
      M: downloads per agent per round (``1 <= M <= N - 1``).
      lambda1, gamma: the aggregation step is ``λ1 γ``; ``γ`` is also the time step of
        the Appendix E noise ``σ1 √γ ...``. Defaults: ``γ = 0.1`` as in the paper's
        splitting (local learning rate ``λ2 γ = 0.1`` with ``λ2 = 1``) and
        ``λ1 = 9.8``, so that ``λ1 γ = 0.98`` as in the reference script.
      alpha: α of the weights μ = exp(-α L), eq. (19).
      selection: ``"epsilon_greedy"`` (Remark 3), ``"uniform"``, or ``"prob_sampling"``
        (FedCB²O's ProbSampling: never-observed agents first, then ``∝ P``, with
        ``P ← (1-ζ) P + ζ exp(-κ L)`` replacing eq. (21); the FedCBO baseline of the
        FedCB²O paper).
      kappa, zeta: κ and ζ of ProbSampling (unused otherwise).
      eps0, eps_decay, eps_min: ε(n) = max(eps0 - eps_decay·n, eps_min).
      noise: Appendix E aggregation noise, ``"none"``, ``"isotropic"`` or ``"anisotropic"``.
      sigma1: its strength σ1.
      loss_reduction: ``"mean"`` (paper) or ``"sum_of_batch_means"`` (reference code)
        for the losses in (19) and (21).
      participation: share of agents in ``G_n`` each round (1 = all, as the paper).
      eval_chunk: agents per chunk when evaluating downloaded models.
      local: the local SGD configuration.
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
    loss_reduction: str = "mean"
    participation: float = 1.0
    eval_chunk: int = 4
    local: LocalSGDConfig = LocalSGDConfig()
    kappa: float = 2.0
    zeta: float = 0.5

    def __post_init__(self):
        _checks.positive_int("M", self.M)
        _checks.non_negative("lambda1", self.lambda1)
        _checks.positive("gamma", self.gamma)
        _checks.non_negative("alpha", self.alpha)
        _checks.one_of("selection", self.selection, ("epsilon_greedy", "uniform", "prob_sampling"))
        _checks.non_negative("kappa", self.kappa)
        _checks.fraction("zeta", self.zeta)
        for name in ("eps0", "eps_decay", "eps_min"):
            _checks.non_negative(name, getattr(self, name))
        _checks.one_of("noise", self.noise, ("none", "isotropic", "anisotropic"))
        _checks.non_negative("sigma1", self.sigma1)
        _checks.one_of("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)
        _checks.fraction("participation", self.participation)
        _checks.positive_int("eval_chunk", self.eval_chunk)

    @property
    def step(self) -> float:
        """The aggregation step λ1 γ of eq. (20)."""
        return self.lambda1 * self.gamma


class FedCBOState(NamedTuple):
    params: PyTree  # (N, ...) every agent's model θ_j
    opt_state: PyTree  # (N, ...) kept only when local.reset_optimizer is False
    P: jax.Array  # (N, N) likelihood matrix of eq. (21)
    round: jax.Array  # rounds done
    key: jax.Array


def aggregate(model: Model, cfg: FedCBOConfig, params: PyTree, idx: jax.Array, data: AgentData):
    """Eq. (19) for every agent: losses of the downloads and the consensus points.

    Returns ``(loss (N, M), own_loss (N,), m)`` with ``m`` a stacked population (the
    consensus point of every agent), all computed from ``params`` (synchronous).
    """
    b = cfg.local.batch_size

    def loss_of(p, x, y, c):
        return agent_loss(model, p, x, y, c, batch_size=b, reduction=cfg.loss_reduction)

    # Non-finite models are found and zeroed once per round, not once per download.
    clean_all, finite_all = pop.zero_nonfinite_rows(params)

    def one_agent(args):
        idx_j, x_j, y_j, c_j, theta_j = args
        clean = pop.gather(clean_all, idx_j)  # (M, ...)
        finite = jnp.take(finite_all, idx_j)
        loss = jax.vmap(lambda p: loss_of(p, x_j, y_j, c_j))(clean)
        loss = jnp.where(finite, loss, jnp.inf)
        w = consensus_weights(loss, cfg.alpha)
        m_j = pop.weighted_mean(clean, w)
        return loss, loss_of(theta_j, x_j, y_j, c_j), m_j

    return jax.lax.map(one_agent, (idx, data.x, data.y, data.counts, params), batch_size=cfg.eval_chunk)


def _largest_divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, min(n, k) + 1) if n % d == 0)


def aggregate_sharded(model: Model, cfg: FedCBOConfig, params: PyTree, idx: jax.Array, data: AgentData, *,
                      mesh, capacity: int | None = None):
    """:func:`aggregate` with the agent axis split over ``mesh`` (``N`` a multiple of its size).

    Each device evaluates the downloads of its own agents. The downloaded models are
    fetched with :func:`cbo_jax.federated.exchange.fetch_rows`: ``eval_chunk`` agents
    at a time, only the requested rows travel, in buffers of ``capacity`` rows per
    device pair (default: twice the even share). No device ever holds more than its
    own shard plus one chunk's downloads. Same results as :func:`aggregate`.
    """
    from jax.sharding import PartitionSpec

    from cbo_jax.federated.exchange import default_capacity, fetch_rows
    from cbo_jax.sharding import AGENT_AXIS

    d = mesh.size
    n = idx.shape[0]
    if n % d:
        raise ValueError(f"N={n} agents cannot be split evenly over {d} devices")
    n_loc = n // d
    chunk = _largest_divisor_at_most(n_loc, cfg.eval_chunk)
    cap = capacity or default_capacity(chunk * cfg.M, d)
    b = cfg.local.batch_size

    def loss_of(p, x, y, c):
        return agent_loss(model, p, x, y, c, batch_size=b, reduction=cfg.loss_reduction)

    def local(params_l, idx_l, x_l, y_l, c_l):
        table = pop.zero_nonfinite_rows(params_l)  # (clean rows, finite flags), once per round

        def one_agent(clean, finite, x_j, y_j, c_j, theta_j):
            loss = jax.vmap(lambda p: loss_of(p, x_j, y_j, c_j))(clean)
            loss = jnp.where(finite, loss, jnp.inf)
            w = consensus_weights(loss, cfg.alpha)
            return loss, loss_of(theta_j, x_j, y_j, c_j), pop.weighted_mean(clean, w)

        def one_chunk(args):
            idx_c, x_c, y_c, c_c, theta_c = args
            clean, finite = fetch_rows(table, idx_c, axis_name=AGENT_AXIS, num_devices=d, capacity=cap)
            return jax.vmap(one_agent)(clean, finite, x_c, y_c, c_c, theta_c)

        split = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((n_loc // chunk, chunk) + a.shape[1:]), t)  # noqa: E731
        out = jax.lax.map(one_chunk, split((idx_l, x_l, y_l, c_l, params_l)))
        return jax.tree_util.tree_map(lambda a: a.reshape((n_loc,) + a.shape[2:]), out)

    spec = PartitionSpec(AGENT_AXIS)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 5, out_specs=(spec, spec, spec), check_vma=False)(
        params, idx, data.x, data.y, data.counts)


def fedcbo(model: Model, cfg: FedCBOConfig, num_agents: int, *, mesh=None) -> Algorithm:
    """Build FedCBO for ``num_agents`` agents training ``model``.

    ``mesh``: a :func:`cbo_jax.sharding.agent_mesh` when the run is sharded
    (``run_federated(..., mesh=mesh)``): the downloads are then exchanged between
    devices by :func:`aggregate_sharded` instead of being gathered. ``N`` need not be
    a multiple of the device count: ``run_federated`` appends inactive padding agents
    (:mod:`cbo_jax.federated.padding`), which select among, and are selected by, no one.
    The real agents' selection, noise and local-training keys are drawn for ``N``
    agents, as in the unsharded run.
    """
    n = _checks.positive_int("num_agents", num_agents)
    if cfg.M > n - 1:
        raise ValueError(f"M (downloads per agent) must satisfy 1 <= M <= N - 1 = {n - 1}, got M={cfg.M}")
    agg = aggregate if mesh is None else functools.partial(aggregate_sharded, mesh=mesh)

    def init(key: jax.Array) -> FedCBOState:
        k_model, k_state = jax.random.split(key)
        params = init_population(model, k_model, n)
        return FedCBOState(
            params=params,
            opt_state=jax.vmap(make_optimizer(cfg.local).init)(params),
            P=selection.init_prob_likelihood(n) if cfg.selection == "prob_sampling" else selection.init_likelihood(n),
            round=jnp.zeros((), jnp.int32),
            key=k_state,
        )

    def round_fn(state: FedCBOState, data: AgentData):
        # With padding agents (sharded runs: size > n) P is (size, n): padding rows are
        # never read, and only the n real columns can be selected.
        size = agents_in(data, n)
        key, k_part, k_local, k_sel, k_noise = jax.random.split(state.key, 5)
        active = resize_rows(participants(k_part, n, cfg.participation), size)  # padding never takes part
        trained = local_train(model, cfg.local, state.params, state.opt_state, data.x, data.y, data.counts, k_local,
                              num_real=n)
        params = tree_where_rows(active, trained.params, state.params)
        opt_state = tree_where_rows(active, trained.opt_state, state.opt_state)
        P_real = state.P if size == n else state.P[:n]
        if cfg.selection == "epsilon_greedy":
            eps = selection.epsilon_schedule(state.round, cfg.eps0, cfg.eps_decay, cfg.eps_min)
            idx, is_random = selection.epsilon_greedy(k_sel, P_real, cfg.M, eps)
        elif cfg.selection == "prob_sampling":
            eps = jnp.zeros(())
            idx = selection.prob_sampling(k_sel, P_real, cfg.M)
            is_random = jnp.take_along_axis(jnp.isnan(P_real), idx, axis=1)  # exploration picks
        else:
            eps = jnp.ones(())
            idx = selection.uniform(k_sel, n, cfg.M)
            is_random = jnp.ones(idx.shape, bool)
        if size != n:  # padding agents download real ones (results discarded: they are inactive)
            idx = jnp.concatenate([idx, padding_downloads(n, size, cfg.M)], axis=0)
            is_random = resize_rows(is_random, size)
        loss, own_loss, m = agg(model, cfg, params, idx, data)
        diff = pop.tree_sub(params, m)
        new = jax.tree_util.tree_map(lambda t, d: t - cfg.step * d, params, diff)
        if cfg.noise != "none" and cfg.sigma1 > 0:
            z = per_particle_normal(k_noise, diff, jnp.arange(size))  # agent j's own stream: fold_in(k, j)
            scale = cfg.sigma1 * jnp.sqrt(cfg.gamma)
            new = jax.tree_util.tree_map(lambda t, dz: t + scale * dz, new, diffusion(cfg.noise, diff, z))
        params = tree_where_rows(active, new, params)
        if cfg.selection == "prob_sampling":
            P = selection.update_prob_likelihood(state.P, idx, loss, cfg.kappa, cfg.zeta, active)
        else:
            P = selection.update_likelihood(state.P, idx, own_loss, loss, active)
        info = RoundInfo(
            active=active,
            idx=idx,
            is_random=is_random,
            eps=jnp.asarray(eps, jnp.float32),
            train_loss=trained.loss,
            assignment=jnp.zeros((size,), jnp.int32),
        )
        return FedCBOState(params, opt_state, P, state.round + 1, key), info

    def resize(state: FedCBOState, size: int) -> FedCBOState:
        # Rows only: P keeps its n columns (the selectable agents).
        return state._replace(params=resize_rows(state.params, size), opt_state=resize_rows(state.opt_state, size),
                              P=resize_rows(state.P, size))

    return Algorithm(name="fedcbo", init=init, round=round_fn, eval_models=lambda s: ("agent", s.params), config=cfg,
                     resize=resize)


def planned_round_bytes(algorithm: Algorithm, data: AgentData, key: jax.Array | None = None, *,
                        size: int | None = None) -> int:
    """Bytes XLA plans for one round: arguments + outputs + temporaries - aliased.

    Compiles the round on abstract shapes (nothing is allocated). Measured at the
    paper's scale, this plan plus the Python process's own baseline (about 0.5 GB)
    was within 0.3–0.5 GB of the peak RSS of a real round (benchmarks/RESULTS_fedcbo.md).
    ``size``: plan the round padded to this many agents (a sharded run's
    ``padded_size(N, mesh)``).
    """
    key = jax.random.key(0) if key is None else key
    n = int(data.counts.shape[0])
    size = n if size is None else size
    if size == n:
        state = jax.eval_shape(algorithm.init, key)
    else:
        state = jax.eval_shape(lambda k: algorithm.resize(algorithm.init(k), size), key)
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((size,) + a.shape[1:], a.dtype), data)
    ma = jax.jit(algorithm.round).lower(state, shapes).compile().memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes)


def eval_chunk_for_budget(model: Model, cfg: FedCBOConfig, data: AgentData, budget_bytes: float, *,
                          candidates=(64, 32, 16, 8, 4, 2, 1), mesh=None) -> tuple[int, dict]:
    """The largest ``eval_chunk`` whose planned round memory fits ``budget_bytes``.

    Larger chunks evaluate more downloads at once (faster on accelerators) and need
    more memory: a few times ``eval_chunk · M · P`` floats for ``P`` parameters per
    model. Tries ``candidates`` from the largest down, compiling one round each on
    abstract shapes (:func:`planned_round_bytes`). Returns ``(eval_chunk, plan)``
    with ``plan`` mapping each tried chunk to its planned bytes. Raises
    ``ValueError`` when even the smallest candidate does not fit.
    """
    if not budget_bytes > 0:
        raise ValueError(f"memory budget must be > 0 bytes, got {budget_bytes}")
    n = int(data.counts.shape[0])
    size = n
    if mesh is not None:
        from cbo_jax.sharding import padded_size

        size = padded_size(n, mesh)
    plan: dict[int, int] = {}
    for chunk in sorted(set(int(c) for c in candidates), reverse=True):
        if chunk < 1:
            continue
        alg = fedcbo(model, dataclasses.replace(cfg, eval_chunk=chunk), n, mesh=mesh)
        plan[chunk] = planned_round_bytes(alg, data, size=size)
        if plan[chunk] <= budget_bytes:
            return chunk, plan
    smallest = min(plan)
    raise ValueError(f"a FedCBO round needs {plan[smallest] / 2**30:.2f} GiB even with eval_chunk={smallest}; "
                     f"the budget is {budget_bytes / 2**30:.2f} GiB")
