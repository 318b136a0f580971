"""The step core shared by every dynamic of the CBX family.

A dynamic of the family (CBO, CBOMemory, PSO, CBS, PolarCBO, AdamCBO, MirrorCBO, the
constrained variants; see :mod:`cbo_jax.dynamics.family`) is a small :class:`Kernel`:
how its consensus point is formed and how its particles move. Everything else lives
here once, the way CBXpy's ``CBXDynamic`` owns its pre- and post-step template:

1. the random batch of the step (:mod:`cbo_jax.batching`);
2. the consensus point (the kernel's, or the Gibbs-weighted mean of the particles);
3. the kernel's move, with the shared noise models (:func:`noise_term`) and drift
   corrections (:func:`correct`);
4. the partial batch update, clipping (``max_abs``), resampling
   (:mod:`cbo_jax.resampling`);
5. one evaluation of the objective at the new particles, which the kernel may absorb
   into a memory (CBOMemory, PSO);
6. the best-so-far tracker, the α schedule and the schedules of any other number
   (:mod:`cbo_jax.schedules`), the evaluation count;
7. termination: energy below ``energy_tol``, consensus settled (``diff_tol``), the
   evaluation budget (``max_evals``), energy stagnation (``stagnation_patience``); a
   stopped run's state is frozen.

Every state is a :class:`~cbo_jax.dynamics.cbo.CBOState`; what a dynamic adds (a
personal-best memory, velocities, Adam moments, a mirror variable) is its ``aux``
field, and the counters of the control machinery are ``ctrl``.

Conventions (documented and tested against CBXpy in ``tests/test_cbx_family.py``):

* **When the best particle is updated.** CBXpy evaluates the particles at the *start*
  of a step (for the consensus) and folds those energies into its best particle at the
  end of that step; here the objective is evaluated once, right after the move, and the
  tracker sees those energies at once. So after ``k`` steps cbo_jax's best is CBXpy's
  best after ``k + 1`` steps (the same set of evaluated particles). For CBOMemory and
  PSO both libraries track the best memory.
* **Evaluation counts** (``history["evals"]``) count objective evaluations actually
  made: ``N`` at ``init``, ``N`` per step (all particles, also with random batches),
  ``1`` per step for ``f(consensus)`` when a Heaviside correction or energy stagnation
  needs it (``N`` for PolarCBO's per-particle consensus). CBXpy additionally counts
  its ``check_f_dims`` probe (``N`` at construction) and, for CBO-type dynamics,
  evaluates at a step's start instead of ``init``: its CBO count after ``k`` steps equals
  this one; CBOMemory's and PSO's exceed it by ``N``. The count is an int32 and stays at
  ``2**31 - 1`` once it gets there (``N = 1e7`` particles after 215 steps) rather than
  wrapping round to negative numbers.
* **Order within a step** as in CBXpy: the consensus uses the current energies and α;
  the particles move; α is updated from the energies CBXpy holds after the step (the
  consensus energies; for CBOMemory and PSO the updated memory energies).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import batching
from cbo_jax import params as params_lib
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_point, log_consensus_weights
from cbo_jax.resampling import RESAMPLE_STREAM, Resampling

PRESTEP_STREAM = 0x70726573  # "pres": fold_in constant of a kernel's pre-step key
from cbo_jax.schedules import as_schedule
from cbo_jax.sde import per_particle_normal, normal_like

PyTree = Any

__all__ = ["FamilyConfig", "Kernel", "Move", "Ctrl", "build", "noise_term", "correct", "cov_sqrt", "weighted_cov",
           "FAMILY_NOISE", "CORRECTIONS", "RNG_MODES", "rng_layout", "with_rng_layout", "draw_normal", "record",
           "real_agents"]

FAMILY_NOISE = ("anisotropic", "isotropic", "constant", "covariance", "sampling", "none")
CORRECTIONS = ("none", "heaviside", "heaviside_reg")
RNG_MODES = ("fast", "partitionable", "per-particle")
SDE_NUMBERS = ("lambda1", "sigma1", "lambda2", "sigma2", "dt")


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
      rng: ``"fast"``, ``"partitionable"`` or ``"per-particle"`` (see
        :class:`~cbo_jax.CBOConfig`).
      batch_size, batch_partial: the random batch method (CBXpy's ``batch_args``).
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
    rng: str = "fast"
    batch_size: int | None = None
    batch_partial: bool = True
    correction: str = "none"
    correction_eps: float = 1e-3
    schedule: Any = None
    resampling: Any = None
    max_evals: int | None = None
    stagnation_patience: int | None = None
    stagnation_tol: float = 1e-9

    # Numbers of a dynamic beyond λ1, σ1, λ2, σ2, dt and α (Params.extra), and their rules.
    EXTRA_RULES: ClassVar[dict[str, Any]] = {}

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if self.batch_size is not None:
            set_("batch_size", _checks.positive_int("batch_size", self.batch_size))
        if not isinstance(self.batch_partial, (bool, np.bool_)):
            raise ValueError(f"batch_partial must be True or False, got {self.batch_partial!r}")
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
        return draw_normal(key, tree, self.ids, self.rng)


class Absorbed(NamedTuple):
    """What a kernel's ``absorb`` returns after the objective was evaluated at the new particles."""

    x: Any
    aux: Any
    energy: jax.Array
    best_points: Any
    best_energy: jax.Array
    alpha_energy: jax.Array


