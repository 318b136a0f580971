"""CBO with memory effects: each particle remembers its personal best (CBXpy's ``CBOMemory``).

Grassi and Pareschi (*From particle swarm optimization to consensus based optimization:
stochastic modeling and mean-field limit*, M3AS 31(8), 2021) and Riedl (*Leveraging
memory effects and gradient information in consensus-based optimization*, EJAM 2023,
eq. (1.3)): particles ``x_i`` with personal-best memories ``y_i``; the consensus point
is formed from the memories,

    m_α = Σ_i y_i e^{-α E(y_i)} / Σ_i e^{-α E(y_i)},

and each particle is pulled toward the consensus and toward its own memory::

    dx_i = -λ1 (x_i - m_α) dt + σ1 D(x_i - m_α) dB_i - λ_mem (x_i - y_i) dt + σ_mem D(x_i - y_i) dB~_i,
    y_i  ← x_i  whenever  E(x_i) < E(y_i).

Discretised as CBXpy does, by splitting: first the CBO step toward ``m_α``, then the
memory step from those new positions (``u = x' - y``), then one evaluation and the
memory update. The noise model ``D`` is the config's (anisotropic, isotropic, constant,
covariance or a callable). ``σ_mem`` defaults to ``λ_mem σ1`` (CBXpy's default, fixed
when the config is built).

State: ``x`` the positions, ``energy`` the memory energies ``E(y_i)``, ``aux.y`` the
memories, ``aux.x_energy`` the positions' energies ``E(x_i)``; the best particle is the
best memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_point
from cbo_jax.dynamics import core
from cbo_jax.dynamics.base import MemoryAux
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree

__all__ = ["CBOMemoryConfig", "MemoryParams", "MemoryAux", "cbo_memory", "memory_consensus", "memory_absorb"]


class MemoryParams(NamedTuple):
    """CBOMemory's own numbers (``Params.extra``): ``lambda_memory``, ``sigma_memory``."""

    lambda_memory: Any
    sigma_memory: Any


@dataclasses.dataclass(frozen=True)
class CBOMemoryConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus the memory terms.

    Attributes:
      lambda_memory: ``λ_mem >= 0``, the pull toward the memory (CBXpy's ``lamda_memory``, 0.4).
      sigma_memory: ``σ_mem >= 0`` of the memory noise; ``None``: ``λ_mem · σ1``.
    """

    lambda_memory: float = 0.4
    sigma_memory: float | None = None

    EXTRA_RULES = {"lambda_memory": "non_negative", "sigma_memory": "non_negative"}

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "lambda_memory", _checks.non_negative("lambda_memory", self.lambda_memory))
        if self.sigma_memory is not None:
            object.__setattr__(self, "sigma_memory", _checks.non_negative("sigma_memory", self.sigma_memory))
        _no_gradient(self, "cbo_memory")

    def extra_params(self) -> MemoryParams:
        sm = self.lambda_memory * self.sigma1 if self.sigma_memory is None else self.sigma_memory
        return MemoryParams(float(self.lambda_memory), float(sm))


def _no_gradient(config, name):
    if config.lambda2 != 0 or config.sigma2 != 0:
        raise ValueError(f"{name}: gradient terms (lambda2, sigma2) are only available in cbo()")


def memory_consensus(state, in_batch):
    """The Gibbs mean of the memories ``y`` with their energies."""
    return consensus_point(state.aux.y, state.energy, state.alpha, in_batch)


def _memories(state):
    """The points the consensus averages: the memories."""
    return state.aux.y


def memory_absorb(state, x, aux, energy):
    """``y_i ← x_i`` where ``E(x_i) < E(y_i)``; the memories and their energies are the state.

    A memory whose energy is NaN counts as the worst (``+inf``): any non-NaN energy replaces it.
    """
    better = (state.energy > energy) | (jnp.isnan(state.energy) & ~jnp.isnan(energy))
    y = pop.tree_where_rows(better, x, aux.y)
    e = jnp.where(better, energy, state.energy)
    return core.Absorbed(x=x, aux=aux._replace(y=y, x_energy=energy), energy=e, best_points=y, best_energy=e,
                         alpha_energy=e)


def cbo_memory(objective: Callable[[PyTree], jax.Array], config: CBOMemoryConfig | None = None,
               **overrides: Any) -> Dynamics:
    """CBO with personal-best memory (CBXpy's ``CBOMemory``; see the module docstring).

    Returns a :class:`~cbo_jax.dynamics.cbo.Dynamics` for :func:`cbo_jax.simulate`.
    """
    config = _checks.config_with("cbo_memory", CBOMemoryConfig, config, overrides)
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        x, y, prm = ctx.state.x, ctx.state.aux.y, ctx.prm
        k1, k2 = jax.random.split(ctx.key)
        u = ctx.correct(pop.tree_sub(x, ctx.m))
        x = _pull(x, u, prm.lambda1, prm.sigma1, prm.dt, None if quiet or config.sigma1 == 0 else ctx.noise(k1, u))
        u = pop.tree_sub(x, y)
        x = _pull(x, u, prm.extra.lambda_memory, prm.extra.sigma_memory, prm.dt,
                  None if quiet else ctx.noise(k2, u))
        return x, ctx.state.aux

    kernel = core.Kernel(name="cbo_memory", move=move, init_aux=lambda x0, e, prm: MemoryAux(y=x0, x_energy=e),
                         consensus=memory_consensus, absorb=memory_absorb,
                         consensus_points=_memories, aux_rows=("y",))
    return core.build(objective, config, kernel)


def _pull(x, u, lam, sigma, dt, noise):
    """``x - λ dt u + σ · noise`` (CBXpy's ``cbo_update``)."""
    if noise is None:
        return jax.tree_util.tree_map(lambda a, b: a - (lam * dt) * b, x, u)
    scale, d = noise
    return jax.tree_util.tree_map(lambda a, b, c: a - (lam * dt) * b + (sigma * scale) * c, x, u, d)
