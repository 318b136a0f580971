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
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import batching
from cbo_jax import params as params_lib
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_point, streaming_consensus_point
from cbo_jax.schedules import as_schedule
from cbo_jax.sde import NOISE_KINDS, euler_maruyama, normal_like, per_particle_normal

PyTree = Any

__all__ = ["CBOConfig", "CBOState", "Dynamics", "cbo"]

RNG_MODES = ("fast", "partitionable", "per-particle")


@dataclasses.dataclass(frozen=True)
class CBOConfig:
    """Parameters of the CBO dynamics, validated on construction.

    Attributes:
      lambda1: consensus drift strength ``λ1 >= 0``.
      sigma1: consensus noise strength ``σ1 >= 0``.
      dt: time step ``γ > 0``.
      alpha: inverse temperature: a number ``>= 0`` (constant) or a schedule from
        :mod:`cbo_jax.schedules`.
      noise: ``"anisotropic"`` (``σ1 (θ - m) ∘ dB``), ``"isotropic"`` (``σ1 |θ - m| dB``) or
        ``"none"``.
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
      particle_chunk: large ``N``: process the particles in chunks of this many (``N``
        must be a multiple): the consensus is a streaming reduction
        (:func:`cbo_jax.consensus.streaming_consensus_point`) and the move, noise draw and
        objective run chunk by chunk on buffers updated in place, so the memory of a step
        is about that of the particles themselves (``benchmarks/large_n.py``). With
        ``rng="per-particle"`` the result equals the unchunked run up to rounding; the
        other layouts draw chunk ``c``'s noise from ``fold_in(step_key, c)`` (another
        stream, the same distribution).
    """

    lambda1: float = 1.0
    sigma1: float = 1.0
    dt: float = 0.01
    alpha: Any = 1.0
    noise: str = "anisotropic"
    lambda2: float = 0.0
    sigma2: float = 0.0
    energy_tol: float | None = None
    diff_tol: float | None = None
    max_abs: float | None = None
    dtype: str = "float32"
    rng: str = "fast"
    batch_size: int | None = None
    batch_partial: bool = True
    particle_chunk: int | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        _check_batch(self)
        if self.particle_chunk is not None:
            set_("particle_chunk", _checks.positive_int("particle_chunk", self.particle_chunk))
        set_("lambda1", _checks.non_negative("lambda1", self.lambda1))
        set_("sigma1", _checks.non_negative("sigma1", self.sigma1))
        set_("dt", _checks.positive("dt", self.dt))
        set_("lambda2", _checks.non_negative("lambda2", self.lambda2))
        set_("sigma2", _checks.non_negative("sigma2", self.sigma2))
        set_("alpha", as_schedule(self.alpha))
        _checks.one_of("noise", self.noise, NOISE_KINDS)
        _checks.one_of("dtype", self.dtype, ("float32", "float64"))
        _checks.one_of("rng", self.rng, RNG_MODES)
        for name in ("energy_tol", "diff_tol"):
            if getattr(self, name) is not None:
                set_(name, _checks.finite_number(name, getattr(self, name)))
        if self.diff_tol is not None and self.diff_tol < 0:
            raise ValueError(f"diff_tol must be >= 0, got {self.diff_tol}")
        if self.max_abs is not None:
            set_("max_abs", _checks.positive("max_abs", self.max_abs))
        _checks.fits_dtype(self)

    @property
    def uses_gradient(self) -> bool:
        return self.lambda2 > 0 or self.sigma2 > 0

    @property
    def early_stop(self) -> bool:
        return self.energy_tol is not None or self.diff_tol is not None


def _check_batch(config) -> None:
    if config.batch_size is not None:
        object.__setattr__(config, "batch_size", _checks.positive_int("batch_size", config.batch_size))
    if not isinstance(config.batch_partial, (bool, np.bool_)):
        raise ValueError(f"batch_partial must be True or False, got {config.batch_partial!r}")


