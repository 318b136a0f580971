"""Agent selection: which ``M`` other agents each agent downloads in a round.

A selection *rule* is a :class:`SelectionRule`, three pure functions in the style of
optax's transformations, shared by FedCBO and FedCB²O:

* ``init(rows, cols) -> P``: the ``(rows, cols)`` likelihood matrix; row ``j`` belongs
  to selecting agent ``j``, column ``i`` to candidate ``i``, and row ``j``'s own column
  is ``j`` (rectangular when only the first agents select, e.g. the benign ones);
* ``select(key, P, n, candidates=None) -> Selection``: ``(rows, M)`` distinct downloads,
  never the agent itself, in round ``n``; ``candidates``, a ``(cols,)`` mask, restricts them
  to the participating agents ``G_n`` (FedCBO Algorithm 2, ``ε-greedySampling(P^j, G_n, M)``):
  when fewer than ``M`` others are candidates, the slots left over are empty
  (``Selection.valid``; they hold other distinct agents, never the agent itself). ``None``
  (full participation) draws exactly as before the mask existed;
* ``update(P, idx, loss, own_loss, active, valid) -> P``: learn from the downloads' losses
  on the agent's data (rows with ``active`` False, and empty slots, unchanged).

Rules:

* :func:`epsilon_greedy` -- FedCBO Remark 3: ``⌊ε M⌋`` agents uniformly at random (the
  reference code's ``int(ε·M)``), the remaining ``M - ⌊ε M⌋`` the top entries of the agent's row of ``P`` among the
  others not yet picked (both among the ``candidates`` only, when given);
  ``ε(n) = max(ε0 - decay·n, ε_min)``. ``P`` starts at ones
  (``-inf`` on the own column) and follows eq. (21):
  ``P[j, i] += L_j(θ_j) - L_j(θ_i)`` for the downloaded ``i``.
* :func:`uniform` -- ``M`` distinct others uniformly at random (ε-greedy with ``ε = 1``;
  ``P`` is still kept by eq. (21), for diagnostics).
* :func:`prob_sampling` -- FedCB²O's ProbSampling (Algorithm 2): while some others were
  never observed, ``M`` of them uniformly (all of them, and no other, when there are at most
  ``M``; the remaining slots stay empty, ``Selection.valid``); once every agent has been
  observed, ``M`` without replacement ∝ ``P``, with ``P ← (1-ζ) P + ζ exp(-κ L)``
  (NaN = never observed). With ``candidates``, "the others" are the other candidates.

Ties in ``P`` (all of round 0) are broken by a random permutation, so round 0 picks
uniformly at random, as the reference code does. Random numbers are drawn with the
selecting agents on the leading axis, so an agent's picks do not depend on how many
rows follow it (padding agents). The ``draw_*`` kernels act on every row at once:
``(rows, cols)`` scores, ``lax.top_k`` with the static ``M``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks

__all__ = ["SelectionRule", "Selection", "epsilon_greedy", "uniform", "prob_sampling", "RULES", "check_rule",
           "draw_uniform",
           "draw_epsilon_greedy", "draw_prob_sampling", "prob_sampling_valid", "filled_slots", "epsilon_schedule",
           "init_likelihood", "update_likelihood",
           "init_prob_likelihood", "update_prob_likelihood", "P_STARTS"]


class Selection(NamedTuple):
    """One round's downloads: ``idx`` ``(rows, M)``, which were random picks, ε, and which
    slots hold a download (``valid``; ``None``: all ``M`` of them)."""

    idx: jax.Array
    is_random: jax.Array
    eps: jax.Array
    valid: jax.Array | None = None


class SelectionRule(NamedTuple):
    """A selection rule (module docstring): ``init``, ``select``, ``update`` and ``M``."""

    init: Callable[[int, int], jax.Array]
    select: Callable[..., Selection]  # select(key, P, n, candidates=None)
    update: Callable[..., jax.Array]
    M: int
    name: str


# --------------------------------------------------------------------------- rules


def epsilon_greedy(M: int, eps0: float = 0.5, eps_decay: float = 0.01, eps_min: float = 0.1) -> SelectionRule:
    """FedCBO's ε-greedy rule (Remark 3) with ``ε(n) = max(ε0 - decay·n, ε_min)``.

    ``M >= 1`` an integer, ``eps0`` and ``eps_min`` in ``[0, 1]`` with ``eps_min <= eps0``,
    ``eps_decay >= 0`` (checked here, as :class:`~cbo_jax.federated.algorithms.fedcbo.FedCBOConfig` does)."""
    _checks.positive_int("M", M)
    _checks.unit_interval("eps0", eps0)
    _checks.non_negative("eps_decay", eps_decay, f32=True)
    _checks.unit_interval("eps_min", eps_min)
    _checks.epsilon_floor(eps0, eps_min)

    def select(key, P, n, candidates=None):
        eps = epsilon_schedule(n, eps0, eps_decay, eps_min)
        idx, is_random = draw_epsilon_greedy(key, P, M, eps, candidates)
        valid = None if candidates is None else filled_slots(P, M, candidates)
        return Selection(idx, is_random, jnp.asarray(eps, jnp.float32), valid)

    def update(P, idx, loss, own_loss, active=None, valid=None):
        return update_likelihood(P, idx, loss, own_loss, active, valid)

    return SelectionRule(_init_ones, select, update, M, "epsilon_greedy")


def uniform(M: int) -> SelectionRule:
    """``M`` distinct others uniformly at random (ε-greedy with ``ε = 1``)."""
    return epsilon_greedy(M, eps0=1.0, eps_decay=0.0, eps_min=1.0)._replace(name="uniform")


P_STARTS = ("first", "zero")


def prob_sampling(M: int, kappa: float = 2.0, zeta: float = 0.5, start: str = "first") -> SelectionRule:
    """FedCB²O's ProbSampling (Algorithm 2) with ``P ← (1-ζ) P + ζ exp(-κ L)``.

    ``M >= 1`` an integer, ``kappa >= 0``, ``zeta`` in ``(0, 1]``, ``start`` one of
    :data:`P_STARTS` (:func:`update_prob_likelihood`; checked here)."""
    _checks.positive_int("M", M)
    _checks.non_negative("kappa", kappa, f32=True)
    _checks.fraction("zeta", zeta)
    _checks.one_of("start", start, P_STARTS)

    def select(key, P, n, candidates=None):
        idx = draw_prob_sampling(key, P, M, candidates)
        return Selection(idx, jnp.take_along_axis(jnp.isnan(P), idx, axis=1), jnp.zeros((), jnp.float32),
                         prob_sampling_valid(P, M, candidates))

    def update(P, idx, loss, own_loss=None, active=None, valid=None):
        return update_prob_likelihood(P, idx, loss, kappa, zeta, active, valid, start=start)

    return SelectionRule(lambda rows, cols: init_prob_likelihood(rows, cols), select, update, M, "prob_sampling")


RULES = {"epsilon_greedy": epsilon_greedy, "uniform": uniform, "prob_sampling": prob_sampling}


def check_rule(rule, M: int, rows: int, cols: int, where: str, candidates: bool = False) -> SelectionRule:
    """A rule of one's own, tried on the host before a run: ``init`` gives ``(rows, cols)``,
    and ``select`` in rounds 0 and 1 (after an ``update`` with random losses) gives
    ``(rows, M)`` integer downloads, every filled slot another agent in ``[0, cols)``,
    distinct within its row (``candidates``: also with half the agents as candidates, where a
    candidate's filled slots must be candidates).
    Inside the jitted round these could only be wrong quietly: a self-download, an index
    past the agents (clamped by the gather), a repeated agent. Returns ``rule``."""
    if not isinstance(rule, SelectionRule):
        raise ValueError(f"{where}: rule must be a cbo_jax.federated.SelectionRule(init, select, update, M, name), "
                         f"got {type(rule).__name__}")
    if rule.M != M:
        raise ValueError(f"{where}: the rule {rule.name!r} draws M={rule.M} downloads, the config M={M}")
    P = rule.init(rows, cols)
    if np.shape(P) != (rows, cols):
        raise ValueError(f"{where}: the rule {rule.name!r}: init({rows}, {cols}) returned shape {np.shape(P)}, "
                         f"not ({rows}, {cols})")
    key = jax.random.key(0)
    masks = [None] + ([np.arange(cols) % 2 == 0] if candidates else [])
    for n in (0, 1):
        for cand in masks:
            sel = rule.select(jax.random.fold_in(key, n), P, jnp.int32(n), None if cand is None else jnp.asarray(cand))
            _check_selection(sel, rule.name, M, rows, cols, n, where, cand)
        loss = jax.random.uniform(jax.random.fold_in(key, 10 + n), (rows, M))
        P = rule.update(P, sel.idx, loss, jnp.full((rows,), 0.5), jnp.ones((rows,), bool), sel.valid)
        if np.shape(P) != (rows, cols):
            raise ValueError(f"{where}: the rule {rule.name!r}: update returned P of shape {np.shape(P)}, not "
                             f"({rows}, {cols})")
    return rule


def _check_selection(sel, name: str, M: int, rows: int, cols: int, n: int, where: str, candidates=None) -> None:
    what = f"{where}: the rule {name!r} in round {n}"
    if not isinstance(sel, Selection):
        raise ValueError(f"{what}: select must return a Selection(idx, is_random, eps, valid), got "
                         f"{type(sel).__name__}")
    idx = np.asarray(sel.idx)
    if idx.shape != (rows, M) or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{what}: select must return integer downloads idx of shape ({rows}, {M}), got "
                         f"{idx.dtype} {idx.shape}")
    valid = np.ones(idx.shape, bool) if sel.valid is None else np.asarray(sel.valid)
    if valid.shape != idx.shape or valid.dtype != np.bool_:
        raise ValueError(f"{what}: Selection.valid must be None or a boolean ({rows}, {M}) mask, got "
                         f"{valid.dtype} {valid.shape}")
    own = np.arange(rows)[:, None]
    problems = [("an agent outside [0, {})".format(cols), valid & ((idx < 0) | (idx >= cols))),
                ("the agent itself", valid & (idx == own) & (own < cols))]
    if candidates is not None:  # a participant downloads only models trained this round (Algorithm 1)
        cand = np.asarray(candidates, bool)
        taking_part = np.where(own < cols, cand[np.minimum(own, cols - 1)], True)
        problems.append(("an agent that is not a candidate this round", valid & taking_part
                         & ~cand[np.clip(idx, 0, cols - 1)]))
    ordered = np.sort(np.where(valid, idx, -1 - np.arange(M)[None, :]), axis=1)
    problems.append(("an agent twice in one row", np.zeros_like(valid) | np.any(ordered[:, 1:] == ordered[:, :-1],
                                                                                 axis=1, keepdims=True)))
    for text, bad in problems:
        if bad.any():
            j = int(np.argwhere(bad)[0][0])
            raise ValueError(f"{what}: agent {j} downloads {text} ({idx[j].tolist()[:10]}); a download is another "
                             f"agent, distinct within the row, among the candidates when select is given them (an "
                             f"empty slot is marked in Selection.valid)")


def _init_ones(rows: int, cols: int) -> jax.Array:
    return init_likelihood(rows, cols)


# --------------------------------------------------------------------------- kernels


def _random_order(key: jax.Array, rows: int, cols: int, allowed: jax.Array | None = None) -> jax.Array:
    """``(rows, cols)``: row j is a random permutation of the candidates with j itself last.

    With ``allowed`` (``(rows, cols)``, False on the own column): the allowed agents first in
    random order, then the others in index order, then j itself (the same permutation as
    without it when every other agent is allowed)."""
    noise = jax.random.uniform(key, (rows, cols))
    if allowed is None:
        noise = jnp.where(jnp.eye(rows, cols, dtype=bool), 2.0, noise)
    else:
        noise = jnp.where(allowed, noise, jnp.where(jnp.eye(rows, cols, dtype=bool), 3.0, 2.0))
    return jnp.argsort(noise, axis=1)


def _allowed(rows: int, cols: int, candidates) -> jax.Array:
    """``(rows, cols)``: candidate ``i`` may be downloaded by row ``j`` (``i`` a candidate, not ``j``)."""
    candidates = jnp.asarray(candidates, bool)
    if candidates.shape != (cols,):
        raise ValueError(f"candidates must be a ({cols},) mask of the agents that may be downloaded, "
                         f"got shape {candidates.shape}")
    return candidates[None, :] & ~jnp.eye(rows, cols, dtype=bool)


def filled_slots(P: jax.Array, m: int, candidates) -> jax.Array:
    """``(rows, M)``: the slots an ε-greedy draw among ``candidates`` fills, the first
    ``min(M, k_j)`` of row ``j`` (``k_j``: the candidates other than ``j``)."""
    rows, n = P.shape
    k = jnp.sum(_allowed(rows, n, candidates), axis=1, keepdims=True)
    return jnp.arange(m)[None, :] < k


def draw_uniform(key: jax.Array, num_agents: int, m: int, rows: int | None = None) -> jax.Array:
    """``(rows, M)`` indices: for each agent, ``M`` distinct others uniformly at random."""
    _checks.downloads(m, num_agents)
    return _random_order(key, num_agents if rows is None else rows, num_agents)[:, :m].astype(jnp.int32)


def epsilon_schedule(n, eps0: float = 0.5, decay: float = 0.01, eps_min: float = 0.1):
    """ε(n) = max(ε0 - decay·n, ε_min) (FedCBO §2.4, Remark 3; defaults 0.5, 0.01, 0.1)."""
    return jnp.maximum(eps0 - decay * n, eps_min)


def draw_epsilon_greedy(key: jax.Array, P: jax.Array, m: int, eps, candidates=None) -> tuple[jax.Array, jax.Array]:
    """ε-greedy selection (FedCBO Remark 3) for every row of ``P``.

    Args:
      key: PRNG key.
      P: ``(rows, N)`` likelihood matrix (own column ignored).
      m: number of downloads ``M`` (static, ``1 <= M <= N - 1``).
      eps: ε for this round (may be traced).
      candidates: ``(N,)`` mask of the agents that may be downloaded (FedCBO Algorithm 2's
        ``G_n``; ``None``: all). Row ``j`` draws among the candidates other than ``j``; when
        there are ``k_j < M`` of them, slots ``k_j, ..., M-1`` are empty
        (:func:`filled_slots`) and hold other distinct non-candidates.

    Returns ``(idx, is_random)``: ``(rows, M)`` indices (the random picks first) and a
    boolean ``(rows, M)`` marking the uniformly random picks.
    """
    rows, n = P.shape
    _checks.downloads(m, n)
    allowed = None if candidates is None else _allowed(rows, n, candidates)
    order = _random_order(key, rows, n, allowed)  # random permutation, self last
    # ⌊εM⌋ as the reference code's int(ε·M); the 1e-6 absorbs float32's rounding of ε
    # (0.7 is stored as 0.69999999, and ⌊0.69999999 · 10⌋ would be 6, not 7).
    n_rand = jnp.floor(eps * m + 1e-6).astype(jnp.int32)
    slot = jnp.arange(m)
    is_random = jnp.broadcast_to(slot[None, :] < n_rand, (rows, m))
    rand_part = order[:, :m]
    # Greedy part: top-P among the agents not picked at random (and not self), with ties
    # broken by the same random permutation (stable top_k on the permuted row).
    position = jnp.argsort(order, axis=1)  # position of agent i in row j's permutation
    picked = (position < n_rand) | jnp.eye(rows, n, dtype=bool)
    if allowed is not None:
        picked = picked | ~allowed  # non-candidates never rank among the greedy picks
    # A candidate whose P is -inf (eq. (21) after a download with an infinite loss) must
    # still rank above the picked agents and self, or top_k would fill the last slots
    # with them (duplicates) when fewer than M - ⌊εM⌋ candidates have a finite P.
    score = jnp.where(picked, -jnp.inf, jnp.maximum(P, jnp.finfo(P.dtype).min))
    score_in_order = jnp.take_along_axis(score, order, axis=1)
    _, top_pos = jax.lax.top_k(score_in_order, m)
    greedy = jnp.take_along_axis(order, top_pos, axis=1)
    greedy_shifted = jnp.take_along_axis(greedy, jnp.clip(slot[None, :] - n_rand, 0, m - 1), axis=1)
    idx = jnp.where(is_random, rand_part, greedy_shifted)
    if allowed is not None:
        # The first k_j positions of row j's order are its candidates; an empty slot s >= k_j
        # takes position s (a non-candidate: distinct from the downloads and each other, and
        # never j, which is last with s <= M - 1 <= N - 2).
        idx = jnp.where(slot[None, :] < jnp.sum(allowed, axis=1, keepdims=True), idx, order[:, :m])
    return idx.astype(jnp.int32), is_random


def init_likelihood(rows: int, cols: int | None = None, dtype=jnp.float32) -> jax.Array:
    """``P`` of the reference code: ones, ``-inf`` at each row's own agent."""
    cols = rows if cols is None else cols
    if rows > cols:
        raise ValueError(f"rows ({rows}) must be <= cols ({cols}): row j's own agent is column j")
    return jnp.where(jnp.eye(rows, cols, dtype=bool), -jnp.inf, jnp.ones((rows, cols), dtype))


def update_likelihood(P: jax.Array, idx: jax.Array, loss: jax.Array, own_loss: jax.Array, active=None,
                      valid=None) -> jax.Array:
    """Eq. (21): ``P[j, idx[j, t]] += own_loss[j] - loss[j, t]`` (rows with ``active`` and
    slots with ``valid`` only: an empty slot's loss is ``inf`` and must not reach ``P``)."""
    delta = own_loss[:, None] - loss
    if active is not None:
        delta = jnp.where(active[:, None], delta, 0.0)
    if valid is not None:
        delta = jnp.where(valid, delta, 0.0)
    rows = jnp.broadcast_to(jnp.arange(P.shape[0])[:, None], idx.shape)
    return P.at[rows, idx].add(delta.astype(P.dtype))


# --- ProbSampling (FedCB²O paper §3.4, Algorithm 2, eq. (3.12), Remark 3.5) -------------------
#
# ``P[j, i]`` is agent j's estimate of how useful agent i is. An entry that was never
# observed holds NaN (so "never selected" needs no second matrix), the agent itself holds
# -inf.


def init_prob_likelihood(num_rows: int, num_agents: int | None = None, dtype=jnp.float32) -> jax.Array:
    """``P`` for :func:`draw_prob_sampling`: NaN (never observed), ``-inf`` at each row's own agent."""
    n = num_rows if num_agents is None else num_agents
    if num_rows > n:
        raise ValueError(f"num_rows ({num_rows}) must be <= num_agents ({n})")
    return jnp.where(jnp.eye(num_rows, n, dtype=bool), -jnp.inf, jnp.full((num_rows, n), jnp.nan, dtype))


def draw_prob_sampling(key: jax.Array, P: jax.Array, m: int, candidates=None) -> jax.Array:
    """ProbSampling (FedCB²O Algorithm 2): ``(rows, M)`` distinct downloads per row.

    While some other agents were never observed (``P`` is NaN), the row picks among
    them uniformly at random; the remaining slots (all of them once every agent has
    been observed) are ``M`` agents drawn without replacement with probability
    proportional to ``P[j, i]`` (successive sampling, done as Gumbel-top-k:
    ``argtop_M(log P + Gumbel)``). Agents with ``P = 0`` are drawn only when nothing
    else is left, and then uniformly at random among themselves. An agent never selects
    itself and never the same agent twice. With ``candidates`` (an ``(N,)`` mask, FedCBO's
    participating agents ``G_n``), all of this is among the candidates only; the
    non-candidates come after them (in empty slots, :func:`prob_sampling_valid`).
    """
    rows, n = P.shape
    _checks.downloads(m, n)
    own = jnp.eye(rows, n, dtype=bool)
    unexplored = jnp.isnan(P) & ~own
    positive = (P > 0) & ~own  # NaN and -inf compare False
    g = jax.random.gumbel(key, (rows, n), jnp.float32)
    # Gumbel-top-k: argtop_M(log P + Gumbel) draws ∝ P without replacement. Unexplored and
    # zero-likelihood agents have their own tiers and a plain Gumbel key, so they are picked
    # uniformly among themselves (not by index: -1e30 + Gumbel rounds to -1e30 in float32).
    within = jnp.where(positive, jnp.log(jnp.where(positive, P, 1.0)) + g, g)
    tier = jnp.where(own, 0, jnp.where(unexplored, 3, jnp.where(positive, 2, 1)))
    if candidates is not None:  # non-candidates after every candidate, before self (the same order otherwise)
        tier = jnp.where(_allowed(rows, n, candidates) | own, 2 * tier, 1)
    # Sort by tier (unexplored first, then P > 0, then P = 0, self last), then by the key, both descending.
    order = jnp.lexsort((-within, -tier), axis=-1)
    return order[:, :m].astype(jnp.int32)


def prob_sampling_valid(P: jax.Array, m: int, candidates=None) -> jax.Array:
    """``(rows, M)``: the slots :func:`draw_prob_sampling` fills in the paper's Algorithm 2.

    While ``0 < k <= M`` others were never observed, only the first ``k`` slots (those
    agents) hold a download; otherwise all ``M`` do. With ``candidates``, "others" are the
    other candidates, and at most as many slots as there are of them are filled.
    """
    rows, n = P.shape
    slot = jnp.arange(m)[None, :]
    if candidates is None:
        unexplored = jnp.sum(jnp.isnan(P) & ~jnp.eye(rows, n, dtype=bool), axis=1, keepdims=True)
        return (unexplored == 0) | (slot < unexplored)
    allowed = _allowed(rows, n, candidates)
    unexplored = jnp.sum(jnp.isnan(P) & allowed, axis=1, keepdims=True)
    return slot < jnp.where(unexplored == 0, jnp.sum(allowed, axis=1, keepdims=True), unexplored)


def update_prob_likelihood(P: jax.Array, idx: jax.Array, loss: jax.Array, kappa: float, zeta: float,
                           active=None, valid=None, start: str = "first") -> jax.Array:
    """``P[j, i] ← (1 - ζ) P[j, i] + ζ exp(-κ L_j^i)`` for the downloaded ``i`` (FedCB²O
    eq. (3.12)).

    ``start``: how an entry's first observation enters. ``"first"`` (default) starts the
    moving average at its first observation, ``exp(-κ L_j^i)``; ``"zero"`` applies (3.12)
    to the paper's ``P_0 = 0`` (Algorithm 1, Remark 3.5), giving ``ζ exp(-κ L_j^i)``, so
    that an agent observed fewer times has a smaller ``P``. Either way an entry never
    observed stays NaN for ProbSampling's "never selected" tier. A non-finite loss gives
    reward 0. ``idx`` must hold distinct agents per row (as :func:`draw_prob_sampling`
    returns); rows with ``active`` False, and slots with ``valid`` False, are left unchanged.
    """
    _checks.one_of("start", start, P_STARTS)
    reward = jnp.where(jnp.isfinite(loss), jnp.exp(-kappa * jnp.where(jnp.isfinite(loss), loss, 0.0)), 0.0)
    rows = jnp.broadcast_to(jnp.arange(P.shape[0])[:, None], idx.shape)
    old = P[rows, idx]
    first = reward if start == "first" else zeta * reward
    new = jnp.where(jnp.isnan(old), first, (1.0 - zeta) * old + zeta * reward).astype(P.dtype)
    if active is not None:
        new = jnp.where(active[:, None], new, old)
    if valid is not None:
        new = jnp.where(valid, new, old)
    return P.at[rows, idx].set(new)