class ScheduleMap(dict):
    """A config's ``schedule``: a read-only dict ``{number: rule}`` with a hash, so that a
    config with a schedule, and dynamics built from it, can be a static argument of
    :func:`jax.jit` (a plain dict made the frozen config unhashable)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))

    def _read_only(self, *args, **kwargs):
        raise TypeError("a config's schedule is read-only: build a new config (dataclasses.replace)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only
    __ior__ = _read_only

    def __reduce__(self):  # pickles (and deep-copies) as itself, not through the refused __setitem__
        return (ScheduleMap, (dict(self),))


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


def in_set(image: Callable, x: jax.Array) -> jax.Array:
    """``(N,)`` booleans: the rows of ``x`` that equal ``image(x)`` to ``10 √ε`` of their dtype,
    relative to ``max(1, |x|_∞)`` (NaN rows are not in the set)."""
    gap = jnp.max(jnp.abs(image(x) - x), axis=-1) / jnp.maximum(1.0, jnp.max(jnp.abs(x), axis=-1))
    return gap <= 10 * jnp.sqrt(jnp.finfo(x.dtype).eps)


def energy_evaluator(objective, uses_gradient: bool):
    """``x -> (energies, ∇ of their sum or None)``: one evaluation (plus its gradient when needed)."""
    if not uses_gradient:
        return lambda x: (objective(x), None)

    def evaluate(x):
        def total(x):
            e = objective(x)
            return jnp.sum(e), e

        (_, e), g = jax.value_and_grad(total, has_aux=True)(x)
        return e, g

    return evaluate


def rng_layout(rng: str):
    """JAX's threefry layout that ``config.rng`` names: non-partitionable for ``"fast"`` and
    ``"per-particle"``, partitionable for ``"partitionable"``. A trace-time setting (the
    random draws traced inside the context keep it), so the dynamics' own functions enter it
    (:func:`with_rng_layout`) and ``config.rng`` holds however they are called."""
    return jax.threefry_partitionable(rng == "partitionable")


def with_rng_layout(rng: str, fn: Callable) -> Callable:
    """``fn`` run (traced) inside :func:`rng_layout` ``(rng)``."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with rng_layout(rng):
            return fn(*args, **kwargs)

    return wrapped


