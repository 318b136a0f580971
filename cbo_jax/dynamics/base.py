"""What every particle system of the package shares: its settings, its state, and the
contract between a dynamic and the step engine (:mod:`cbo_jax.dynamics.core`).

* :class:`FamilyConfig`: the settings of every dynamic of the CBX family, validated once,
  on construction (each dynamic's config adds its own numbers).
* :class:`CBOState`: the state of one run. Its fields are the same for every dynamic;
  what a dynamic keeps besides the particles is its ``aux`` (a named tuple of its own:
  CBOMemory's :class:`~cbo_jax.dynamics.memory.MemoryAux`, PSO's
  :class:`~cbo_jax.dynamics.pso.PSOAux`, AdamCBO's :class:`~cbo_jax.dynamics.adam.AdamAux`,
  MirrorCBO's :class:`~cbo_jax.dynamics.mirror.MirrorAux`; ``None`` for the others), and
  the control machinery's counters are its ``ctrl`` (:class:`Ctrl`).
* :class:`Dynamics`: a particle system as a pure ``(init, step)`` pair, what
  :func:`cbo_jax.simulate` runs.
* :class:`Kernel`: the parts of a dynamic that differ from plain CBO, and :class:`Move`,
  what the engine hands a kernel's ``move``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import numpy as np

from cbo_jax import _checks
from cbo_jax.resampling import Resampling
from cbo_jax.schedules import as_schedule
from cbo_jax import sde
from cbo_jax.sde import FAMILY_NOISE

PyTree = Any

__all__ = ["FamilyConfig", "ScheduleMap", "CBOState", "Dynamics", "Particles", "check_batch", "MemoryAux", "PSOAux", "AdamAux", "MirrorAux", "Ctrl", "Move", "Absorbed", "Kernel",
           "FAMILY_NOISE", "CORRECTIONS", "RNG_MODES", "SDE_NUMBERS"]

CORRECTIONS = ("none", "heaviside", "heaviside_reg")
RNG_MODES = ("counter", "fast", "partitionable", "per-particle")
SDE_NUMBERS = ("lambda1", "sigma1", "lambda2", "sigma2", "dt")


def check_batch(config) -> None:
    """The random batch method's settings (``batch_size``, ``batch_partial``) of any config."""
    if config.batch_size is not None:
        object.__setattr__(config, "batch_size", _checks.positive_int("batch_size", config.batch_size))
    if not isinstance(config.batch_partial, (bool, np.bool_)):
        raise ValueError(f"batch_partial must be True or False, got {config.batch_partial!r}")


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
    """Settings every dynamic of the CBX family shares, validated on construction.

    Attributes:
      lambda1: consensus drift ``λ1 >= 0`` (CBXpy's ``lamda``).
      sigma1: noise strength ``σ1 >= 0`` (CBXpy's ``sigma``).
      dt: time step ``> 0``.
      alpha: α: a number ``>= 0`` or a schedule (:mod:`cbo_jax.schedules`).
      noise: ``"anisotropic"`` (``√dt (x - m) ∘ ξ``), ``"isotropic"`` (``√dt |x - m| ξ``),
        ``"constant"`` (``√dt ξ``), ``"covariance"`` (alias ``"sampling"``:
        ``√(2 dt (1 + α)) C^{1/2} ξ``, ``C`` the Gibbs-weighted covariance of the drifts,
        CBXpy's ``covariance_noise``), ``"none"``, or a callable
        ``noise(key, drift, dt) -> array like drift``: the increment that ``σ1``
        multiplies (CBXpy's noise callables, which take the dynamic instead).
      lambda2, sigma2: gradient drift and gradient noise (only :func:`~cbo_jax.cbo`
        has them; ``0`` elsewhere).
      correction: CBXpy's drift correction: ``"none"``, ``"heaviside"`` (the drift
        ``x_i - m`` only where ``E(x_i) > E(m)``) or ``"heaviside_reg"`` (weighted by
        ``(1 + tanh((E(x_i) - E(m)) / correction_eps)) / 2``).
      correction_eps: ``ε > 0`` of ``"heaviside_reg"``.
      schedule: ``{name: rule}``: other numbers that change every step, e.g.
        ``{"sigma1": schedules.Multiply(0.99)}`` (names: ``lambda1``, ``sigma1``,
        ``dt`` or a dynamic's own numbers); composable with
        :class:`~cbo_jax.schedules.Chain`.
      resampling: a :class:`cbo_jax.resampling.Resampling`, or ``None``.
      energy_tol: stop a run once its best energy is ``<= energy_tol``.
      diff_tol: stop a run once its consensus point moves by less than ``diff_tol`` in one
        step (the Euclidean norm over all coordinates, from the second step on; CBXpy's
        ``diff_tol`` measures the particles' update ``|x - x_old|_F / N`` instead).
      max_evals: stop a run before a step would take it past this many objective
        evaluations (CBXpy's ``max_eval`` termination, checked before every step as
        CBXpy does): a step is taken only if the evaluations counted so far plus that
        step's (its particles, ``E(m)`` where needed, and a pre-step's re-evaluation,
        DriftConstrainedCBO's independent noise, when it will fire) stay
        ``<= max_evals``. The ``N`` evaluations of ``init`` are always made; a budget below
        them plus one step's (``2 N`` for plain CBO) takes no step at all.
      stagnation_patience, stagnation_tol: stop a run once the standard deviation of
        ``E(m)`` over the last ``stagnation_patience`` steps is below ``stagnation_tol``
        (CBXpy's ``energy_stagnation``; default tolerance ``1e-9``).
      max_abs: clip coordinates to ``[-max_abs, max_abs]`` after each step (NaN
        becomes ``max_abs``), CBXpy's default post-processing at ``1e8``. ``None``: off.
      dtype: ``"float32"`` or ``"float64"``.
      rng: ``"counter"`` (default), ``"per-particle"``, ``"fast"`` or ``"partitionable"`` (see
        :class:`~cbo_jax.CBOConfig`).
      batch_size, batch_partial: the random batch method (CBXpy's ``batch_args``).
      particle_chunk: the rows per block of a step (``None``: chosen from ``N``,
        :func:`~cbo_jax.dynamics.core.auto_block_rows`; all rows up to ``2**17``). A step in
        blocks moves, draws the noise of, evaluates and writes back one block at a time, in
        place, so that besides its state a step holds one block's temporaries; with the
        ``"counter"`` and ``"per-particle"`` noise layouts its numbers are those of the
        unblocked step up to float rounding (the consensus is summed block by block).
    """

    lambda1: float = 1.0
    sigma1: float = 1.0
    dt: float = 0.01
    alpha: Any = 1.0
    noise: Any = "anisotropic"
    lambda2: float = 0.0
    sigma2: float = 0.0
    energy_tol: float | None = None
    diff_tol: float | None = None
    max_abs: float | None = None
    dtype: str = "float32"
    rng: str = "counter"
    batch_size: int | None = None
    batch_partial: bool = True
    correction: str = "none"
    correction_eps: float = 1e-3
    schedule: Any = None
    resampling: Any = None
    max_evals: int | None = None
    stagnation_patience: int | None = None
    stagnation_tol: float = 1e-9
    particle_chunk: int | None = None

    # Numbers of a dynamic beyond λ1, σ1, λ2, σ2, dt and α (Params.extra), and their rules.
    EXTRA_RULES: ClassVar[dict[str, Any]] = {}

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        check_batch(self)
        for name in ("lambda1", "sigma1", "lambda2", "sigma2"):
            set_(name, _checks.non_negative(name, getattr(self, name)))
        set_("dt", _checks.positive("dt", self.dt))
        set_("alpha", as_schedule(self.alpha))
        if not callable(self.noise):
            _checks.one_of("noise", self.noise, FAMILY_NOISE)
        _checks.one_of("dtype", self.dtype, ("float32", "float64"))
        _checks.one_of("rng", self.rng, RNG_MODES)
        _checks.one_of("correction", self.correction, CORRECTIONS)
        set_("correction_eps", _checks.positive("correction_eps", self.correction_eps))
        for name in ("energy_tol", "diff_tol"):
            if getattr(self, name) is not None:
                set_(name, _checks.finite_number(name, getattr(self, name)))
        if self.diff_tol is not None and self.diff_tol < 0:
            raise ValueError(f"diff_tol must be >= 0, got {self.diff_tol}")
        if self.max_abs is not None:
            set_("max_abs", _checks.positive("max_abs", self.max_abs))
        if self.max_evals is not None:
            v = _checks.positive_int("max_evals", self.max_evals)
            if v > 2**31 - 1:
                raise ValueError(f"max_evals must be < 2**31 (the count is an int32), got {v}")
        if self.stagnation_patience is not None:
            _checks.positive_int("stagnation_patience", self.stagnation_patience)
            if self.stagnation_patience < 2:
                raise ValueError("stagnation_patience must be >= 2 (a standard deviation of one value is 0)")
        set_("stagnation_tol", _checks.non_negative("stagnation_tol", self.stagnation_tol))
        if self.particle_chunk is not None:
            set_("particle_chunk", _checks.positive_int("particle_chunk", self.particle_chunk))
        if self.resampling is not None and not isinstance(self.resampling, Resampling):
            raise ValueError(f"resampling must be a cbo_jax.resampling.Resampling, got {self.resampling!r}")
        if self.schedule is not None:
            if not isinstance(self.schedule, dict):
                raise ValueError(f"schedule must be a dict {{name: rule}}, got {self.schedule!r}")
            extra = self.extra_params()
            valid = list(SDE_NUMBERS) + ([] if extra is None else list(extra._fields))
            for name, rule in self.schedule.items():
                if name == "alpha":
                    raise ValueError("schedule: α has its own schedule; pass it as alpha=... (for example "
                                     "alpha=schedules.Chain(...))")
                if name not in valid:
                    raise ValueError(f"schedule: unknown number {name!r}; valid: {valid}")
                if not hasattr(rule, "update"):
                    raise ValueError(f"schedule[{name!r}] is not a rule (it needs update(value, energy))")
            set_("schedule", ScheduleMap(self.schedule))
        _checks.fits_dtype(self)

    def extra_params(self):
        """This dynamic's own numbers as a named tuple (``None``: it has none)."""
        return None

    @property
    def uses_gradient(self) -> bool:
        return self.lambda2 > 0 or self.sigma2 > 0

    @property
    def early_stop(self) -> bool:
        return (self.energy_tol is not None or self.diff_tol is not None or self.max_evals is not None
                or self.stagnation_patience is not None)

    @property
    def noise_kind(self) -> str:
        """The noise model's name (``"covariance"`` for ``"sampling"``, ``"callable"`` for a function)."""
        if callable(self.noise):
            return "callable"
        return "covariance" if self.noise == "sampling" else self.noise


