"""The consensus step over downloaded models, shared by FedCBO and FedCB²O.

For every selecting agent ``j`` with downloads ``A_j = idx[j]``:

    m_j = Σ_{i ∈ A_j} θ_i μ_i [+ θ_j μ_j] / Σ μ,   μ_i = exp(-α E_j^i),

FedCBO eq. (19) with the energy ``E_j^i = L_j(θ_i)``, the loss of the download on
``j``'s data, and FedCB²O eq. (3.10) restricted to the downloads with ``E_j^i = G^i``,
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
(one copy, no separate transpose), which made the whole step 1.19–1.21x faster at FedCBO's
benchmark setting (``benchmarks/RESULTS_fedcbo.md``, section 0a). Both passes compute every number
exactly as the single fused pass does (a test checks bitwise equality). A download map
that moves data between devices is called once (fused), so rows travel once.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import population as pop
from cbo_jax.consensus import consensus_weights

PyTree = Any

__all__ = ["Downloads", "Energy", "consensus_downloads", "local_downloads", "DownloadMap"]


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
        finite = finite & ok
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

    def contract(down, w, w_self, theta_j):
        """The consensus point m_j = Σ_i w_i θ_i + w_self θ_j (non-finite rows are zero)."""
        return jax.tree_util.tree_map(
            lambda d, t: jnp.tensordot(w.astype(d.dtype), d, axes=(0, 0))
            + w_self.astype(t.dtype) * jnp.where(jnp.isfinite(t), t, 0.0), down, theta_j)

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