def draw_normal(key, tree, ids, rng: str):
    """Standard normals with the structure of ``tree``: the single draw function of the family.

    ``rng="per-particle"`` draws row ``i`` from ``fold_in(key, ids[i])``; the other modes
    one array per leaf (:func:`cbo_jax.sde.normal_like`).
    """
    if rng == "per-particle":
        return per_particle_normal(key, tree, ids)
    return normal_like(key, tree)


# ----------------------------------------------------------------------------------------
# Noise models and corrections
# ----------------------------------------------------------------------------------------


def weighted_cov(u: jax.Array, logw: jax.Array) -> jax.Array:
    """``Σ_j w_j u_j u_jᵀ`` for rows ``u`` (``(N, D)``) and log-weights ``(N,)`` (``-inf``: excluded)."""
    w = jnp.exp(logw).astype(u.dtype)
    u = jnp.where(jnp.isfinite(logw)[:, None] & jnp.all(jnp.isfinite(u), axis=1, keepdims=True), u, 0)
    return jnp.einsum("j,ja,jb->ab", w, u, u)


def cov_sqrt(c: jax.Array) -> jax.Array:
    """Symmetric square root of a positive semi-definite matrix (batched): ``V √max(Λ, 0) Vᵀ``."""
    lam, v = jnp.linalg.eigh(c)
    return jnp.einsum("...ab,...b,...cb->...ac", v, jnp.sqrt(jnp.maximum(lam, 0)), v)


def noise_term(kind, key, u, *, dt, alpha, normal, logw=None, mode: str = "sampling"):
    """The noise increment of one step before ``σ``: ``(scale, direction)``, increment = ``scale · direction``.

    ``u`` is the drift ``x_i - m`` (a population). Kinds (CBXpy's ``cbx.noise``):

    * ``"anisotropic"``: ``√dt · u_i ∘ ξ_i``;  ``"isotropic"``: ``√dt · |u_i| ξ_i``;
    * ``"constant"``: ``√dt · ξ_i``;
    * ``"covariance"``: ``√(2 dt / λ) · C^{1/2} ξ_i`` with ``C = Σ_j w_j u_j u_jᵀ`` (the
      consensus weights ``w``) and ``λ = 1/(1 + α)`` (``mode="sampling"``, CBXpy's default
      for every dynamic) or ``λ = 1`` (``mode="optimization"``, CBS); consensus-based
      sampling, Carrillo, Hoffmann, Stuart and Vaes (2022), eq. (1.4);
    * a callable ``kind(key, u, dt)``: its result (scale ``1``).
    """
    sqdt = jnp.sqrt(jnp.asarray(dt))
    if callable(kind):
        return 1.0, _callable_increment(kind(key, u, dt), u)
    if kind == "anisotropic":
        return sqdt, jax.tree_util.tree_map(jnp.multiply, u, normal(key, u))
    if kind == "isotropic":
        return sqdt, pop.tree_scale_rows(normal(key, u), pop.norms(u))
    if kind == "constant":
        return sqdt, normal(key, u)
    if kind in ("covariance", "sampling"):
        flat, unravel = pop.ravel(u)
        root = cov_sqrt(weighted_cov(flat, logw))
        z, _ = pop.ravel(normal(key, u))
        lam_inv = (1.0 + alpha) if mode == "sampling" else 1.0
        return jnp.sqrt(2.0 * dt * lam_inv), unravel(z @ root.T)
    raise ValueError(f"unknown noise model {kind!r}; choose from {FAMILY_NOISE} or pass a callable")


def _callable_increment(out, u):
    """A noise callable's increment, checked (while tracing) to be shaped like the drift ``u``: a
    ``(d,)`` or ``(N, 1)`` result would broadcast silently (one draw shared by every particle)."""
    want = jax.tree_util.tree_structure(u)
    try:
        leaves = want.flatten_up_to(out)
    except (TypeError, ValueError):
        raise ValueError(f"the noise callable must return an increment with the structure of the drift, {want}; "
                         f"got {jax.tree_util.tree_structure(out)}") from None
    for got, ref in zip(leaves, jax.tree_util.tree_leaves(u)):
        if np.shape(got) != np.shape(ref):
            raise ValueError(f"the noise callable returned shape {tuple(np.shape(got))} for a drift of shape "
                             f"{tuple(np.shape(ref))}: it must return one increment per particle, shaped like the "
                             "drift")
    return out


