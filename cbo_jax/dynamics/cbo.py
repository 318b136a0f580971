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
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.consensus import streaming_consensus_point
from cbo_jax.dynamics import core
from cbo_jax.dynamics.core import FamilyConfig

PyTree = Any

__all__ = ["CBOConfig", "CBOState", "Dynamics", "cbo", "cbo_kernel"]

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
      rng: ``"fast"`` draws noise with JAX's non-partitionable threefry layout, about
        2.3x faster on CPU for one device; ``"partitionable"`` uses the layout that
        shards well across devices. Both are exact threefry2x32 streams.
        ``"per-particle"``: row ``i`` draws from ``fold_in(step_key, i)``, so a row's
        noise does not depend on the population size (a population padded for
        sharding moves exactly as the unpadded one); slower.
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
      particle_chunk: large ``N``: process the particles in chunks of this many (``N``
        must be a multiple): the consensus is a streaming reduction
        (:func:`cbo_jax.consensus.streaming_consensus_point`) and the move, noise draw and
        objective run chunk by chunk on buffers updated in place, so the memory of a step
        is about that of the particles themselves (``benchmarks/large_n.py``). With
        ``rng="per-particle"`` the result equals the unchunked run up to rounding; the
        other layouts draw chunk ``c``'s noise from ``fold_in(step_key, c)`` (another
        stream, the same distribution). Only with the anisotropic, isotropic or no noise,
        without correction or resampling.
    """

    particle_chunk: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.particle_chunk is not None:
            object.__setattr__(self, "particle_chunk", _checks.positive_int("particle_chunk", self.particle_chunk))
            if self.noise_kind not in ("anisotropic", "isotropic", "none") or self.correction != "none" or (
                    self.resampling is not None):
                raise ValueError("particle_chunk works with the anisotropic, isotropic or no noise, without a "
                                 "correction or resampling (they need the whole population at once)")


class CBOState(NamedTuple):
    """State of one run of any CBX-family dynamic (vmapped runs carry a leading run axis on every field).

    Attributes:
      x: particles, a population with ``N`` agents.
      energy: ``(N,)`` energies ``L(x_i)`` of the current particles (CBOMemory and PSO:
        of their memory points).
      grad: ``∇L(x_i)`` (same structure as ``x``) when gradient terms are on, else ``None``.
      consensus: the consensus point used by the last step (at ``init``: that of ``x0``).
      alpha: α for the next step.
      key: PRNG key for the next step.
      step: number of steps taken (frozen runs stop counting).
      best_x: best particle seen so far.
      best_energy: its energy.
      active: ``False`` once an early-stop criterion fired; the state is then frozen.
      params: the numbers of this run (:class:`cbo_jax.params.Params`: λ1, σ1, λ2, σ2, dt
        and the α schedule's numbers), traced, so runs with different numbers vmap.
      batch: the random batch method's :class:`cbo_jax.batching.BatchState`, or ``None``.
      in_batch: ``(N,)`` mask of the batch the last step used (all ``True`` at ``init``),
        or ``None`` without batches.
      aux: what a dynamic keeps besides the particles (CBOMemory's memory points, PSO's
        velocities, AdamCBO's moments, MirrorCBO's dual variable), or ``None``.
      evals: int32 number of objective evaluations so far, held at ``2**31 - 1`` once it
        gets there (see :mod:`cbo_jax.dynamics.core` for how it relates to CBXpy's
        ``num_f_eval``).
      ctrl: the control machinery's counters (:class:`cbo_jax.dynamics.core.Ctrl`).
    """

    x: PyTree
    energy: jax.Array
    grad: PyTree | None
    consensus: PyTree
    alpha: jax.Array
    key: jax.Array
    step: jax.Array
    best_x: PyTree
    best_energy: jax.Array
    active: jax.Array
    params: Any = None
    batch: Any = None
    in_batch: Any = None
    aux: Any = None
    evals: Any = None
    ctrl: Any = None


class Dynamics(NamedTuple):
    """A particle system as a pure pair plus what built it.

    ``init(x0, key) -> state`` and ``step(state) -> state`` for a single run; both are
    jittable and vmappable. The built-in systems also take ``init(x0, key, params)``
    with a :class:`cbo_jax.params.Params` (the numbers, traced; default: the config's). ``objective`` maps a population to ``(N,)`` energies.
    ``check(name, x0, num_runs) -> N`` validates an initial population on the host
    before compilation (default :func:`check_population` with ``objective``), and
    ``record(state) -> dict`` gives the per-step history :func:`cbo_jax.simulate`
    keeps (default: best/min energy, α, active flag of a :class:`CBOState`).
    ``drive(state, m) -> state``, where given, is one step toward a given consensus
    point ``m`` instead of the particles' own, with the same noise as ``step``: the
    mean-field copies of :func:`cbo_jax.meanfield.coupling` (FedCBO JMLR eq. (50)).
    """

    init: Callable[[PyTree, jax.Array], Any]
    step: Callable[[Any], Any]
    config: Any
    objective: Callable[[PyTree], jax.Array]
    check: Callable[..., int] | None = None
    record: Callable[[Any], dict] | None = None
    drive: Callable[[Any, PyTree], Any] | None = None

    def __repr__(self) -> str:  # what built it; not its functions' addresses
        objective = getattr(self.objective, "__qualname__", None) or repr(self.objective)
        return f"Dynamics(objective={objective}, config={self.config!r})"


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
    chunk = getattr(config, "particle_chunk", None)
    noise_off = config.noise_kind == "none"
    # Static zeros leave a term out entirely; otherwise the (traced) state value is used.
    strength = lambda prm, name: 0.0 if getattr(config, name) == 0 else getattr(prm, name)  # noqa: E731

    evaluate = core.energy_evaluator(objective, config.uses_gradient)

    def update(x, grad, u, prm, key, noise, normal):
        """FedCBO eq. (15) for the rows ``x`` with the drift ``u``."""
        lambda1, sigma1, dt = prm.lambda1, strength(prm, "sigma1"), prm.dt
        key_c, key_g = jax.random.split(key)
        if noise_off or (isinstance(sigma1, float) and sigma1 == 0):
            new = jax.tree_util.tree_map(lambda xi, ui: xi - (lambda1 * dt) * ui, x, u)
        else:
            scale, dz = noise(key_c, u)
            new = jax.tree_util.tree_map(lambda xi, ui, di: xi - (lambda1 * dt) * ui + (sigma1 * scale) * di, x, u, dz)
        if grad is not None:
            lambda2, sigma2 = strength(prm, "lambda2"), strength(prm, "sigma2")
            sqdt = jnp.sqrt(jnp.asarray(dt))
            new = jax.tree_util.tree_map(lambda ni, gi: ni - (lambda2 * dt) * gi, new, grad)
            if not (isinstance(sigma2, float) and sigma2 == 0):
                # σ2 |∇L| dB~ is isotropic by definition in eq. (4).
                z_g = normal(key_g, x)
                new = jax.tree_util.tree_map(lambda ni, di: ni + (sigma2 * sqdt) * di, new,
                                             pop.tree_scale_rows(z_g, pop.norms(grad)))
        return new

    def move(ctx: core.Move):
        state = ctx.state
        u = ctx.correct(pop.tree_sub(state.x, ctx.m))
        return update(state.x, state.grad, u, ctx.prm, ctx.key, ctx.noise, ctx.normal), state.aux

    def clip(x):
        if config.max_abs is None:
            return x
        c = config.max_abs
        return jax.tree_util.tree_map(lambda leaf: jnp.clip(jnp.nan_to_num(leaf, nan=c), -c, c), x)

    def consensus(state, in_batch):
        return streaming_consensus_point(state.x, state.energy, state.alpha, in_batch, chunk=chunk)

    def advance(state, m, sub, in_batch):
        """Large N: move, clip and evaluate chunk by chunk on buffers updated in place."""
        n = state.energy.shape[0]
        if n % chunk:
            raise ValueError(f"particle_chunk={chunk} must divide N={n}")

        def body(c, bufs):
            x_buf, e_buf, g_buf = bufs
            start = c * chunk
            rows = lambda tree: jax.tree_util.tree_map(  # noqa: E731
                lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, start, chunk, axis=0), tree)
            ids = start + jnp.arange(chunk, dtype=jnp.int32)
            # Fast layouts: chunk c draws from fold_in(sub, c); per-particle: from the ids.
            key_c = sub if config.rng == "per-particle" else jax.random.fold_in(sub, c)
            normal = lambda k, t: core.draw_normal(k, t, ids, config.rng)  # noqa: E731
            noise = lambda k, u: core.noise_term(config.noise_kind, k, u, dt=state.params.dt,  # noqa: E731
                                                 alpha=state.alpha, normal=normal)
            x_c = rows(x_buf)
            new = clip(update(x_c, None if g_buf is None else rows(g_buf), pop.tree_sub(x_c, m), state.params,
                              key_c, noise, normal))
            if in_batch is not None and config.batch_partial:  # only the batch's particles move
                new = pop.tree_where_rows(jax.lax.dynamic_slice_in_dim(in_batch, start, chunk), new, x_c)
            e_c, g_c = evaluate(new)
            put = lambda buf, v: jax.tree_util.tree_map(  # noqa: E731
                lambda b, w: jax.lax.dynamic_update_slice_in_dim(b, w, start, axis=0), buf, v)
            return put(x_buf, new), jax.lax.dynamic_update_slice_in_dim(e_buf, e_c, start, 0), (
                None if g_buf is None else put(g_buf, g_c))

        # The buffers are updated in place, chunk by chunk: no (N, d) temporary besides x.
        return jax.lax.fori_loop(0, n // chunk, body, (state.x, state.energy, state.grad))

    return core.Kernel(name=name, move=move, consensus=None if chunk is None else consensus,
                       advance=None if chunk is None else advance)


def _check_batch(config) -> None:
    if config.batch_size is not None:
        object.__setattr__(config, "batch_size", _checks.positive_int("batch_size", config.batch_size))
    if not isinstance(config.batch_partial, (bool, np.bool_)):
        raise ValueError(f"batch_partial must be True or False, got {config.batch_partial!r}")


def check_population(name: str, x0: PyTree, objective, num_runs: int | None = None, extra=None, *,
                     gradient: str = "") -> int:
    """Host-side checks before compilation; returns ``N``.

    ``x0`` must have a leading agent axis (after the run axis when ``num_runs`` is
    given), hold only finite values, and ``objective`` must map it to ``(N,)``.
    ``extra(single_run_x0, N)``, if given, runs after the checks of ``x0`` and before the
    objective is traced (a dynamic's own checks: mirror maps, constraints, ...).
    ``gradient``: the gradient terms' settings when the dynamics differentiate the
    objective (its energies must then be floats; see :func:`check_objective`).
    """
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(f"{name} has no array leaves")
    lead = 2 if num_runs is not None else 1
    for leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) < lead + (1 if isinstance(x0, (np.ndarray, jax.Array)) else 0):
            want = "(M, N, d)" if num_runs is not None else "(N, d)"
            hint = ""
            if isinstance(x0, (list, tuple)) and not shape:  # its numbers are a pytree's scalar leaves
                hint = (f": {name} is a Python {type(x0).__name__} of numbers, which JAX reads as a pytree of scalars; "
                        f"pass an array (np.asarray({name}))")
            raise ValueError(f"{name} must have shape {want} (or be a stacked pytree), got shape {shape}{hint}")
        if num_runs is not None and shape[0] != num_runs:
            raise ValueError(f"{name} has {shape[0]} runs on its leading axis, but num_runs={num_runs}")
    single = jax.tree_util.tree_map(lambda leaf: leaf[0], x0) if num_runs is not None else x0
    n = pop.num_agents(single)
    if n < 1:
        raise ValueError(f"{name} needs at least one particle (N >= 1), got N={n}")
    d = sum(math.prod(np.shape(leaf)[1:]) for leaf in jax.tree_util.tree_leaves(single))
    if d < 1:  # every step ran, on nothing: an objective of no coordinates, a "consensus" of empty points
        raise ValueError(f"{name} has no coordinates per particle (d = 0, shape "
                         f"{tuple(np.shape(leaves[0]))}); a particle needs at least one (d >= 1)")
    for path, leaf in jax.tree_util.tree_leaves_with_path(x0):  # strings failed in isfinite, complex lost its part
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            raise ValueError(f"{name}{jax.tree_util.keystr(path)} must hold real numbers (float or integer), got "
                             f"dtype {dtype}" + (": take the real part or split it into two real coordinates"
                                                 if jnp.issubdtype(dtype, jnp.complexfloating) else ""))
    _checks.all_finite(name, x0)
    if extra is not None:
        extra(single, n)
    try:
        check_objective(name, objective, single, n, gradient=gradient)
    except ValueError as err:
        if num_runs is None and isinstance(x0, (np.ndarray, jax.Array)) and np.ndim(x0) == 3:
            shape = tuple(np.shape(x0))
            raise ValueError(f"{err} ({name} has shape {shape}: if its leading axis holds {shape[0]} independent "
                             f"runs of {shape[1]} particles, pass num_runs={shape[0]})") from err
        raise
    return n


def check_objective(name: str, objective, single: PyTree, n: int, what: str = "objective", *,
                    gradient: str = "") -> None:
    """Trace ``objective`` on the shapes of one run's population ``single`` (``N = n``
    agents): it must run and return ``(n,)`` real (float or integer) energies; a clear ``ValueError``
    otherwise. ``gradient`` (the gradient terms' settings, when the dynamics have them): the
    energies must be floats, which ``jax.grad`` can differentiate."""
    try:
        out = jax.eval_shape(objective, jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.float32), single))
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise ValueError(f"{what} failed on a population shaped like {name}: {err}") from err
    if tuple(out.shape) != (n,):
        hint = ""
        one = _one_particle_shape(objective, single)
        if one == ():
            hint = (" It looks like an objective of ONE particle (it maps one particle to a scalar): lift it with "
                    "cbo_jax.population.per_agent(f) (cbo_jax.minimize does this by itself).")
        elif one is not None and len(one) > 0 and int(np.prod(one)) == 1:
            hint = (" On one particle it returns an array of one element, not a scalar: return a scalar (drop "
                    "keepdims=True, or end with .squeeze()) and it is taken as an objective of one particle, or "
                    "return one energy per row of the population.")
        raise ValueError(f"{what} must return one energy per particle, shape ({n},); got {tuple(out.shape)}."
                         + hint)
    if not (jnp.issubdtype(out.dtype, jnp.floating) or jnp.issubdtype(out.dtype, jnp.integer)):
        raise ValueError(f"{what} must return real energies (a float or integer array); got dtype {out.dtype}"
                         + (": take the real part or the modulus" if jnp.issubdtype(out.dtype, jnp.complexfloating)
                            else ": cast it to float (x.astype(float))"))
    if gradient and not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"{gradient}: the gradient terms differentiate the {what}, which returns {out.dtype} "
                         "energies; return floats (a differentiable objective), or build the dynamics without "
                         "gradient terms")


def _one_particle_shape(objective, population: PyTree) -> tuple[int, ...] | None:
    """The shape ``objective`` returns on one particle (one row of ``population``); ``None`` when it fails
    there."""
    row = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], jnp.float32), population)
    try:
        return tuple(jax.eval_shape(objective, row).shape)
    except Exception:  # noqa: BLE001 - any failure means "not an objective of one particle"
        return None


def looks_single_particle(objective, population: PyTree) -> bool:
    """Whether ``objective`` maps one particle (one row of ``population``) to a scalar."""
    return _one_particle_shape(objective, population) == ()