class ScheduleMap(dict):
    """A config's ``schedule``: a read-only dict ``{number: rule}`` with a hash, so that a
    config with a schedule, and dynamics built from it, can be a static argument of
    :func:`jax.jit` (a plain dict would make the frozen config unhashable)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def _read_only(self, *args, **kwargs):
        raise TypeError("a config's schedule is read-only: build a new config (dataclasses.replace)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __reduce__(self):  # pickles (and deep-copies) as itself, not through the refused __setitem__
        return (ScheduleMap, (dict(self),))


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
      aux: what a dynamic keeps besides the particles: CBOMemory's :class:`MemoryAux` (memory
        points), PSO's :class:`PSOAux` (memories and velocities), AdamCBO's :class:`AdamAux`
        (moments), MirrorCBO's :class:`MirrorAux` (dual variables); ``None`` for the others.
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
    aux: MemoryAux | PSOAux | AdamAux | MirrorAux | None = None
    evals: Any = None
    ctrl: Ctrl | None = None


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


class Ctrl(NamedTuple):
    """Counters of the control machinery (``CBOState.ctrl``).

    Attributes:
      stagnation: ``(patience,)`` ring buffer of ``E(m)`` (``inf`` before it fills), or ``None``.
      resample: the resampling triggers' states, or ``None``.
      resamplings: int32 number of resamplings of this run so far, or ``None``.
      agents: int32 number of real agents: the rows finite at ``init``; the rows after
        them are the NaN padding of a sharded run (:mod:`cbo_jax.sharding`), which the
        evaluation count and the update norm leave out. ``None``: every row.
    """

    stagnation: Any = None
    resample: Any = None
    resamplings: Any = None
    agents: Any = None


class Move(NamedTuple):
    """What the core hands a kernel's ``move`` for one step.

    Attributes:
      state: the state before the step.
      m: the consensus point (no agent axis; PolarCBO: one per particle).
      key: this step's PRNG key for the kernel's draws (use :meth:`normal`, which the
        step-by-step tests against CBXpy intercept).
      prm: the numbers of this run (:class:`~cbo_jax.params.Params`).
      logw: ``(N,)`` consensus log-weights (only when the covariance noise needs them).
      in_batch: this step's batch mask, or ``None``.
      f_m: ``E(m)`` when a correction or stagnation needs it, else ``None``.
      noise: ``noise(key, drift) -> increment``: the configured noise model, ``σ1`` not
        applied (:func:`noise_term`).
      correct: ``correct(drift) -> drift``: the configured drift correction.
      ids: ``(N,)`` particle ids (per-particle random streams).
    """

    state: Any
    m: Any
    key: jax.Array
    prm: Any
    logw: Any
    in_batch: Any
    f_m: Any
    noise: Callable
    correct: Callable
    ids: Any
    rng: str

    def normal(self, key, tree):
        """Standard normals shaped like ``tree`` from ``key`` (the family's one draw function)."""
        return sde.draw_normal(key, tree, self.ids, self.rng)


class Absorbed(NamedTuple):
    """What a kernel's ``absorb`` returns after the objective was evaluated at the new particles."""

    x: Any
    aux: Any
    energy: jax.Array
    best_points: Any
    best_energy: jax.Array
    alpha_energy: jax.Array


class Kernel(NamedTuple):
    """A dynamic of the family: the parts that differ from plain CBO.

    Attributes:
      name: the dynamic's name (``"pso"``, ...).
      move: ``move(ctx: Move) -> (x, aux)``: the new positions (and auxiliary state).
      init_aux: ``init_aux(x0, energy, prm) -> aux`` (default ``None``).
      consensus: ``consensus(state, in_batch) -> m`` (default: the Gibbs mean of
        ``state.x`` with ``state.energy``, :func:`cbo_jax.consensus.consensus_point`).
      absorb: ``absorb(state, x, aux, energy) -> Absorbed`` after the evaluation (default:
        the particles and their energies are the state; the α schedule sees the
        consensus energies).
      check: host-side ``check(x0_one_run, n, config)`` before compilation (raise ``ValueError``).
      aux_rows: names of ``aux`` fields with an agent axis (kept for particles outside
        a partial batch).
      per_particle_consensus: the consensus has an agent axis (PolarCBO).
      corrects: whether the kernel applies ``correction`` (CBXpy has it for CBO, CBS,
        CBOMemory, PSO, PolarCBO, MirrorCBO).
      cov_weights: ``cov_weights(state, in_batch) -> logw`` for the covariance noise
        (default: the consensus log-weights of ``state.energy``).
      advance: optional ``advance(state, m, key, in_batch) -> (x, energy, grad)`` that
        replaces move, clip and evaluation (CBO's chunked large-N path).
      prestep: optional ``prestep(state, key) -> (state, evaluated)`` run before the consensus
        (DriftConstrainedCBO's independent noise); ``evaluated``: whether it re-evaluated the
        objective at every particle (counted as the run's real agents).
      prestep_evaluates: ``prestep_evaluates(state) -> bool``: whether the prestep of a step
        from ``state`` will re-evaluate (the ``max_evals`` budget looks one step ahead).
      consensus_points: optional ``consensus_points(state) -> points``: the points whose Gibbs
        mean with ``state.energy`` is the consensus (CBOMemory, PSO: the memories), where a step
        in blocks computes it as a streaming reduction (:meth:`~cbo_jax.dynamics.core.Engine.blocked`).
      cov_of_drift: the covariance noise's drift is the corrected consensus drift
        ``correct(x - m)`` (CBO, CBS): a step in blocks computes its matrix in a pass before the move.
      admissible: optional ``image(x)`` for dynamics whose particles live in a set (a
        surface's projection, ``∇φ*(∇φ(x))`` of a mirror map): the particles start as given
        (as in CBXpy), but the best tracker counts only the initial ones that equal their
        image within rounding (:func:`in_set`); the moved particles are in the set.
    """

    name: str
    move: Callable
    init_aux: Callable | None = None
    consensus: Callable | None = None
    absorb: Callable | None = None
    check: Callable | None = None
    aux_rows: tuple = ()
    per_particle_consensus: bool = False
    corrects: bool = True
    cov_weights: Callable | None = None
    advance: Callable | None = None
    prestep: Callable | None = None
    prestep_evaluates: Callable | None = None
    admissible: Callable | None = None
    consensus_points: Callable | None = None
    cov_of_drift: bool = False


class Particles(NamedTuple):
    """An initial population with its per-particle attributes (see :func:`particles`).

    Attributes:
      x: positions, ``(N, d)`` or a stacked pytree.
      label: ``(N,)`` int32 class of each particle, in ``[0, K)``: which ``L_k`` it follows.
      malicious: ``(N,)`` bool; malicious particles follow :class:`Malicious`.
      pid: ``(N,)`` int32 particle ids (the noise stream of ``rng="per-particle"``).
    """

    x: PyTree
    label: jax.Array
    malicious: jax.Array
    pid: jax.Array | np.ndarray  # NumPy ids after host-side padding (sharding.prepare_population)


# What a dynamic keeps besides its particles (``CBOState.aux``).


class MemoryAux(NamedTuple):
    """``y``: the personal-best memory of every particle (a population like ``x``);
    ``x_energy``: the energies of the current positions ``x`` (``state.energy`` holds the
    memories' energies), the history's ``min_energy``."""

    y: Any
    x_energy: Any


class PSOAux(NamedTuple):
    """``y``: personal-best memories; ``v``: velocities (populations like ``x``);
    ``x_energy``: the energies of the current positions (``state.energy`` holds the
    memories'), the history's ``min_energy``."""

    y: Any
    v: Any
    x_energy: Any


class AdamAux(NamedTuple):
    """First and second moment estimates (populations like ``x``)."""

    m: Any
    v: Any


class MirrorAux(NamedTuple):
    """``y``: the dual variables ``∇φ(x)``."""

    y: Any
