"""Agent selection: which ``M`` other agents each agent downloads in a round.

* :func:`uniform` -- ``M`` distinct other agents uniformly at random.
* :func:`epsilon_greedy` -- FedCBO Remark 3: ``round(ε M)`` agents uniformly at random,
  the remaining ``M - round(ε M)`` the top entries of the agent's row of the likelihood
  matrix ``P`` among the others not yet picked; ε(n) = max(ε0 - decay·n, ε_min).
* :func:`init_likelihood` / :func:`update_likelihood` -- ``P`` starts at ones with
  ``-inf`` on the diagonal and is updated by eq. (21):
  ``P[j, i] += L_j(θ_j) - L_j(θ_i)`` for the downloaded ``i``.
* :func:`prob_sampling` -- FedCB²O's ProbSampling: never-observed agents first
  (uniformly), then ``M`` without replacement ∝ ``P``; :func:`init_prob_likelihood` /
  :func:`update_prob_likelihood` keep ``P ← (1-ζ) P + ζ exp(-κ L)`` (NaN = never observed).

Ties in ``P`` (all of round 0) are broken by a random permutation, so round 0 picks
uniformly at random, as the reference code does. An agent never selects itself and
never selects the same agent twice in a round. All functions act on every agent at
once: ``(N, N)`` scores, ``lax.top_k`` with the static ``M``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["uniform", "epsilon_greedy", "epsilon_schedule", "init_likelihood", "update_likelihood", "init_prob_likelihood",
           "prob_sampling", "update_prob_likelihood"]


def _random_order(key: jax.Array, n: int) -> jax.Array:
    """``(n, n)``: row j is a random permutation of the agents with j itself last."""
    noise = jax.random.uniform(key, (n, n))
    noise = jnp.where(jnp.eye(n, dtype=bool), 2.0, noise)
    return jnp.argsort(noise, axis=1)


def uniform(key: jax.Array, num_agents: int, m: int) -> jax.Array:
    """``(N, M)`` indices: for each agent, ``M`` distinct others uniformly at random."""
    _check_m(num_agents, m)
    return _random_order(key, num_agents)[:, :m].astype(jnp.int32)


def epsilon_schedule(n, eps0: float = 0.5, decay: float = 0.01, eps_min: float = 0.1):
    """ε(n) = max(ε0 - decay·n, ε_min) (FedCBO §1.2; defaults 0.5, 0.01, 0.1)."""
    return jnp.maximum(eps0 - decay * n, eps_min)


def epsilon_greedy(key: jax.Array, P: jax.Array, m: int, eps) -> tuple[jax.Array, jax.Array]:
    """ε-greedy selection (FedCBO Remark 3).

    Args:
      key: PRNG key.
      P: ``(N, N)`` likelihood matrix (diagonal ignored).
      m: number of downloads ``M`` (static, ``1 <= M <= N - 1``).
      eps: ε for this round (may be traced).

    Returns ``(idx, is_random)``: ``(N, M)`` indices (the random picks first) and a
    boolean ``(N, M)`` marking the uniformly random picks.
    """
    n = P.shape[0]
    _check_m(n, m)
    order = _random_order(key, n)  # random permutation, self last
    n_rand = jnp.round(eps * m).astype(jnp.int32)
    slot = jnp.arange(m)
    is_random = jnp.broadcast_to(slot[None, :] < n_rand, (n, m))
    rand_part = order[:, :m]
    # Greedy part: top-P among the agents not picked at random (and not self), with ties
    # broken by the same random permutation (stable top_k on the permuted row).
    position = jnp.argsort(order, axis=1)  # position of agent i in row j's permutation
    picked = (position < n_rand) | jnp.eye(n, dtype=bool)
    score = jnp.where(picked, -jnp.inf, P)
    score_in_order = jnp.take_along_axis(score, order, axis=1)
    _, top_pos = jax.lax.top_k(score_in_order, m)
    greedy = jnp.take_along_axis(order, top_pos, axis=1)
    greedy_shifted = jnp.take_along_axis(greedy, jnp.clip(slot[None, :] - n_rand, 0, m - 1), axis=1)
    idx = jnp.where(is_random, rand_part, greedy_shifted)
    return idx.astype(jnp.int32), is_random


def init_likelihood(num_agents: int, dtype=jnp.float32) -> jax.Array:
    """``P`` of the reference code: ones, ``-inf`` on the diagonal."""
    return jnp.where(jnp.eye(num_agents, dtype=bool), -jnp.inf, jnp.ones((num_agents, num_agents), dtype))


def update_likelihood(P: jax.Array, idx: jax.Array, own_loss: jax.Array, loss: jax.Array, active=None) -> jax.Array:
    """Eq. (21): ``P[j, idx[j, t]] += own_loss[j] - loss[j, t]`` (rows with ``active`` only)."""
    delta = own_loss[:, None] - loss
    if active is not None:
        delta = jnp.where(active[:, None], delta, 0.0)
    rows = jnp.broadcast_to(jnp.arange(P.shape[0])[:, None], idx.shape)
    return P.at[rows, idx].add(delta.astype(P.dtype))


def _check_m(n: int, m: int) -> None:
    if not 1 <= m <= n - 1:
        raise ValueError(f"M (downloads per agent) must satisfy 1 <= M <= N - 1 = {n - 1}, got M={m}")


# --- ProbSampling (FedCB²O, Algorithm 2; REFERENCE_NOTES §2.2) ---------------------------------
#
# ``P[j, i]`` is agent j's estimate of how useful agent i is. An entry that was never
# observed holds NaN (so "never selected" needs no second matrix), the agent itself holds
# -inf. ``P`` may be rectangular ``(J, N)`` with ``J <= N``: row j's own column is j (the
# first J agents select, for example the benign ones of an attack simulation).


def init_prob_likelihood(num_rows: int, num_agents: int | None = None, dtype=jnp.float32) -> jax.Array:
    """``P`` for :func:`prob_sampling`: NaN (never observed), ``-inf`` at each row's own agent."""
    n = num_rows if num_agents is None else num_agents
    if num_rows > n:
        raise ValueError(f"num_rows ({num_rows}) must be <= num_agents ({n})")
    return jnp.where(jnp.eye(num_rows, n, dtype=bool), -jnp.inf, jnp.full((num_rows, n), jnp.nan, dtype))