class CBOState(NamedTuple):
    """State of one CBO run (vmapped runs carry a leading run axis on every field).

    Attributes:
      x: particles, a population with ``N`` agents.
      energy: ``(N,)`` energies ``L(x_i)`` of the current particles.
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


def _best_row(energy):
    return jnp.argmin(jnp.where(jnp.isnan(energy), jnp.inf, energy))


def cbo(objective: Callable[[PyTree], jax.Array], config: CBOConfig | None = None, **overrides) -> Dynamics:
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
    """
    _checks.known_keywords("cbo", overrides, [f.name for f in dataclasses.fields(CBOConfig)])
    config = dataclasses.replace(config, **overrides) if config is not None else CBOConfig(**overrides)
    dtype = jnp.dtype(config.dtype)
    schedule = config.alpha
    default_params = params_lib.defaults(config)

    if config.uses_gradient:

        def evaluate(x):
            def total(x):
                e = objective(x)
                return jnp.sum(e), e

            (_, e), g = jax.value_and_grad(total, has_aux=True)(x)
            return e, g

    else:

        def evaluate(x):
            return objective(x), None

    def init(x0: PyTree, key: jax.Array, params: params_lib.Params | None = None) -> CBOState:
        key = jax.random.key(key) if isinstance(key, (int, np.integer)) else key  # an integer seed
        x0 = jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype), x0)
        prm = params_lib.in_dtype(default_params if params is None else params_lib.as_params(params, config), dtype)
        energy, grad = evaluate(x0)
        alpha = jnp.asarray(params_lib.alpha_init(schedule, prm.alpha), dtype)
        best = _best_row(energy)
        return CBOState(
            x=x0,
            energy=energy,
            grad=grad,
            consensus=(consensus_point(x0, energy, alpha) if config.particle_chunk is None else
                       streaming_consensus_point(x0, energy, alpha, chunk=config.particle_chunk)),
            alpha=alpha,
            key=key,
            step=jnp.zeros((), jnp.int32),
            best_x=jax.tree_util.tree_map(lambda leaf: leaf[best], x0),
            best_energy=energy[best],
            active=jnp.ones((), bool),
            params=prm,
            batch=None if config.batch_size is None else batching.init(energy.shape[0]),
            in_batch=None if config.batch_size is None else jnp.ones(energy.shape, bool),
        )

    chunk = config.particle_chunk
    # Static zeros leave a term out entirely; otherwise the (traced) state value is used.
    strength = lambda prm, name: 0.0 if getattr(config, name) == 0 else getattr(prm, name)  # noqa: E731

    def clip(x):
        if config.max_abs is None:
            return x
        c = config.max_abs
        return jax.tree_util.tree_map(lambda leaf: jnp.clip(jnp.nan_to_num(leaf, nan=c), -c, c), x)

    def move(x, grad, m, prm, sub, in_batch, ids):
        """Euler–Maruyama (eq. (15)) for the rows ``x`` (all of them, or one chunk whose
        particle ids are ``ids``), then clipping and the partial batch update."""
        if config.rng == "per-particle":
            normal = lambda k, tree: per_particle_normal(k, tree, ids)  # noqa: E731
        else:
            normal = normal_like
        new = euler_maruyama(
            sub, x, m, dt=prm.dt, lambda1=prm.lambda1, sigma1=strength(prm, "sigma1"), noise=config.noise,
            grad=grad, lambda2=strength(prm, "lambda2"), sigma2=strength(prm, "sigma2"), normal=normal,
        )
        new = clip(new)
        if in_batch is not None and config.batch_partial:  # only the batch's particles move
            new = pop.tree_where_rows(in_batch, new, x)
        return new

    def advance(state: CBOState, m, sub, in_batch):
        """New positions, energies and gradients of every particle."""
        n = state.energy.shape[0]
        if chunk is None:
            x = move(state.x, state.grad, m, state.params, sub, in_batch, jnp.arange(n, dtype=jnp.int32))
            return (x,) + tuple(evaluate(x))
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
            mask_c = None if in_batch is None else jax.lax.dynamic_slice_in_dim(in_batch, start, chunk)
            x_c = move(rows(x_buf), None if g_buf is None else rows(g_buf), m, state.params, key_c, mask_c, ids)
            e_c, g_c = evaluate(x_c)
            put = lambda buf, new: jax.tree_util.tree_map(  # noqa: E731
                lambda b, v: jax.lax.dynamic_update_slice_in_dim(b, v, start, axis=0), buf, new)
            return put(x_buf, x_c), jax.lax.dynamic_update_slice_in_dim(e_buf, e_c, start, 0), (
                None if g_buf is None else put(g_buf, g_c))

        # The buffers are updated in place, chunk by chunk: no (N, d) temporary besides x.
        return jax.lax.fori_loop(0, n // chunk, body, (state.x, state.energy, state.grad))

    def consensus_of(state: CBOState, in_batch):
        if chunk is None:
            return consensus_point(state.x, state.energy, state.alpha, in_batch)
        return streaming_consensus_point(state.x, state.energy, state.alpha, in_batch, chunk=chunk)

    def finish(state: CBOState, x, energy, grad, m, key, batch, in_batch) -> CBOState:
        prm = state.params
        row = _best_row(energy)
        # Row `row` selected by a one-hot reduction rather than an index: on a sharded
        # agent axis that is an all-reduce of one row, where `x[row]` makes XLA gather
        # the whole population onto every device.
        onehot = jnp.arange(energy.shape[0]) == row
        pick = lambda leaf: jnp.sum(jnp.where(onehot.reshape((-1,) + (1,) * (leaf.ndim - 1)), leaf, 0), axis=0)  # noqa: E731
        e_row = jnp.sum(jnp.where(onehot, energy, 0))
        improved = e_row < state.best_energy
        best_x = jax.tree_util.tree_map(lambda new, old: jnp.where(improved, pick(new), old), x, state.best_x)
        best_energy = jnp.where(improved, e_row, state.best_energy)
        new = CBOState(
            x=x,
            energy=energy,
            grad=grad,
            consensus=m,
            alpha=params_lib.alpha_update(schedule, state.alpha, state.energy, prm.alpha, in_batch).astype(dtype),
            key=key,
            step=state.step + 1,
            best_x=best_x,
            best_energy=best_energy,
            active=state.active,
            params=prm,
            batch=batch,
            in_batch=in_batch,
        )
        if not config.early_stop:
            return new
        stop = jnp.zeros((), bool)
        if config.energy_tol is not None:
            stop = stop | (best_energy <= config.energy_tol)
        if config.diff_tol is not None:
            moved = pop.norms(jax.tree_util.tree_map(lambda a, b: (a - b)[None], m, state.consensus))[0]
            stop = stop | ((state.step > 0) & (moved < config.diff_tol))
        new = new._replace(active=~stop)
        # A stopped run keeps its state exactly (including its key and step count).
        return jax.tree_util.tree_map(lambda n, o: jnp.where(state.active, n, o), new, state)

    def _step(state: CBOState, m_given) -> CBOState:
        batch, in_batch = state.batch, None
        if config.batch_size is not None:
            in_batch, batch = batching.next_batch(state.batch, state.key, config.batch_size)
        m = consensus_of(state, in_batch) if m_given is None else m_given
        key, sub = jax.random.split(state.key)
        x, energy, grad = advance(state, m, sub, in_batch)
        return finish(state, x, energy, grad, m, key, batch, in_batch)

    def step(state: CBOState) -> CBOState:
        return _step(state, None)

    def drive(state: CBOState, m: PyTree) -> CBOState:
        """One step toward the given consensus point ``m`` instead of the particles' own,
        with exactly the noise (and random batch) :func:`step` would use."""
        return _step(state, jax.tree_util.tree_map(lambda v, x: jnp.asarray(v, x.dtype), m, state.consensus))

    return Dynamics(init=init, step=step, config=config, objective=objective, drive=drive)


def check_population(name: str, x0: PyTree, objective, num_runs: int | None = None) -> int:
    """Host-side checks before compilation; returns ``N``.

    ``x0`` must have a leading agent axis (after the run axis when ``num_runs`` is
    given), hold only finite values, and ``objective`` must map it to ``(N,)``.
    """
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(f"{name} has no array leaves")
    lead = 2 if num_runs is not None else 1
    for leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) < lead + (1 if isinstance(x0, (np.ndarray, jax.Array)) else 0):
            want = "(M, N, d)" if num_runs is not None else "(N, d)"
            raise ValueError(f"{name} must have shape {want} (or be a stacked pytree), got shape {shape}")
        if num_runs is not None and shape[0] != num_runs:
            raise ValueError(f"{name} has {shape[0]} runs on its leading axis, but num_runs={num_runs}")
    single = jax.tree_util.tree_map(lambda leaf: leaf[0], x0) if num_runs is not None else x0
    n = pop.num_agents(single)
    if n < 1:
        raise ValueError(f"{name} needs at least one particle (N >= 1), got N={n}")
    _checks.all_finite(name, x0)
    try:
        out = jax.eval_shape(objective, jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.float32), single))
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise ValueError(f"objective failed on a population shaped like {name}: {err}") from err
    if tuple(out.shape) != (n,):
        hint = ""
        if looks_single_particle(objective, single):
            hint = (" It looks like an objective of ONE particle (it maps one particle to a scalar): lift it with "
                    "cbo_jax.population.per_agent(f) (cbo_jax.minimize does this by itself).")
        raise ValueError(f"objective must return one energy per particle, shape ({n},); got {tuple(out.shape)}."
                         + hint)
    return n


def looks_single_particle(objective, population: PyTree) -> bool:
    """Whether ``objective`` maps one particle (one row of ``population``) to a scalar."""
    row = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf)[1:], jnp.float32), population)
    try:
        return jax.eval_shape(objective, row).shape == ()
    except Exception:  # noqa: BLE001 - any failure means "no"
        return False