def correct(kind: str, u, energy, f_m, eps):
    """CBXpy's drift corrections: ``u_i · H(E_i - E(m))`` (``"heaviside"``) or
    ``u_i (1 + tanh((E_i - E(m))/ε))/2`` (``"heaviside_reg"``); ``f_m`` a scalar or per particle."""
    if kind == "none":
        return u
    z = energy - f_m
    if kind == "heaviside":
        factor = (z > 0).astype(energy.dtype)
    else:
        factor = 0.5 + 0.5 * jnp.tanh(z / eps)
    return pop.tree_scale_rows(u, factor)


def record(state) -> dict:
    """History of a family run: best/min energy, α, active flag, evaluations, scheduled numbers, resamplings.

    ``min_energy`` is the least energy of the current particles: ``state.energy``, or
    ``aux.x_energy`` where the state's energies are the memories' (CBOMemory, PSO).
    """
    current = getattr(state.aux, "x_energy", None)
    current = state.energy if current is None else current
    skip = jnp.isnan(current)
    if state.ctrl is not None and state.ctrl.agents is not None:  # a sharded run's padding rows
        skip = skip | (jnp.arange(current.shape[-1]) >= state.ctrl.agents[..., None])
    out = {
        "best_energy": state.best_energy,
        "min_energy": jnp.min(jnp.where(skip, jnp.inf, current), axis=-1),
        "alpha": state.alpha,
        "active": state.active,
    }
    if state.evals is not None:
        out["evals"] = state.evals
    ctrl = state.ctrl
    if ctrl is not None and ctrl.resamplings is not None:
        out["resamplings"] = ctrl.resamplings
    return out


def _best_row(energy, agents=None):
    # Finite energies only, as the consensus weights: a -inf (an objective unbounded below, or an
    # overflow) got weight zero in the consensus but was taken as the best point. Rows from
    # ``agents`` on are a sharded run's NaN padding: an objective that maps NaN to a number
    # (jnp.nansum, nan_to_num) gave them a finite energy, and a padding row became the best point.
    ok = jnp.isfinite(energy)
    if agents is not None:
        ok = ok & (jnp.arange(energy.shape[0]) < agents)
    return jnp.argmin(jnp.where(ok, energy, jnp.inf))


def _pick_row(tree, energy, row):
    # A one-hot reduction rather than an index: on a sharded agent axis an all-reduce of
    # one row, where `x[row]` makes XLA gather the whole population onto every device.
    # The sums keep each leaf's dtype: jnp.sum widens integers (int32 energies of a counting
    # objective become int64 under jax_enable_x64, which lax.scan's carry refuses).
    onehot = jnp.arange(energy.shape[0]) == row
    pick = lambda leaf: jnp.sum(jnp.where(onehot.reshape((-1,) + (1,) * (leaf.ndim - 1)), leaf, 0),  # noqa: E731
                                axis=0, dtype=leaf.dtype)
    return jax.tree_util.tree_map(pick, tree), jnp.sum(jnp.where(onehot, energy, 0), dtype=energy.dtype)


def _saturating_add(count, inc):
    """``count + inc`` in ``count``'s integer dtype, held at its largest value instead of wrapping
    round to negative numbers (an int32 count of ``N = 1e7`` particles passes 2**31 after 215 steps)."""
    top = jnp.iinfo(count.dtype).max
    inc = jnp.asarray(inc).astype(count.dtype)
    return jnp.where(count > top - inc, top, count + inc).astype(count.dtype)


