"""The consensus step over downloaded models, shared by FedCBO and FedCB²O.

For every selecting agent ``j`` with downloads ``A_j = idx[j]``:

    m_j = Σ_{i ∈ A_j} θ_i μ_i [+ θ_j μ_j] / Σ μ,   μ_i = exp(-α E_j^i),

FedCBO eq. (19) with the energy ``E_j^i = L_j(θ_i)``, the loss of the download on
``j``'s data, and FedCB²O eq. (3.13) (Algorithm 2: over the downloads) with ``E_j^i = G^i``,
the robustness criterion (3.15). ``include_self`` adds the agent's own model with its
own energy (the FedCB²O reference code's variant). The energy is a function passed in,
so the kernel knows nothing of losses, classes or attacks.

Weights are normalised in log space (:func:`cbo_jax.consensus.consensus_weights`): the
exact Gibbs weights, finite for any α. A download whose parameters or energy are not
finite gets weight exactly zero (its row is zeroed before the contraction). When no
download of an agent is usable, the agent keeps its own model (``fallback``), so a
broken or hostile model never turns a finite model into NaN.

How the downloads reach the agent is pluggable (``downloads``): :func:`local_downloads`
gathers them from the population in memory; a sharded run can pass
:func:`cbo_jax.federated.exchange.exchange_downloads`, which moves only the requested
rows between devices. Either evaluates ``chunk`` agents at a time, so memory stays a
few times ``chunk · M · P`` floats for ``P`` parameters per model.

With the in-memory gather the step runs in two passes over the agents: the first
evaluates the energies and weights, the second gathers the downloads again and contracts
them with the weights. Re-reading ``M · P`` floats per agent is cheap next to the forward
passes, and it lets XLA lay the first gather out for the energy's matrix products alone
(one copy, no separate transpose), which makes the whole step 1.19–1.21x faster at FedCBO's
benchmark setting (``benchmarks/RESULTS_fedcbo.md``, section 0a). Both passes compute every number
exactly as the single fused pass does (a test checks bitwise equality). A download map
that moves data between devices is called once (fused), so rows travel once.

:func:`consensus_by_model` computes the same step (without ``include_self``) the other way
round, for energies that are one model's loss on one agent's data: every model is read in
place and evaluated on the stacked data of the agents that downloaded it, and the
consensus points are one dense product. Equal up to float rounding; faster on a CPU
(``benchmarks/RESULTS_fedcbo.md``, section 0b); FedCBO's ``eval_by="model"``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_weights
from cbo_jax.federated.local import agent_loss, reduce_sample_losses

PyTree = Any

__all__ = ["Downloads", "Energy", "consensus_downloads", "consensus_by_model", "local_downloads", "DownloadMap",
           "group_sizes", "pair_schedule", "loss_energy", "group_loss"]


class Energy(NamedTuple):
    """What an energy function returns for one agent and its ``M`` downloads.

    Attributes:
      energy: ``(M,)`` the downloads' energies ``E_j^i`` (the consensus weights' exponent).
      loss: ``(M,)`` the downloads' mean losses on the agent's data (for the selection update).
      own_energy: ``()`` the agent's own energy (used with ``include_self``).
      own_loss: ``()`` the agent's own mean loss.
    """

    energy: jax.Array
    loss: jax.Array
    own_energy: jax.Array
    own_loss: jax.Array


class Downloads(NamedTuple):
    """The consensus step of every selecting agent.

    Attributes:
      loss: ``(R, M)`` downloads' losses (``inf`` for non-finite models).
      own_loss: ``(R,)``.
      weights: ``(R, M)`` normalised consensus weights of the downloads.
      self_weight: ``(R,)`` weight of the agent's own model.
      fallback: ``(R,)`` no download was usable: the agent kept its own model.
      consensus: the consensus points ``m_j``, a population of ``R`` models.
    """

    loss: jax.Array
    own_loss: jax.Array
    weights: jax.Array
    self_weight: jax.Array
    fallback: jax.Array
    consensus: PyTree


# ``downloads(fn, params, idx, per_agent, chunk)``: for every row j of idx, call
# ``fn(rows, finite, *per_agent_j)`` with the downloaded models ``params[idx[j]]``
# (non-finite ones zeroed) and their finite flags, ``chunk`` rows at a time. A map with
# the attribute ``cheap_refetch = True`` may be called twice per step (see the module
# docstring); any other map is called once.
DownloadMap = Callable[..., Any]


def local_downloads(fn: Callable, params: PyTree, idx: jax.Array, per_agent: tuple, chunk: int) -> Any:
    """Gather the downloads from the population in memory (``lax.map`` over chunks)."""
    clean_all, finite_all = pop.zero_nonfinite_rows(params)  # once per round, not once per download

    def one(args):
        idx_j, *rest = args
        return fn(pop.gather(clean_all, idx_j), jnp.take(finite_all, idx_j), *rest)

    return jax.lax.map(one, (idx, *per_agent), batch_size=chunk)


local_downloads.cheap_refetch = True  # type: ignore[attr-defined]  # memory reads only: two passes pay off


def _weigh(e: Energy, finite: jax.Array, alpha, include_self: bool, self_largest) -> Downloads:
    """Weights of one agent's downloads from their energies (eq. (19)'s μ_i / Σ μ); a
    download that is not ``finite`` (or an empty slot) weighs nothing, loss ``inf``."""
    energy = jnp.where(finite, e.energy, jnp.inf)
    loss = jnp.where(finite, e.loss, jnp.inf)
    if include_self:
        e_self = jnp.where(self_largest, jnp.minimum(jnp.min(energy), e.own_energy), e.own_energy)
        w_all = consensus_weights(jnp.concatenate([energy, e_self[None]]), alpha)
        w, w_self = w_all[:-1], w_all[-1]
    else:
        w, w_self = consensus_weights(energy, alpha), jnp.zeros((), energy.dtype)
    usable = jnp.all(jnp.isfinite(w)) & (jnp.sum(w) + w_self > 0)
    w = jnp.where(usable, w, 0.0)
    w_self = jnp.where(usable, w_self, 1.0)  # nothing usable: keep the own model
    return Downloads(loss, e.own_loss, w, w_self, ~usable, None)


def _own_term(w_self: jax.Array, theta: jax.Array) -> jax.Array:
    """``w_self θ`` with the non-finite entries of the own model ``θ`` zeroed (``w_self``
    broadcast over ``θ``'s trailing axes)."""
    w = jnp.reshape(w_self, jnp.shape(w_self) + (1,) * (theta.ndim - jnp.ndim(w_self))).astype(theta.dtype)
    return w * jnp.where(jnp.isfinite(theta), theta, 0.0)


def consensus_downloads(energy_fn: Callable[..., Energy], params: PyTree, idx: jax.Array, own: PyTree, data: tuple,
                        *, alpha: float | jax.Array, include_self: bool = False, chunk: int = 4,
                        downloads: DownloadMap | None = None, valid: jax.Array | None = None,
                        self_largest: bool | jax.Array = False) -> Downloads:
    """Consensus points of the agents owning the rows of ``idx`` (module docstring).

    Args:
      energy_fn: ``energy_fn(models, own_model, *data_j) -> Energy`` for one agent and
        its ``M`` downloaded models (a population).
      params: the whole population the downloads come from.
      idx: ``(R, M)`` downloads of ``R`` selecting agents.
      own: the ``R`` selecting agents' own models.
      data: a tuple of per-agent arrays ``(R, ...)`` passed on to ``energy_fn``.
      alpha: α of the weights.
      include_self: average the agent's own model too, with its ``own_energy``.
      chunk: agents evaluated at once.
      downloads: how the downloads are fetched (default :func:`local_downloads`).
      valid: ``(R, M)`` which slots hold a download (``None``: all); an empty slot weighs
        nothing and its loss is ``inf``.
      self_largest: with ``include_self`` (may be traced): the own model's energy is at most
        the lowest of the downloads', so it gets the largest weight (the FedCB²O reference
        code's form after T_G); otherwise it is the energy function's ``own_energy``.
    """

    def weigh(down, finite, theta_j, *data_j):
        """Energies and weights of one agent's downloads: eq. (19)'s μ_i / Σ μ."""
        *data_j, ok = data_j
        e = energy_fn(down, theta_j, *data_j)
        return _weigh(e, finite & ok, alpha, include_self, self_largest)

    def contract(down, w, w_self, theta_j):
        """The consensus point m_j = Σ_i w_i θ_i + w_self θ_j (non-finite rows are zero);
        low-precision rows (bfloat16, float16) are summed in float32 and rounded once."""
        def leaf(d, t):
            acc = pop._accumulation_dtype(d.dtype)
            if acc == d.dtype:
                return jnp.tensordot(w.astype(d.dtype), d, axes=(0, 0)) + _own_term(w_self, t)
            m = jnp.tensordot(w.astype(acc), d.astype(acc), axes=(0, 0)) + _own_term(w_self, t.astype(acc))
            return m.astype(d.dtype)

        return jax.tree_util.tree_map(leaf, down, theta_j)

    def one_agent(down, finite, theta_j, *data_j):
        res = weigh(down, finite, theta_j, *data_j)
        return res._replace(consensus=contract(down, res.weights, res.self_weight, theta_j))

    fetch = local_downloads if downloads is None else downloads
    ok = jnp.ones(idx.shape, bool) if valid is None else valid
    if not getattr(fetch, "cheap_refetch", False):
        return fetch(one_agent, params, idx, (own, *data, ok), chunk)
    res = fetch(weigh, params, idx, (own, *data, ok), chunk)
    m = fetch(lambda down, _finite, w, w_self, theta_j: contract(down, w, w_self, theta_j), params, idx,
              (res.weights, res.self_weight, own), chunk)
    return res._replace(consensus=m)


def group_sizes(group: int) -> tuple[int, ...]:
    """The ladder of group sizes :func:`consensus_by_model` uses for ``group``: ``group``,
    then every fourth of it down to 1 (4 → (4, 1), 16 → (16, 4, 1), 8 → (8, 2, 1))."""
    sizes = [_checks.positive_int("group", group)]  # group=0 would fail later, in a message about sizes
    while sizes[-1] >= 4:
        sizes.append(sizes[-1] // 4)
    if sizes[-1] != 1:
        sizes.append(1)
    return tuple(sizes)


def pair_schedule(models: jax.Array, valid: jax.Array, num_models: int,
                  sizes: int | tuple[int, ...]) -> tuple[tuple[jax.Array, jax.Array, jax.Array], ...]:
    """Sort ``Q`` (agent, model) pairs into groups of pairs that share a model.

    Args:
      models: ``(Q,)`` the model (a row of the population) of every pair.
      valid: ``(Q,)`` which pairs are evaluated at all.
      num_models: rows in the population.
      sizes: group sizes, largest first (an int: one size). A model with ``d`` pairs fills
        ``d // s_0`` groups of ``s_0`` pairs, then ``(d mod s_0) // s_1`` of ``s_1``, and so
        on; the last size takes the rest, its last group possibly part-empty (never with
        a last size of 1). Large groups make long matrix products, the small ones leave no
        slot empty.

    Returns one ``(table, group_model, num_groups)`` per size: ``table`` is
    ``(G_max, s)`` pair indices (``Q`` marks an empty slot), ``group_model`` the
    ``(G_max,)`` model of every group, and ``num_groups`` (traced) how many leading rows
    are used; ``G_max`` is a static bound.
    """
    sizes = (int(sizes),) if isinstance(sizes, int) else tuple(int(v) for v in sizes)
    if not sizes or any(v < 1 for v in sizes) or list(sizes) != sorted(set(sizes), reverse=True):
        raise ValueError(f"sizes must be distinct positive integers, largest first; got {sizes}")
    q = models.shape[0]
    key = jnp.where(valid, models, num_models).astype(jnp.int32)
    order = jnp.argsort(key, stable=True).astype(jnp.int32)
    sorted_key = key[order]
    per_model = jnp.bincount(key, length=num_models + 1)[:num_models]
    m = jnp.minimum(sorted_key, num_models - 1)
    real = sorted_key < num_models
    rank = jnp.arange(q, dtype=jnp.int32) - (jnp.cumsum(per_model) - per_model)[m]  # position within the model
    left, first, out = per_model, jnp.zeros_like(per_model), []
    for level, s_ in enumerate(sizes):
        last = level == len(sizes) - 1
        groups = (left + s_ - 1) // s_ if last else left // s_
        taken = jnp.minimum(groups * s_, left)
        if level == 0:
            g_max = -(-q // s_) + (num_models if last else 0)
        else:
            g_max = num_models * (-(-(sizes[level - 1] - 1) // s_))
        g_max = max(1, min(g_max, -(-q // s_) + num_models))
        r = rank - first[m]
        here = real & (r >= 0) & (r < taken[m])
        group_start = jnp.cumsum(groups) - groups
        gid = jnp.where(here, group_start[m] + r // s_, g_max)  # other levels' pairs: dropped
        table = jnp.full((g_max, s_), q, jnp.int32).at[gid, r % s_].set(order, mode="drop")
        group_model = jnp.zeros((g_max,), jnp.int32).at[gid].set(m, mode="drop")
        out.append((table, group_model, jnp.sum(groups)))
        first, left = first + taken, left - taken
    return tuple(out)


def consensus_by_model(group_energy: Callable[..., jax.Array], params: PyTree, idx: jax.Array, data: tuple, *,
                       alpha: float | jax.Array, group: int = 4, valid: jax.Array | None = None,
                       own_rows: jax.Array | None = None, unroll: int = 4) -> Downloads:
    """The consensus step of :func:`consensus_downloads` (without ``include_self``),
    evaluated model by model instead of agent by agent.

    For energies that are one model's loss on one agent's data (FedCBO's ``E_j^i =
    L_j(θ_i)``, eq. (19)), the ``R·M`` (agent, download) pairs and the ``R`` own models
    are sorted by model (:func:`pair_schedule`). Each model is then read in place and
    evaluated on the stacked data of up to ``group`` agents that downloaded it, one
    forward pass of ``group·n`` rows: no agent's ``M·P`` downloads are gathered, and the
    model's matrix products are tall. The consensus points ``m_j = Σ_i w_ji θ_i`` are one
    ``(R, N) @ (N, P)`` product with the weights scattered to the downloads' columns.

    Results equal :func:`consensus_downloads` with the same energy up to float rounding
    (the products are blocked differently; a test bounds the difference).

    Args:
      group_energy: ``group_energy(model, *data_g) -> (group,)``: the energy of one model
        (a single row of ``params``) on ``group`` agents' data (``data_g``: the arrays of
        ``data`` at those agents, leading axis ``group``).
      params: the population, ``N`` rows.
      idx: ``(R, M)`` downloads of ``R`` selecting agents.
      data: per-agent arrays ``(R, ...)``.
      alpha: α of the weights.
      group: the largest number of agents' data sets in one forward pass; a model's
        pairs are grouped by the sizes :func:`group_sizes` gives (``group``, a fourth of it,
        ..., 1), so no forward pass holds padding.
      valid: ``(R, M)`` which slots hold a download (``None``: all).
      own_rows: ``(R,)`` the row of ``params`` that is agent ``j``'s own model (``None``:
        row ``j``, so ``R = N``).
      unroll: groups evaluated per loop iteration. Their forward passes are independent, so
        XLA:CPU runs one group's small kernels (bias, ReLU, the narrow last layer, the loss)
        beside another's matrix product; ``benchmarks/RESULTS_fedcbo.md`` (section 0c)
        measures the gain. The last iteration may evaluate up to ``unroll - 1`` empty groups.
    """
    unroll = _checks.positive_int("unroll", unroll)
    r, m_dl = idx.shape
    n = jax.tree_util.tree_leaves(params)[0].shape[0]
    own_rows = jnp.arange(r, dtype=jnp.int32) if own_rows is None else own_rows
    ok = jnp.ones(idx.shape, bool) if valid is None else valid
    clean, finite = pop.zero_nonfinite_rows(params)

    pair_model = jnp.concatenate([idx.reshape(-1), own_rows]).astype(jnp.int32)
    pair_agent = jnp.concatenate([jnp.repeat(jnp.arange(r, dtype=jnp.int32), m_dl), jnp.arange(r, dtype=jnp.int32)])
    pair_ok = jnp.concatenate([ok.reshape(-1), jnp.ones((r,), bool)])
    q = pair_model.shape[0]
    levels = pair_schedule(pair_model, pair_ok, n, group_sizes(group))

    def data_of(members):
        agents = pair_agent[jnp.minimum(members, q - 1)]  # empty slots: any agent, result dropped
        return tuple(jnp.take(a, agents, axis=0) for a in data)

    out = jax.eval_shape(lambda: group_energy(pop.gather(clean, 0), *data_of(levels[-1][0][0])))
    energies = jnp.full((q,), jnp.inf, out.dtype)
    for table, group_model, num_groups in levels:  # one loop per group size (static shapes)
        def body(it, e, table=table, group_model=group_model, num_groups=num_groups):
            for u in range(unroll):  # independent forward passes: XLA:CPU overlaps their kernels
                gi = it * unroll + u
                row = jnp.minimum(gi, table.shape[0] - 1)
                members = jnp.where(gi < num_groups, table[row], q)  # past the last group: dropped
                e = e.at[members].set(group_energy(pop.gather(clean, group_model[row]), *data_of(members)),
                                      mode="drop")
            return e

        energies = jax.lax.fori_loop(0, (num_groups + unroll - 1) // unroll, body, energies)
    loss = energies[: r * m_dl].reshape(r, m_dl)
    own_loss = jnp.where(finite[own_rows], energies[r * m_dl:], jnp.nan)  # as a non-finite model's own loss
    res = jax.vmap(lambda e, o, f: _weigh(Energy(e, e, o, o), f, alpha, False, False))(
        loss, own_loss, finite[idx] & ok)
    dense = jnp.zeros((r, n), res.weights.dtype).at[jnp.arange(r)[:, None], idx].add(res.weights)
    m = jax.tree_util.tree_map(lambda c, t: c + _own_term(res.self_weight, t),
                               pop.weighted_mean(clean, dense), pop.gather(params, own_rows))
    return res._replace(consensus=m)


# --------------------------------------------------------------------------- FedCBO's energies


def loss_energy(model, cfg):
    """FedCBO's energy of eq. (19) for :func:`consensus_downloads`: ``L_j^i``, the loss of each
    download on agent ``j``'s data (``cfg``: a :class:`~cbo_jax.federated.FedCBOConfig`, its
    ``loss_reduction`` and ``local.batch_size``)."""
    def energy(models, theta_j, x, y, c):
        loss_of = lambda p: agent_loss(model, p, x, y, c, batch_size=cfg.local.batch_size,  # noqa: E731
                                       reduction=cfg.loss_reduction)
        loss = jax.vmap(loss_of)(models)
        own = loss_of(theta_j)
        return Energy(loss, loss, own, own)

    return energy


def group_loss(model, cfg):
    """FedCBO's energy of eq. (19) for :func:`consensus_by_model`:
    one model's loss ``L_j(θ)`` on each of a group of agents' data, as one forward pass
    over the stacked samples, reduced per agent as :func:`loss_energy` does."""
    def energy(theta, x, y, c):
        g, n_max = y.shape[:2]
        stack = lambda a: a.reshape((g * n_max,) + a.shape[2:])  # noqa: E731  # (g, n_max, ...) -> (g·n_max, ...)
        per = model.loss(model.apply(theta, stack(x)), stack(y))
        return jax.vmap(lambda p, cnt: reduce_sample_losses(p, cnt, cfg.local.batch_size, cfg.loss_reduction))(
            per.reshape(g, n_max), c)

    return energy
