"""Single-objective consensus-based optimization as a pure ``(init, step)`` pair.

The particle system is FedCBO eq. (4) for one objective ``L`` (with ``λ2 = σ2 = 0``
it is the CBO model of Pinnau, Totzeck, Tse and Martin, 2017)::

    dθ = -λ1 (θ - m_α) dt - λ2 ∇L(θ) dt + σ1 D(θ - m_α) dB + σ2 |∇L(θ)| dB~,
    m_α = Σ_i θ_i e^{-α L(θ_i)} / Σ_i e^{-α L(θ_i)},

discretised by Euler–Maruyama, eq. (15). ``init`` and ``step`` handle one run; vmap
them for ``M`` independent runs (:func:`cbo_jax.simulate` does). Nothing is hidden:
the whole state is the :class:`CBOState` named tuple.

Order within a step (as CBXpy, so that both libraries run the same scheme): the
consensus point uses the energies of the current particles and the current α; the
particles move; α is updated from those same energies; the objective is evaluated
once at the new particles (and the best-so-far tracker updated with it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax import sde
from cbo_jax.dynamics import core
from cbo_jax.dynamics.base import CBOState, Dynamics, FamilyConfig
from cbo_jax.dynamics.checks import check_objective, check_population, looks_single_particle

PyTree = Any

# CBOState, Dynamics and the host checks live in base and checks; importable from here too (cbo_jax/__init__.py)
__all__ = ["CBOConfig", "CBOState", "Dynamics", "cbo", "cbo_kernel", "check_population", "check_objective",
           "looks_single_particle"]

RNG_MODES = core.RNG_MODES


@dataclasses.dataclass(frozen=True)
class CBOConfig(FamilyConfig):
    """Parameters of the CBO dynamics, validated on construction.

    Attributes:
      lambda1: consensus drift strength ``λ1 >= 0``.
      sigma1: consensus noise strength ``σ1 >= 0``.
      dt: time step ``γ > 0``.
      alpha: inverse temperature: a number ``>= 0`` (constant) or a schedule from
        :mod:`cbo_jax.schedules`.
      noise: ``"anisotropic"`` (``σ1 (θ - m) ∘ dB``), ``"isotropic"`` (``σ1 |θ - m| dB``),
        ``"constant"`` (``σ1 dB``), ``"covariance"`` / ``"sampling"`` (``σ1 √(2(1+α))
        C^{1/2} dB``, CBXpy's covariance noise), ``"none"``, or a callable
        ``noise(key, drift, dt)`` (see :class:`cbo_jax.dynamics.core.FamilyConfig`).
      lambda2: gradient drift ``λ2 >= 0`` (``-λ2 ∇L dt``); needs a differentiable objective.
      sigma2: gradient noise ``σ2 >= 0`` (``σ2 |∇L| dB~``).
      energy_tol: stop a run once its best energy is ``<= energy_tol``.
      diff_tol: stop a run once its consensus point moves by less than ``diff_tol``
        (Euclidean norm) in one step.
      max_abs: clip particle coordinates to ``[-max_abs, max_abs]`` after each step
        (NaN becomes ``max_abs``), as CBXpy's default post-processing (``1e8``).
        ``None`` disables it.
      dtype: ``"float32"`` (default) or ``"float64"`` (needs ``jax_enable_x64``).
      rng: the noise layout. ``"counter"`` (default): a row's draw depends on the step's key
        and its index only (:func:`cbo_jax.sde.counter_normal`), so a step in blocks, a
        population sharded or padded over devices draws the same numbers, at the speed of
        JAX's non-partitionable Threefry layout. ``"per-particle"``: row ``i`` draws from
        ``fold_in(step_key, i)`` (the same invariance; slower). ``"fast"`` and
        ``"partitionable"``: JAX's two layouts of one array per leaf (their draws depend on
        the population's shape: a step with them runs as one block).
      batch_size: random batch method (:mod:`cbo_jax.batching`, as CBXpy's
        ``batch_args``): the consensus of each step runs over a random batch of this many
        particles (``None``: all ``N``).
      batch_partial: with ``batch_size``, ``True`` moves only the batch's particles
        (CBXpy's default, "partial" update), ``False`` moves every particle toward the
        batch's consensus ("full" update).
      correction, correction_eps, schedule, resampling, max_evals, stagnation_patience,
        stagnation_tol: CBXpy's drift correction, schedules of other numbers,
        resampling and termination rules, shared by the whole CBX family
        (:class:`cbo_jax.dynamics.core.FamilyConfig`).
      particle_chunk: the rows per block of a step (:class:`~cbo_jax.dynamics.core.FamilyConfig`;
        default: chosen from ``N``).
    """

    # particle_chunk and every other setting: FamilyConfig


def cbo(objective: Callable[[PyTree], jax.Array], config: CBOConfig | None = None, **overrides: Any) -> Dynamics:
    """Build the CBO dynamics for ``objective``.

    Args:
      objective: maps a population (an ``(N, d)`` array or a stacked pytree) to the
        ``(N,)`` energies; every function of :mod:`cbo_jax.objectives` qualifies, and
        :func:`cbo_jax.population.per_agent` lifts a single-agent function.
      config: a :class:`CBOConfig`; keyword ``overrides`` replace its fields (or build
        one from defaults when ``config`` is ``None``).

    Returns a :class:`Dynamics` whose ``init``/``step`` act on one run. The numbers
    (λ1, σ1, λ2, σ2, dt, the α schedule's numbers) are read from ``state.params``
    (:mod:`cbo_jax.params`), so ``init(x0, key, params)`` with other numbers, or a whole
    grid of them through ``simulate(..., params=P)``, reuses the compiled step. A term
    whose config strength is ``0`` (``sigma1``, ``lambda2``, ``sigma2``) is left out.

    The step (Euler–Maruyama, FedCBO eq. (15); CBXpy's ``CBO``) is the kernel of
    :mod:`cbo_jax.dynamics.core`, which owns batches, clipping, best tracking, schedules,
    resampling and termination for the whole CBX family.
    """
    config = _checks.config_with("cbo", CBOConfig, config, overrides)
    return core.build(objective, config, cbo_kernel(objective, config))


def cbo_kernel(objective, config, name: str = "cbo") -> core.Kernel:
    """The CBO update as a :class:`~cbo_jax.dynamics.core.Kernel` (also CBS's).

    The update::

        x ← x - λ1 dt u + σ1 · noise(u) - λ2 dt ∇L + σ2 √dt |∇L| ξ~,   u = correction(x - m).
    """
    noise_off = config.noise_kind == "none"
    # Static zeros leave a term out entirely; otherwise the (traced) state value is used.
    strength = lambda prm, name: 0.0 if getattr(config, name) == 0 else getattr(prm, name)  # noqa: E731

    def update(x, grad, u, prm, key, noise, normal):
        """FedCBO eq. (15) for the rows ``x`` with the drift ``u`` (:func:`cbo_jax.sde.em_update`)."""
        return sde.em_update(key, x, u, dt=prm.dt, lambda1=prm.lambda1, sigma1=strength(prm, "sigma1"),
                             increment=None if noise_off else noise, grad=grad, lambda2=strength(prm, "lambda2"),
                             sigma2=strength(prm, "sigma2"), normal=normal)

    def move(ctx: core.Move):
        state = ctx.state
        u = ctx.correct(pop.tree_sub(state.x, ctx.m))
        return update(state.x, state.grad, u, ctx.prm, ctx.key, ctx.noise, ctx.normal), state.aux

    return core.Kernel(name=name, move=move, cov_of_drift=True)