def _same_dtypes(new, old):
    """``new``'s leaves cast to the dtypes of ``old``'s (same structure); a no-op where they agree."""
    if jax.tree_util.tree_structure(new) != jax.tree_util.tree_structure(old):
        return new
    return jax.tree_util.tree_map(lambda a, b: a if a.dtype == b.dtype else a.astype(b.dtype), new, old)


def real_agents(state, n):
    """The number of real (non-padding) agents of ``state``'s run (``n``: rows of the agent axis)."""
    ctrl = state.ctrl
    if ctrl is None or ctrl.agents is None:
        return jnp.asarray(n, jnp.int32)
    return ctrl.agents


def _add_agent_axis(m):
    return jax.tree_util.tree_map(lambda leaf: leaf[None], m)


# ----------------------------------------------------------------------------------------
# The step core
# ----------------------------------------------------------------------------------------


def build(objective: Callable, config: FamilyConfig, kernel: Kernel):
    """The :class:`~cbo_jax.dynamics.cbo.Dynamics` of ``kernel`` on ``objective`` with ``config``.

    ``init(x0, key, params=None)`` and ``step(state)`` act on one run (vmapped by
    :func:`cbo_jax.simulate`); ``drive(state, m)`` (global-consensus kernels) steps toward
    a given consensus point. The numbers are read from ``state.params``.
    """
    from cbo_jax.dynamics.cbo import CBOState, Dynamics, check_population as _check_pop

    dtype = jnp.dtype(config.dtype)
    schedule = config.alpha
    default_params = params_lib.defaults(config)
    rules = dict(config.schedule or {})
    noise_kind = config.noise if callable(config.noise) else config.noise_kind
    needs_logw = noise_kind == "covariance" and not kernel.per_particle_consensus
    corr = config.correction if kernel.corrects else "none"
    needs_fm = corr != "none" or config.stagnation_patience is not None
    resampling = config.resampling
    cov_mode = getattr(config, "mode", "sampling")

    if not kernel.corrects and config.correction != "none":
        raise ValueError(f"{kernel.name}: correction={config.correction!r} is not available for this dynamic "
                         "(CBXpy applies drift corrections in CBO, CBS, CBOMemory, PSO, PolarCBO and MirrorCBO)")

    evaluate = energy_evaluator(objective, config.uses_gradient)

    def energy_of_consensus(m):
        if kernel.per_particle_consensus:
            return objective(m)
        return objective(_add_agent_axis(m))[0]

    def consensus_of(state, in_batch):
        if kernel.consensus is not None:
            return kernel.consensus(state, in_batch)
        return consensus_point(state.x, state.energy, state.alpha, in_batch)

    def clip(x):
        if config.max_abs is None:
            return x
        c = config.max_abs
        return jax.tree_util.tree_map(lambda leaf: jnp.clip(jnp.nan_to_num(leaf, nan=c), -c, c), x)

    def init(x0: PyTree, key: jax.Array, params: params_lib.Params | None = None):
        _checks.x64_for(config)  # at trace time: a float64 run in 32-bit JAX was float32 throughout
        key = _checks.as_key("key", key)  # an integer seed (64 bits); anything but a key or a seed is refused
        x0 = jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype), x0)
        prm = params_lib.in_dtype(default_params if params is None else params_lib.as_params(params, config), dtype)
        energy, grad = evaluate(x0)
        n = energy.shape[0]
        # A population is finite (check_population); non-finite rows are a sharded run's padding.
        agents = jnp.sum(pop.tree_isfinite_rows(x0), dtype=jnp.int32)
        alpha = jnp.asarray(params_lib.alpha_init(schedule, prm.alpha), dtype)
        aux = None if kernel.init_aux is None else kernel.init_aux(x0, energy, prm)
        best_of = energy
        if kernel.admissible is not None:  # a start outside the set moves as given, but is no best point
            worst = jnp.inf if jnp.issubdtype(energy.dtype, jnp.floating) else jnp.iinfo(energy.dtype).max
            best_of = jnp.where(in_set(kernel.admissible, x0), energy, jnp.asarray(worst, energy.dtype))
        row = _best_row(best_of, agents)
        state = CBOState(
            x=x0, energy=energy, grad=grad, consensus=None, alpha=alpha, key=key,
            step=jnp.zeros((), jnp.int32),
            best_x=jax.tree_util.tree_map(lambda leaf: leaf[row], x0),
            best_energy=best_of[row], active=jnp.ones((), bool), params=prm,
            batch=None if config.batch_size is None else batching.init(n),
            in_batch=None if config.batch_size is None else jnp.ones((n,), bool),
            aux=aux, evals=agents, ctrl=None,
        )
        m = consensus_of(state, None)
        ctrl = Ctrl(
            stagnation=(None if config.stagnation_patience is None
                        else jnp.full((config.stagnation_patience,), jnp.inf, dtype)),
            resample=None if resampling is None else resampling.init(m, dtype),
            resamplings=None if resampling is None else jnp.zeros((), jnp.int32),
            agents=agents,
        )
        state = state._replace(consensus=m, ctrl=ctrl)
        if config.early_stop and config.max_evals is not None:  # CBXpy checks before the first step too
            state = state._replace(active=~over_budget(state, agents))
        return state

    def step_evals(agents):
        """Objective evaluations of one step besides a prestep's: the particles and ``E(m)`` where needed."""
        return agents + (0 if not needs_fm else agents if kernel.per_particle_consensus else 1)

    def over_budget(state, agents):
        """Whether the next step from ``state`` would take the run past ``max_evals``."""
        nxt = step_evals(agents)
        if kernel.prestep_evaluates is not None:
            nxt = nxt + jnp.where(kernel.prestep_evaluates(state), agents, 0)
        return state.evals > config.max_evals - nxt  # not evals + nxt: that wraps round near 2**31

    def _step(state0, m_given):
        state = state0
        prm = state.params
        n = state.energy.shape[0]
        batch, in_batch = state.batch, None
        if config.batch_size is not None:
            in_batch, batch = batching.next_batch(state.batch, state.key, config.batch_size)
        agents = real_agents(state, n)
        pre_evals = 0
        if kernel.prestep is not None:
            state, evaluated = kernel.prestep(state, jax.random.fold_in(state.key, PRESTEP_STREAM))
            pre_evals = jnp.where(evaluated, agents, 0)
        m = consensus_of(state, in_batch) if m_given is None else m_given
        key, sub = jax.random.split(state.key)
        f_m = None
        if needs_fm:
            f_m = energy_of_consensus(m)
        ids = jnp.arange(n, dtype=jnp.int32)
        ctrl = state.ctrl
        if kernel.advance is not None:
            x, energy, grad = kernel.advance(state, m, sub, in_batch)
            aux = state.aux
        else:
            logw = None
            if needs_logw:
                if kernel.cov_weights is not None:
                    logw = kernel.cov_weights(state, in_batch)
                else:
                    ok = pop.tree_isfinite_rows(state.x)
                    logw = log_consensus_weights(state.energy, state.alpha, ok if in_batch is None else ok & in_batch)

            def noise(k, u, prm=prm, logw=logw):
                return noise_term(config.noise if callable(config.noise) else noise_kind, k, u, dt=prm.dt,
                                  alpha=state.alpha, logw=logw, mode=cov_mode,
                                  normal=lambda kk, t: draw_normal(kk, t, ids, config.rng))

            def correct_(u, f_m=f_m):
                return correct(corr, u, state.energy, f_m, config.correction_eps)

            ctx = Move(state=state, m=m, key=sub, prm=prm, logw=logw, in_batch=in_batch, f_m=f_m, noise=noise,
                       correct=correct_, ids=ids, rng=config.rng)
            x, aux = kernel.move(ctx)
            # The particles keep their dtype: an objective that returns wider energies than the
            # config's dtype (float64 under jax_enable_x64 with dtype="float32") must not widen
            # the particles through a kernel's weights (PolarCBO) or step count (AdamCBO).
            x = _same_dtypes(x, state.x)
            aux = _same_dtypes(aux, state.aux)
            x = clip(x)
            if in_batch is not None and config.batch_partial:  # only the batch's particles move
                x = pop.tree_where_rows(in_batch, x, state.x)
                if kernel.aux_rows:
                    aux = aux._replace(**{f: pop.tree_where_rows(in_batch, getattr(aux, f), getattr(state.aux, f))
                                          for f in kernel.aux_rows})
            if resampling is not None:
                fire, trig = resampling.check(ctrl.resample, consensus=m, best_energy=state.best_energy)
                k_r = jax.random.fold_in(sub, RESAMPLE_STREAM)
                sigma_r = jnp.asarray(resampling.sigma, dtype) * jnp.sqrt(prm.dt)
                # A cond (not a select) so that an un-jitted step draws only when it fires.
                x = jax.lax.cond(fire, lambda x: jax.tree_util.tree_map(
                    lambda a, z: a + sigma_r * z, x, draw_normal(k_r, x, ids, config.rng)), lambda x: x, x)
                if resampling.tracks_update_norm:  # over the real agents (not a sharded run's NaN padding)
                    real = ids < agents
                    sq = sum(jnp.sum(jnp.where(real.reshape((-1,) + (1,) * (a.ndim - 1)), (a - b) ** 2, 0))
                             for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(state.x)))
                    trig = resampling.after_move(trig, jnp.sqrt(sq) / agents.astype(sq.dtype))
                ctrl = ctrl._replace(resample=trig, resamplings=ctrl.resamplings + fire.astype(jnp.int32))
            energy, grad = evaluate(x)
        if kernel.absorb is not None:
            a = kernel.absorb(state, x, aux, energy)
        else:
            a = Absorbed(x, aux, energy, x, energy, state.energy)
        return finish(state, state0, a, grad, m, key, batch, in_batch, f_m, ctrl, step_evals(agents), pre_evals)

    def finish(state, state0, a: Absorbed, grad, m, key, batch, in_batch, f_m, ctrl, evals, pre_evals):
        prm = state.params
        agents = real_agents(state, a.best_energy.shape[0])
        pts, e_row = _pick_row(a.best_points, a.best_energy, _best_row(a.best_energy, agents))
        improved = jnp.isfinite(e_row) & (e_row < state.best_energy)
        best_x = jax.tree_util.tree_map(lambda new, old: jnp.where(improved, new, old), pts, state.best_x)
        best_energy = jnp.where(improved, e_row, state.best_energy)
        alpha = params_lib.alpha_update(schedule, state.alpha, a.alpha_energy, prm.alpha, in_batch).astype(dtype)
        for name, rule in rules.items():  # schedules of the other numbers (CBXpy's scheduler list)
            if name in SDE_NUMBERS:
                prm = prm._replace(**{name: jnp.asarray(rule.update(getattr(prm, name), a.alpha_energy), dtype)})
            else:
                prm = prm._replace(extra=prm.extra._replace(
                    **{name: jnp.asarray(rule.update(getattr(prm.extra, name), a.alpha_energy), dtype)}))
        stop = jnp.zeros((), bool)
        if config.stagnation_patience is not None:
            f_stag = jnp.min(f_m) if kernel.per_particle_consensus else f_m
            buf = ctrl.stagnation.at[state.step % config.stagnation_patience].set(f_stag.astype(dtype))
            ctrl = ctrl._replace(stagnation=buf)
            stop = stop | (jnp.std(buf) < config.stagnation_tol)
        new_evals = _saturating_add(state.evals, jnp.asarray(evals, jnp.int32) + jnp.asarray(pre_evals, jnp.int32))
        new = state._replace(
            x=a.x, energy=a.energy, grad=grad, consensus=m, alpha=alpha, key=key, step=state.step + 1,
            best_x=best_x, best_energy=best_energy, params=prm, batch=batch, in_batch=in_batch, aux=a.aux,
            evals=new_evals, ctrl=ctrl,
        )
        if not config.early_stop:
            return new
        if config.energy_tol is not None:
            stop = stop | (best_energy <= config.energy_tol)
        if config.diff_tol is not None:
            sq = sum(jnp.sum((u - v) ** 2) for u, v in zip(jax.tree_util.tree_leaves(m),
                                                           jax.tree_util.tree_leaves(state.consensus)))
            stop = stop | ((state.step > 0) & (jnp.sqrt(sq) < config.diff_tol))
        if config.max_evals is not None:
            stop = stop | over_budget(new, real_agents(new, a.energy.shape[0]))
        new = new._replace(active=~stop)
        # A stopped run keeps its state exactly (including its key and step count).
        return jax.tree_util.tree_map(lambda u, v: jnp.where(state0.active, u, v), new, state0)

    def step(state):
        return _step(state, None)

    def drive(state, m):
        """One step toward the given consensus point ``m`` instead of the particles' own,
        with exactly the noise (and random batch) :func:`step` would use."""
        return _step(state, jax.tree_util.tree_map(lambda v, x: jnp.asarray(v, x.dtype), m, state.consensus))

    def check(name, x0, num_runs=None):
        extra = None
        if kernel.check is not None:
            def extra(single, n):
                kernel.check(jax.tree_util.tree_map(np.asarray, single), n, config)
        # ∇L of an objective that counts: JAX's grad refuses integer outputs (named with the terms)
        gradient = f"lambda2={config.lambda2}, sigma2={config.sigma2}" if config.uses_gradient else ""
        return _check_pop(name, x0, objective, num_runs, extra, gradient=gradient)

    # config.rng holds for a step jitted or called by hand as in simulate, whatever JAX's global layout
    init, step, drive = (with_rng_layout(config.rng, fn) for fn in (init, step, drive))
    return Dynamics(init=init, step=step, config=config, objective=objective, check=check, record=record,
                    drive=None if kernel.per_particle_consensus else drive)