def prob_sampling(key: jax.Array, P: jax.Array, m: int) -> jax.Array:
    """ProbSampling (FedCB²O Algorithm 2): ``(J, M)`` distinct downloads per row.

    While some other agents were never observed (``P`` is NaN), the row picks among
    them uniformly at random; the remaining slots (all of them once every agent has
    been observed) are ``M`` agents drawn without replacement with probability
    proportional to ``P[j, i]`` (successive sampling, done as Gumbel-top-k:
    ``argtop_M(log P + Gumbel)``). Agents with ``P = 0`` are drawn only when nothing
    else is left. An agent never selects itself and never the same agent twice.
    """
    rows, n = P.shape
    _check_m(n, m)
    own = jnp.eye(rows, n, dtype=bool)
    unexplored = jnp.isnan(P) & ~own
    logp = jnp.log(jnp.clip(jnp.where(jnp.isnan(P) | own, 1.0, P), 0.0))
    g = jax.random.gumbel(key, (rows, n), jnp.float32)
    within = jnp.where(unexplored, g, jnp.maximum(logp, -1e30) + g)
    tier = jnp.where(own, 0, jnp.where(unexplored, 2, 1))
    # Sort by tier (unexplored first, self last), then by the Gumbel key, both descending.
    order = jnp.lexsort((-within, -tier), axis=-1)
    return order[:, :m].astype(jnp.int32)


def update_prob_likelihood(P: jax.Array, idx: jax.Array, loss: jax.Array, kappa: float, zeta: float,
                           active=None) -> jax.Array:
    """``P[j, i] ← (1 - ζ) P[j, i] + ζ exp(-κ L_j^i)`` for the downloaded ``i`` (FedCB²O §2.2).

    The first observation of an entry sets it to ``exp(-κ L_j^i)``. A non-finite loss
    gives reward 0. ``idx`` must hold distinct agents per row (as :func:`prob_sampling`
    returns); rows with ``active`` False are left unchanged.
    """
    reward = jnp.where(jnp.isfinite(loss), jnp.exp(-kappa * jnp.where(jnp.isfinite(loss), loss, 0.0)), 0.0)
    rows = jnp.broadcast_to(jnp.arange(P.shape[0])[:, None], idx.shape)
    old = P[rows, idx]
    new = jnp.where(jnp.isnan(old), reward, (1.0 - zeta) * old + zeta * reward).astype(P.dtype)
    if active is not None:
        new = jnp.where(active[:, None], new, old)
    return P.at[rows, idx].set(new)
