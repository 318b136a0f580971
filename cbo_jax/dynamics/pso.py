"""Particle swarm optimisation as a stochastic particle system (CBXpy's ``PSO``).

Grassi and Pareschi (M3AS 31(8), 2021, eq. (2.4)) and Huang, Qiu and Riedl (*On the
global convergence of particle swarm optimization methods*, AMO 88(2), 2023, eq. (1.1)):
positions ``x_i``, velocities ``v_i`` and personal-best memories ``y_i``::

    dx_i = v_i dt,
    m dv_i = -γ v_i dt + λ1 (m_α - x_i) dt + λ_mem (y_i - x_i) dt
             + σ1 D(m_α - x_i) dB_i + σ_mem D(y_i - x_i) dB~_i,

with ``m_α`` the Gibbs mean of the memories (as in :mod:`cbo_jax.dynamics.memory`),
inertia ``m > 0`` and friction ``γ >= 0`` (default ``1 - m``). The velocity step is
semi-implicit in the friction (``formulation="paper"``, the default)::

    v ← (m v + λ1 dt (m_α - x) + λ_mem dt (y - x) + σ1 n_c + σ_mem n_y) / (m + γ dt),
    x ← x + dt v,

``n_c, n_y`` the noise increments of the drifts ``x - m_α`` and ``x - y`` (the noise
model of the config), then one evaluation and the memory update ``y ← x`` where better.

``formulation="cbxpy"`` reproduces CBXpy 1.0.4's ``PSO.inner_step`` term by term,
``v ← (m dt v + λ1 dt (x - m_α) + λ_mem dt (x - y) + σ1 n_c + σ_mem n_y) / (m + γ dt)``:
its inertia term carries an extra ``dt`` and its two drifts point *away* from the
consensus and the memory (with CBXpy's defaults its swarm spreads: ``|x|`` grows like
``e^{0.9 t}``). It exists so that ``tests/test_cbx_family.py`` can check the step
against CBXpy to 1e-10; use the default for optimisation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.dynamics import core
from cbo_jax.dynamics.base import PSOAux
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _memories, _no_gradient, memory_absorb, memory_consensus

__all__ = ["PSOConfig", "PSOParams", "PSOAux", "pso"]


class PSOParams(NamedTuple):
    """PSO's own numbers (``Params.extra``): inertia ``m``, friction ``gamma``, memory pull and noise."""

    m: Any
    gamma: Any
    lambda_memory: Any
    sigma_memory: Any


@dataclasses.dataclass(frozen=True)
class PSOConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus PSO's inertia and memory.

    Attributes:
      m: inertia ``m > 0`` (CBXpy's default ``0.001``).
      gamma: friction ``γ >= 0``; ``None``: ``1 - m``.
      lambda_memory: ``λ_mem >= 0`` (CBXpy: 0.4).
      sigma_memory: ``σ_mem >= 0``; ``None``: ``λ_mem · σ1``.
      formulation: ``"paper"`` (default) or ``"cbxpy"`` (CBXpy 1.0.4's arithmetic; see
        the module docstring).
    """

    m: float = 0.001
    gamma: float | None = None
    lambda_memory: float = 0.4
    sigma_memory: float | None = None
    formulation: str = "paper"

    EXTRA_RULES = {"m": "positive", "gamma": "non_negative", "lambda_memory": "non_negative",
                   "sigma_memory": "non_negative"}

    def __post_init__(self):
        super().__post_init__()
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("m", _checks.positive("m", self.m))
        if self.gamma is not None:
            set_("gamma", _checks.non_negative("gamma", self.gamma))
        elif self.m > 1:
            raise ValueError(f"gamma defaults to 1 - m, which is negative for m={self.m}; give gamma")
        set_("lambda_memory", _checks.non_negative("lambda_memory", self.lambda_memory))
        if self.sigma_memory is not None:
            set_("sigma_memory", _checks.non_negative("sigma_memory", self.sigma_memory))
        _checks.one_of("formulation", self.formulation, ("paper", "cbxpy"))
        _no_gradient(self, "pso")

    def extra_params(self) -> PSOParams:
        gamma = 1.0 - self.m if self.gamma is None else self.gamma
        sm = self.lambda_memory * self.sigma1 if self.sigma_memory is None else self.sigma_memory
        return PSOParams(float(self.m), float(gamma), float(self.lambda_memory), float(sm))


def pso(objective: Callable[[PyTree], jax.Array], config: PSOConfig | None = None,
        **overrides: Any) -> Dynamics:
    """Particle swarm optimisation (CBXpy's ``PSO``; see the module docstring)."""
    config = _checks.config_with("pso", PSOConfig, config, overrides)
    quiet = config.noise_kind == "none"
    cbx = config.formulation == "cbxpy"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        x, y, v = st.x, st.aux.y, st.aux.v
        e = prm.extra
        dt = prm.dt
        cd = pop.tree_sub(x, ctx.m)   # consensus drift x - m_α
        md = pop.tree_sub(x, y)       # memory drift x - y
        k1, k2 = jax.random.split(ctx.key)
        leaves = [cd, md]
        if not quiet:
            sc, nc = ctx.noise(k1, cd)
            sm, nm = ctx.noise(k2, md)
            leaves += [nc, nm]
        inertia = e.m * dt if cbx else e.m
        sign = 1.0 if cbx else -1.0
        denom = e.m + e.gamma * dt
        pull = ctx.correct(jax.tree_util.tree_map(lambda a: (prm.lambda1 * dt) * a, cd))

        def vel(vi, pi, mdi, *noise):
            acc = inertia * vi + sign * pi + sign * ((e.lambda_memory * dt) * mdi)
            if noise:
                acc = acc + (prm.sigma1 * sc) * noise[0] + (e.sigma_memory * sm) * noise[1]
            return acc / denom

        v = jax.tree_util.tree_map(vel, v, pull, md, *leaves[2:])
        x = jax.tree_util.tree_map(lambda a, b: a + dt * b, x, v)
        return x, st.aux._replace(v=v)

    def init_aux(x0, energy, prm):
        return PSOAux(y=x0, v=jax.tree_util.tree_map(lambda a: a * 0, x0), x_energy=energy)

    kernel = core.Kernel(name="pso", move=move, init_aux=init_aux, consensus=memory_consensus, absorb=memory_absorb,
                         consensus_points=_memories,
                         aux_rows=("y", "v"))
    return core.build(objective, config, kernel)