def require_array(name: str, x0, what: str) -> int:
    """Host check: ``x0`` (one run) is an ``(N, d)`` array, as ``what`` needs; returns ``d``."""
    if not isinstance(x0, (np.ndarray, jax.Array)) or np.ndim(x0) != 2:
        raise ValueError(f"{name}: {what} needs an (N, d) array population, got "
                         f"{type(x0).__name__} of shape {np.shape(x0) if hasattr(x0, 'shape') else '?'}; "
                         "flatten a pytree population with cbo_jax.population.ravel")
    return int(np.shape(x0)[1])


def host_eval(what: str, fn, x0, name: str = "x0", dtype=np.float64):
    """Evaluate ``fn`` on the host population ``x0`` (eagerly, before any simulation is compiled).

    A failure inside ``fn`` (a map, constraint or surface built for another dimension: a
    reshape, broadcasting or ``dot_general`` error) is re-raised as a ``ValueError`` that names
    ``what`` and the particles' shape."""
    try:
        with jax.ensure_compile_time_eval():
            return np.asarray(fn(jnp.asarray(np.asarray(x0), jax.dtypes.canonicalize_dtype(dtype))))
    except Exception as err:  # noqa: BLE001 - re-raised with context
        shape = tuple(np.shape(x0))
        raise ValueError(f"{what} failed on {name} of shape {shape} (particles in d = {shape[-1]}); was it built "
                         f"for another dimension? {type(err).__name__}: {err}") from err


def check_values(what: str, values, shape) -> None:
    """Raise unless ``values`` has ``shape`` and only finite entries (host side)."""
    values = np.asarray(values)
    if values.shape != tuple(shape):
        raise ValueError(f"{what} returned shape {values.shape} at the initial particles; expected {tuple(shape)}")
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{what} returned a non-finite value (NaN or inf) at the initial particles "
                         f"(first at particle {row}): check its domain")

