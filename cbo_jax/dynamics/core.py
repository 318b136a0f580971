"""The step engine shared by every dynamic of the CBX family: one step as named pure phases.

A dynamic of the family (CBO, CBOMemory, PSO, CBS, PolarCBO, AdamCBO, MirrorCBO, the
constrained variants; see :mod:`cbo_jax.dynamics.family`) is a small
:class:`~cbo_jax.dynamics.base.Kernel`: how its consensus point is formed and how its
particles move. Everything else lives here once, the way CBXpy's ``CBXDynamic`` owns its
pre- and post-step template; each phase is one method of :class:`Engine`:

1. ``batch``: the random batch of the step (:mod:`cbo_jax.batching`);
2. ``consensus``: the consensus point (the kernel's, or the Gibbs-weighted mean of the
   particles), and ``E(m)`` where a correction or the stagnation rule needs it;
3. ``move``: the kernel's move, with the shared noise models
   (:func:`cbo_jax.sde.noise_term`) and drift corrections (:func:`correct`), then clipping
   (``max_abs``) and the partial batch update;
4. ``resample``: resampling (:mod:`cbo_jax.resampling`);
5. ``evaluate``: one evaluation of the objective at the new particles, which the kernel
   may absorb into a memory (CBOMemory, PSO);
6. ``track_best`` and ``schedules``: the best-so-far tracker, the α schedule and the
   schedules of any other number (:mod:`cbo_jax.schedules`), the evaluation count;
7. ``stop``: termination: energy below ``energy_tol``, consensus settled (``diff_tol``),
   the evaluation budget (``max_evals``), energy stagnation (``stagnation_patience``); a
   stopped run's state is frozen.

Every state is a :class:`~cbo_jax.dynamics.base.CBOState`; what a dynamic adds (a
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

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import batching
from cbo_jax import params as params_lib
from cbo_jax import population as pop
from cbo_jax import sde
from cbo_jax._xla_cpu import computed_together, written_out
from cbo_jax.consensus import consensus_point, log_consensus_weights, streaming_consensus_point
from cbo_jax.dynamics.base import (CORRECTIONS, FAMILY_NOISE, RNG_MODES, SDE_NUMBERS, Absorbed, CBOState, Ctrl,
                                   Dynamics, FamilyConfig, Kernel, Move, ScheduleMap)
from cbo_jax.dynamics.checks import check_population, check_values, host_eval, require_array
from cbo_jax.resampling import RESAMPLE_STREAM
from cbo_jax.sde import cov_sqrt, noise_term, weighted_cov

PyTree = Any

__all__ = ["FamilyConfig", "Kernel", "Move", "Ctrl", "Engine", "build", "noise_term", "correct", "clip",
           "cov_sqrt", "weighted_cov", "FAMILY_NOISE", "CORRECTIONS", "RNG_MODES", "rng_layout", "with_rng_layout",
           "draw_normal", "record", "real_agents", "require_array", "host_eval", "check_values", "ScheduleMap",
           "Absorbed", "SDE_NUMBERS"]

PRESTEP_STREAM = 0x70726573  # "pres": fold_in constant of a kernel's pre-step key


def draw_normal(key, tree, ids, rng: str):
    """:func:`cbo_jax.sde.draw_normal`, read at call time (tests intercept it there)."""
    return sde.draw_normal(key, tree, ids, rng)


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


def clip(x: PyTree, max_abs: float | None) -> PyTree:
    """Coordinates clipped to ``[-max_abs, max_abs]``, NaN to ``max_abs`` (CBXpy's default
    post-processing); ``max_abs=None``: ``x`` unchanged."""
    if max_abs is None:
        return x
    c = max_abs
    return jax.tree_util.tree_map(lambda leaf: jnp.clip(jnp.nan_to_num(leaf, nan=c), -c, c), x)


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
    # overflow) gets weight zero in the consensus and would otherwise be the best point. Rows from
    # ``agents`` on are a sharded run's NaN padding: an objective that maps NaN to a number
    # (jnp.nansum, nan_to_num) gives them a finite energy, and a padding row could be the best point.
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
# The engine
# ----------------------------------------------------------------------------------------


INVARIANT_LAYOUTS = ("counter", "per-particle")  # noise layouts whose draws do not depend on the blocks


def auto_block_rows(n: int, backend: str | None = None) -> int:
    """Rows per block of a step of ``n`` particles: all of them up to ``2**17``; beyond, on the CPU
    ``2**16`` (a block whose rows stay in the caches: at d = 20 a CBO step ran 1.3x faster in blocks
    of ``2**16`` rows than in one block at N = 3e5 and 1e6, and in blocks of ``2**14`` rows slower,
    benchmarks/RESULTS.md), elsewhere ``n / 16`` and at least ``2**16`` (kernels long enough for a
    GPU, and a block's temporaries, a few copies of its rows, a small share of the population's
    memory). ``backend``: JAX's default backend unless given."""
    if n <= 2**17:
        return n
    if (backend or jax.default_backend()) == "cpu":
        return 2**16
    return max(2**16, -(-n // 16))


def _sq_dtype(x):
    leaves = jax.tree_util.tree_leaves(x)
    return jnp.result_type(*[leaf.dtype for leaf in leaves]) if leaves else jnp.float32


def _rows_of(tree, n: int, start, rows: int):
    """The ``rows`` rows from ``start`` of every leaf of ``tree`` with ``n`` rows (other leaves as they are)."""
    if tree is None:
        return None
    return jax.tree_util.tree_map(
        lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, start, rows, axis=0)
        if jnp.ndim(leaf) and leaf.shape[0] == n else leaf, tree)


def _put_rows(buf, rows, n: int, start):
    """``buf`` with the leaves of ``rows`` written from row ``start`` (leaves of ``buf`` without ``n``
    rows are taken from ``rows``)."""
    if buf is None:
        return None
    return jax.tree_util.tree_map(
        lambda b, r: jax.lax.dynamic_update_slice_in_dim(b, r.astype(b.dtype), start, axis=0)
        if jnp.ndim(b) and b.shape[0] == n else r, buf, rows)


def _map_rows(fn, x, rows: int):
    """``fn(x)`` for a function of rows (every leaf of its result has ``x``'s rows), computed
    ``rows`` at a time into buffers of the whole result (``None`` leaves stay ``None``)."""
    n = pop.num_agents(x)
    if rows >= n:
        return fn(x)
    spec = jax.eval_shape(fn, _rows_of(x, n, 0, rows))
    bufs = jax.tree_util.tree_map(lambda v: jnp.zeros((n,) + v.shape[1:], v.dtype), spec)
    return pop.over_blocks(n, rows, lambda b, _, start, size: pop.update_rows(b, fn(_rows_of(x, n, start, size)),
                                                                            start), bufs)


def _where_rows(keep, new, old):
    """Per row, ``new`` where ``keep`` else ``old`` (pytrees of rows; non-row leaves from ``new``)."""
    if new is None:
        return None
    rows = keep.shape[0]
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(keep.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
        if jnp.ndim(a) and a.shape[0] == rows else a, new, old)


def _best_of_block(points, energy, valid, best_x, best_e):
    """The carry of the best point after one block: its least valid finite energy, where it is
    below the carry's (the first of equal ones, as over the whole population)."""
    row = jnp.argmin(jnp.where(valid & jnp.isfinite(energy), energy, jnp.inf))
    e_row = energy[row]
    improved = valid[row] & jnp.isfinite(e_row) & (e_row < best_e)
    pts = jax.tree_util.tree_map(lambda leaf: jax.lax.dynamic_index_in_dim(leaf, row, keepdims=False), points)
    best_x = jax.tree_util.tree_map(lambda new, old: jnp.where(improved, new, old), pts, best_x)
    return best_x, jnp.where(improved, e_row, best_e)


class Engine:
    """One dynamic's ``init`` and ``step``, phase by phase, for ``kernel`` on ``objective``.

    Built once by :func:`build` from the config (what it derives: the dtype, the schedules,
    whether the covariance noise needs the consensus weights, whether ``E(m)`` is needed);
    every method is a pure function of its arguments, traced into the caller's program. The
    numbers of a run are read from ``state.params``.
    """

    def __init__(self, objective: Callable, config: FamilyConfig, kernel: Kernel):
        if not kernel.corrects and config.correction != "none":
            raise ValueError(f"{kernel.name}: correction={config.correction!r} is not available for this dynamic "
                             "(CBXpy applies drift corrections in CBO, CBS, CBOMemory, PSO, PolarCBO and MirrorCBO)")
        self.objective, self.config, self.kernel = objective, config, kernel
        self.dtype = jnp.dtype(config.dtype)
        self.default_params = params_lib.defaults(config)
        self.rules = dict(config.schedule or {})
        self.noise_model = config.noise if callable(config.noise) else config.noise_kind
        self.needs_logw = self.noise_model == "covariance" and not kernel.per_particle_consensus
        self.corr = config.correction if kernel.corrects else "none"
        self.needs_fm = self.corr != "none" or config.stagnation_patience is not None
        self.cov_mode = getattr(config, "mode", "sampling")
        self.evaluate = energy_evaluator(objective, config.uses_gradient)

    # --- init ------------------------------------------------------------------------------

    def init(self, x0: PyTree, key: jax.Array, params: params_lib.Params | None = None) -> CBOState:
        config, kernel, dtype = self.config, self.kernel, self.dtype
        _checks.x64_for(config)  # at trace time: a float64 run in 32-bit JAX would be float32 throughout
        key = _checks.as_key("key", key)  # an integer seed (64 bits); anything but a key or a seed is refused
        x0 = jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype), x0)
        prm = params_lib.in_dtype(self.default_params if params is None else params_lib.as_params(params, config),
                                  dtype)
        n = pop.num_agents(x0)
        rows = self.block_rows(n)
        energy, grad = self.evaluate_rows(x0, rows)
        # A population is finite (check_population); non-finite rows are a sharded run's padding.
        agents = jnp.sum(pop.tree_isfinite_rows(x0), dtype=jnp.int32)
        alpha = jnp.asarray(params_lib.alpha_init(config.alpha, prm.alpha), dtype)
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
        if rows < n and not kernel.per_particle_consensus:  # a large population: the streaming reduction
            points = x0 if kernel.consensus_points is None else kernel.consensus_points(state)
            m = streaming_consensus_point(points, energy, alpha, None, chunk=rows)
        else:
            m = self.consensus(state, None)
        resampling = config.resampling
        ctrl = Ctrl(
            stagnation=(None if config.stagnation_patience is None
                        else jnp.full((config.stagnation_patience,), jnp.inf, dtype)),
            resample=None if resampling is None else resampling.init(m, dtype),
            resamplings=None if resampling is None else jnp.zeros((), jnp.int32),
            agents=agents,
        )
        state = state._replace(consensus=m, ctrl=ctrl)
        if config.early_stop and config.max_evals is not None:  # CBXpy checks before the first step too
            state = state._replace(active=~self.over_budget(state, agents))
        return state

    # --- the evaluation budget ---------------------------------------------------------------

    def step_evals(self, agents):
        """Objective evaluations of one step besides a prestep's: the particles and ``E(m)`` where needed."""
        return agents + (0 if not self.needs_fm else agents if self.kernel.per_particle_consensus else 1)

    def over_budget(self, state, agents):
        """Whether the next step from ``state`` would take the run past ``max_evals``."""
        nxt = self.step_evals(agents)
        if self.kernel.prestep_evaluates is not None:
            nxt = nxt + jnp.where(self.kernel.prestep_evaluates(state), agents, 0)
        return state.evals > self.config.max_evals - nxt  # not evals + nxt: that wraps round near 2**31

    # --- phases ------------------------------------------------------------------------------

    def batch(self, state):
        """``(in_batch, batch)``: this step's random batch mask (``None``: every particle) and its state."""
        if self.config.batch_size is None:
            return None, state.batch
        return batching.next_batch(state.batch, state.key, self.config.batch_size)

    def consensus(self, state, in_batch):
        """The consensus point of ``state``'s particles over the batch ``in_batch``."""
        if self.kernel.consensus is not None:
            return self.kernel.consensus(state, in_batch)
        return consensus_point(state.x, state.energy, state.alpha, in_batch)

    def energy_of_consensus(self, m):
        """``E(m)`` (one per particle for a per-particle consensus)."""
        if self.kernel.per_particle_consensus:
            return self.objective(m)
        return self.objective(_add_agent_axis(m))[0]

    def cov_weights(self, state, in_batch):
        """The consensus log-weights that the covariance noise needs, else ``None``."""
        if not self.needs_logw:
            return None
        if self.kernel.cov_weights is not None:
            return self.kernel.cov_weights(state, in_batch)
        ok = pop.tree_isfinite_rows(state.x)
        return log_consensus_weights(state.energy, state.alpha, ok if in_batch is None else ok & in_batch)

    def cov_root(self, state, m, in_batch, f_m, rows: int):
        """``C^{1/2}`` of the covariance noise, ``C = Σ_j w_j u_j u_jᵀ`` over every particle's
        corrected consensus drift ``u_j``, accumulated block by block (no ``(N, d)`` temporary)."""
        n = state.energy.shape[0]
        logw = self.cov_weights(state, in_batch)
        dim = pop.ravel(jax.tree_util.tree_map(lambda leaf: leaf[:1], state.x))[0].shape[1]
        dtype = pop.ravel(jax.tree_util.tree_map(lambda leaf: leaf[:1], state.x))[0].dtype

        def add(c, start, size: int):
            x = _rows_of(state.x, n, start, size)
            u = correct(self.corr, pop.tree_sub(x, m), jax.lax.dynamic_slice_in_dim(state.energy, start, size), f_m,
                        self.config.correction_eps)
            return c + weighted_cov(pop.ravel(u)[0], jax.lax.dynamic_slice_in_dim(logw, start, size))

        return cov_sqrt(pop.over_blocks(n, rows, lambda c, _, start, size: add(c, start, size),
                                        jnp.zeros((dim, dim), dtype)))

    def move(self, state, m, sub, in_batch, f_m, ids, root=None):
        """``(x, aux)``: the kernel's move, in the particles' dtype, clipped, the batch's particles only
        (``root``: the covariance noise's ``C^{1/2}`` over the whole population, for a block)."""
        config, kernel, prm = self.config, self.kernel, state.params
        logw = None if root is not None else self.cov_weights(state, in_batch)

        def noise(k, u):
            return noise_term(self.noise_model, k, u, dt=prm.dt, alpha=state.alpha, logw=logw, mode=self.cov_mode,
                              normal=lambda kk, t: draw_normal(kk, t, ids, config.rng), root=root)

        def correct_(u):
            return correct(self.corr, u, state.energy, f_m, config.correction_eps)

        ctx = Move(state=state, m=m, key=sub, prm=prm, logw=logw, in_batch=in_batch, f_m=f_m, noise=noise,
                   correct=correct_, ids=ids, rng=config.rng)
        x, aux = kernel.move(ctx)
        # The particles keep their dtype: an objective that returns wider energies than the
        # config's dtype (float64 under jax_enable_x64 with dtype="float32") must not widen
        # the particles through a kernel's weights (PolarCBO) or step count (AdamCBO).
        x = clip(_same_dtypes(x, state.x), config.max_abs)
        aux = _same_dtypes(aux, state.aux)
        if in_batch is not None and config.batch_partial:  # only the batch's particles move
            x = pop.tree_where_rows(in_batch, x, state.x)
            if kernel.aux_rows:
                aux = aux._replace(**{f: pop.tree_where_rows(in_batch, getattr(aux, f), getattr(state.aux, f))
                                      for f in kernel.aux_rows})
        return x, aux

    def resample(self, state, x, m, sub, ids, agents, ctrl):
        """``(x, ctrl)``: a resampling kick where a trigger fires (``x`` unchanged without resampling)."""
        resampling = self.config.resampling
        if resampling is None:
            return x, ctrl
        fire, trig = resampling.check(ctrl.resample, consensus=m, best_energy=state.best_energy)
        k_r = jax.random.fold_in(sub, RESAMPLE_STREAM)
        sigma_r = jnp.asarray(resampling.sigma, self.dtype) * jnp.sqrt(state.params.dt)
        # A cond (not a select) so that an un-jitted step draws only when it fires.
        x = jax.lax.cond(fire, lambda x: jax.tree_util.tree_map(
            lambda a, z: a + sigma_r * z, x, draw_normal(k_r, x, ids, self.config.rng)), lambda x: x, x)
        if resampling.tracks_update_norm:  # over the real agents (not a sharded run's NaN padding)
            real = ids < agents
            sq = sum(jnp.sum(jnp.where(real.reshape((-1,) + (1,) * (a.ndim - 1)), (a - b) ** 2, 0))
                     for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(state.x)))
            trig = resampling.after_move(trig, jnp.sqrt(sq) / agents.astype(sq.dtype))
        return x, ctrl._replace(resample=trig, resamplings=ctrl.resamplings + fire.astype(jnp.int32))

    def absorb(self, state, x, aux, energy) -> Absorbed:
        """What the state keeps of the evaluated particles (a kernel's memory may absorb them)."""
        if self.kernel.absorb is not None:
            return self.kernel.absorb(state, x, aux, energy)
        return Absorbed(x, aux, energy, x, energy, state.energy)

    def track_best(self, state, a: Absorbed):
        """``(best_x, best_energy)``: the best-so-far point, from the absorbed best points."""
        agents = real_agents(state, a.best_energy.shape[0])
        pts, e_row = _pick_row(a.best_points, a.best_energy, _best_row(a.best_energy, agents))
        improved = jnp.isfinite(e_row) & (e_row < state.best_energy)
        best_x = jax.tree_util.tree_map(lambda new, old: jnp.where(improved, new, old), pts, state.best_x)
        return best_x, jnp.where(improved, e_row, state.best_energy)

    def schedules(self, state, a: Absorbed, in_batch):
        """``(alpha, params)``: α and every scheduled number after the step."""
        prm, dtype = state.params, self.dtype
        alpha = params_lib.alpha_update(self.config.alpha, state.alpha, a.alpha_energy, prm.alpha, in_batch)
        alpha = alpha.astype(dtype)
        for name, rule in self.rules.items():  # schedules of the other numbers (CBXpy's scheduler list)
            if name in SDE_NUMBERS:
                prm = prm._replace(**{name: jnp.asarray(rule.update(getattr(prm, name), a.alpha_energy), dtype)})
            else:
                prm = prm._replace(extra=prm.extra._replace(
                    **{name: jnp.asarray(rule.update(getattr(prm.extra, name), a.alpha_energy), dtype)}))
        return alpha, prm

    def stagnation(self, state, f_m, ctrl):
        """``(stop, ctrl)``: the stagnation rule's ring buffer of ``E(m)`` updated, and whether it fires."""
        patience = self.config.stagnation_patience
        if patience is None:
            return jnp.zeros((), bool), ctrl
        f_stag = jnp.min(f_m) if self.kernel.per_particle_consensus else f_m
        buf = ctrl.stagnation.at[state.step % patience].set(f_stag.astype(self.dtype))
        return jnp.std(buf) < self.config.stagnation_tol, ctrl._replace(stagnation=buf)

    def stop(self, state0, state, new, m, stop, rows_frozen: bool = False):
        """``new``, or ``state0`` unchanged where the run had stopped; ``active`` is False once a
        termination rule fires. ``rows_frozen``: the per-particle fields were kept block by block
        (:meth:`blocked`), so only the others are taken from ``state0`` here."""
        config = self.config
        if not config.early_stop:
            return new
        if config.energy_tol is not None:
            stop = stop | (new.best_energy <= config.energy_tol)
        if config.diff_tol is not None:
            sq = sum(jnp.sum((u - v) ** 2) for u, v in zip(jax.tree_util.tree_leaves(m),
                                                           jax.tree_util.tree_leaves(state.consensus)))
            stop = stop | ((state.step > 0) & (jnp.sqrt(sq) < config.diff_tol))
        if config.max_evals is not None:
            stop = stop | self.over_budget(new, real_agents(new, new.energy.shape[0]))
        new = new._replace(active=~stop)
        # A stopped run keeps its state exactly (including its key and step count).
        if not rows_frozen:
            return jax.tree_util.tree_map(lambda u, v: jnp.where(state0.active, u, v), new, state0)
        rows = ("x", "energy", "grad", "aux")
        kept = jax.tree_util.tree_map(lambda u, v: jnp.where(state0.active, u, v), new._replace(**dict.fromkeys(rows)),
                                      state0._replace(**dict.fromkeys(rows)))
        return kept._replace(**{f: getattr(new, f) for f in rows})

    # --- one step ----------------------------------------------------------------------------

    def step(self, state0, m_given=None, blocking: bool = True):
        """One step of the dynamics (toward ``m_given`` instead of the particles' own consensus).

        ``blocking``: move and evaluate the particles in blocks of :meth:`block_rows` rows, updated
        in place (:meth:`blocked`), where the dynamic and its noise layout allow it; ``False``
        (a population sharded over devices): all rows at once."""
        kernel, state = self.kernel, state0
        n = state.energy.shape[0]
        rows = self.block_rows(n, blocking)
        if rows < n:
            return self.blocked(state0, m_given, rows)
        in_batch, batch = self.batch(state)
        agents = real_agents(state, n)
        pre_evals: Any = 0
        if kernel.prestep is not None:
            state, evaluated = kernel.prestep(state, jax.random.fold_in(state.key, PRESTEP_STREAM))
            pre_evals = jnp.where(evaluated, agents, 0)
        m = self.consensus(state, in_batch) if m_given is None else m_given
        key, sub = jax.random.split(state.key)
        f_m = self.energy_of_consensus(m) if self.needs_fm else None
        ids = jnp.arange(n, dtype=jnp.int32)
        ctrl = state.ctrl
        if kernel.advance is not None:
            x, energy, grad = kernel.advance(state, m, sub, in_batch)
            aux = state.aux
        else:
            x, aux = self.move(state, m, sub, in_batch, f_m, ids)
            x, ctrl = self.resample(state, x, m, sub, ids, agents, ctrl)
            energy, grad = self.evaluate(x)
        a = self.absorb(state, x, aux, energy)
        best_x, best_energy = self.track_best(state, a)
        alpha, prm = self.schedules(state, a, in_batch)
        stop, ctrl = self.stagnation(state, f_m, ctrl)
        evals = jnp.asarray(self.step_evals(agents), jnp.int32) + jnp.asarray(pre_evals, jnp.int32)
        new = state._replace(
            x=a.x, energy=a.energy, grad=grad, consensus=m, alpha=alpha, key=key, step=state.step + 1,
            best_x=best_x, best_energy=best_energy, params=prm, batch=batch, in_batch=in_batch, aux=a.aux,
            evals=_saturating_add(state.evals, evals), ctrl=ctrl,
        )
        return self.stop(state0, state, new, m, stop)

    def drive(self, state, m, blocking: bool = True):
        """One step toward the given consensus point ``m`` instead of the particles' own,
        with exactly the noise (and random batch) :meth:`step` would use."""
        return self.step(state, jax.tree_util.tree_map(lambda v, x: jnp.asarray(v, x.dtype), m, state.consensus),
                         blocking)

    # --- the blocked step (large N) ------------------------------------------------------------

    @property
    def blockable(self) -> bool:
        """Whether a step may run block by block: not for a pre-step over the whole population
        (DriftConstrainedCBO's independent noise), or the covariance noise of a drift other than
        the (corrected) consensus drift (its matrix is over every particle's drift: for CBO and
        CBS a pass over the blocks before the move; PolarCBO's local covariances are formed
        with the whole population inside its move). A per-particle consensus (PolarCBO) is
        formed for every particle first, then each block moves toward its own rows of it."""
        kernel = self.kernel
        cov = self.needs_logw or self.noise_model == "covariance"
        return not (kernel.prestep is not None or (cov and not (kernel.cov_of_drift and kernel.cov_weights is None)))

    def block_rows(self, n: int, blocking: bool = True) -> int:
        """Rows per block of a step of ``n`` particles (``n``: one block).

        ``particle_chunk`` when the config sets it; otherwise, with ``blocking``, a blockable
        dynamic and a noise layout whose draws do not depend on the blocks (``"counter"``,
        ``"per-particle"``), :func:`auto_block_rows`; else ``n``."""
        chunk = getattr(self.config, "particle_chunk", None)
        if not self.blockable or getattr(self.objective, "host", False):  # a host objective: one call per step
            return n
        if chunk is not None:
            return min(int(chunk), n)
        if not blocking or self.config.rng not in INVARIANT_LAYOUTS:
            return n
        return auto_block_rows(n)

    def blocked(self, state0, m_given, rows: int):
        """:meth:`step` in blocks of ``rows`` particles, each moved, evaluated and written back in
        place: besides the state, a step holds one block's temporaries. The consensus is a
        streaming reduction over the same blocks, the best point a carry of one row."""
        config, kernel, state = self.config, self.kernel, state0
        n = state.energy.shape[0]
        in_batch, batch = self.batch(state)
        agents = real_agents(state, n)
        per_particle = kernel.per_particle_consensus
        if m_given is not None:
            m = m_given
        elif per_particle:  # one point per particle, formed block by block by the kernel itself
            m = self.consensus(state, in_batch)
        else:
            points = state.x if kernel.consensus_points is None else kernel.consensus_points(state)
            m = streaming_consensus_point(points, state.energy, state.alpha, in_batch, chunk=rows)
        key, sub = jax.random.split(state.key)
        f_m = None
        if self.needs_fm:
            f_m = self.objective_rows(m, rows) if per_particle else self.energy_of_consensus(m)
        ctrl = state.ctrl
        resampling = config.resampling
        fire = trig = None
        if resampling is not None:
            fire, trig = resampling.check(ctrl.resample, consensus=m, best_energy=state.best_energy)
        root = self.cov_root(state, m, in_batch, f_m, rows) if self.noise_model == "covariance" else None
        shared = state.energy  # the consensus energies, which the α schedule reads (before the loop overwrites them)
        carry = (state.x, state.energy, state.grad, state.aux, jnp.array(shared, copy=True), state.best_x,
                 state.best_energy, jnp.zeros((), _sq_dtype(state.x)))
        invariant = config.rng in INVARIANT_LAYOUTS

        def block(carry, c, start, size: int):
            """Block ``c``: the ``size`` rows from ``start``, moved, evaluated and written back."""
            x_buf, e_buf, g_buf, aux_buf, ae_buf, best_x, best_e, sq = carry
            ids = start + jnp.arange(size, dtype=jnp.int32)
            take = lambda tree: _rows_of(tree, n, start, size)  # noqa: E731
            bs = state._replace(x=take(x_buf), energy=take(e_buf), grad=take(g_buf), aux=take(aux_buf),
                                in_batch=take(in_batch))
            k = sub if invariant else jax.random.fold_in(sub, c)
            m_b, f_b = (take(m), take(f_m)) if per_particle else (m, f_m)
            x, aux = self.move(bs, m_b, k, bs.in_batch, f_b, ids, root)
            if resampling is not None:
                sigma_r = jnp.asarray(resampling.sigma, self.dtype) * jnp.sqrt(state.params.dt)
                k_r = jax.random.fold_in(k, RESAMPLE_STREAM)
                x = jax.lax.cond(fire, lambda x: jax.tree_util.tree_map(
                    lambda a, z: a + sigma_r * z, x, draw_normal(k_r, x, ids, config.rng)), lambda x: x, x)
            energy, grad = self.evaluate(x)
            a = self.absorb(bs, x, aux, energy)
            real = ids < agents
            if resampling is not None and resampling.tracks_update_norm:
                sq = sq + sum(jnp.sum(jnp.where(real.reshape((-1,) + (1,) * (u.ndim - 1)), (u - v) ** 2, 0))
                              for u, v in zip(jax.tree_util.tree_leaves(a.x), jax.tree_util.tree_leaves(bs.x)))
            best_x, best_e = _best_of_block(a.best_points, a.best_energy, real, best_x, best_e)
            if config.early_stop:  # a stopped run keeps its particles (a select only where a run can stop:
                # fused into the in-place update it costs a copy of the population)
                def new(v, old):
                    return _where_rows(jnp.broadcast_to(state0.active, (size,)), v, old)
            else:
                def new(v, old):
                    return v
            rows_new = (new(a.x, bs.x), new(a.energy, bs.energy), None if g_buf is None else new(grad, bs.grad),
                        new(a.aux, bs.aux), a.alpha_energy)
            # Every new row (and the best point) computed before any row is written back: one
            # barrier over all of them orders every read of the old rows before every in-place
            # write. Without it XLA may recompute a new row of one buffer from another's old rows
            # after that one is updated in place, and copies that buffer whole (PSO: its velocity,
            # fused twice, read x after x's update; 3 copies of x, y and v).
            rows_new, best_x, best_e, sq = computed_together((rows_new, best_x, best_e, sq), sub)
            put = lambda buf, v: _put_rows(buf, v, n, start)  # noqa: E731
            x_new, e_new, g_new, aux_new, ae_new = rows_new
            return (put(x_buf, x_new), put(e_buf, e_new), None if g_buf is None else put(g_buf, g_new),
                    put(aux_buf, aux_new), put(ae_buf, ae_new), best_x, best_e, sq)

        x, energy, grad, aux, alpha_energy, best_x, best_energy, sq = pop.over_blocks(n, rows, block, carry)
        if resampling is not None:
            if resampling.tracks_update_norm:
                trig = resampling.after_move(trig, jnp.sqrt(sq) / agents.astype(sq.dtype))
            ctrl = ctrl._replace(resample=trig, resamplings=ctrl.resamplings + jnp.asarray(fire, jnp.int32))
        a = Absorbed(x, aux, energy, x, energy, alpha_energy)
        alpha, prm = self.schedules(state, a, in_batch)
        stop, ctrl = self.stagnation(state, f_m, ctrl)
        new = state._replace(
            x=x, energy=energy, grad=grad, consensus=m, alpha=alpha, key=key, step=state.step + 1,
            best_x=best_x, best_energy=best_energy, params=prm, batch=batch, in_batch=in_batch, aux=aux,
            evals=_saturating_add(state.evals, jnp.asarray(self.step_evals(agents), jnp.int32)), ctrl=ctrl,
        )
        return self.stop(state0, state, new, m, stop, rows_frozen=True)

    def objective_rows(self, x, rows: int):
        """The objective of every row of ``x`` (a per-particle consensus's ``E(m_i)``), ``rows`` at a time."""
        return _map_rows(self.objective, x, rows)

    def evaluate_rows(self, x, rows: int):
        """:attr:`evaluate` in blocks of ``rows`` particles (``(energies, gradients)``): an objective
        evaluated on a whole large population may hold its elementwise terms as an ``(N, d)``
        temporary before the sum."""
        return _map_rows(self.evaluate, x, rows)

    def check(self, name, x0, num_runs=None):
        """Host checks of an initial population (:func:`~cbo_jax.dynamics.checks.check_population`)."""
        config, kernel = self.config, self.kernel
        extra = None
        if kernel.check is not None:
            def extra(single, n):
                kernel.check(jax.tree_util.tree_map(np.asarray, single), n, config)
        # ∇L of an objective that counts: JAX's grad refuses integer outputs (named with the terms)
        gradient = f"lambda2={config.lambda2}, sigma2={config.sigma2}" if config.uses_gradient else ""
        return check_population(name, x0, self.objective, num_runs, extra, gradient=gradient)


def build(objective: Callable, config: FamilyConfig, kernel: Kernel) -> Dynamics:
    """The :class:`~cbo_jax.dynamics.base.Dynamics` of ``kernel`` on ``objective`` with ``config``.

    ``init(x0, key, params=None)`` and ``step(state)`` act on one run (vmapped by
    :func:`cbo_jax.simulate`); ``drive(state, m)`` (global-consensus kernels) steps toward
    a given consensus point. The numbers are read from ``state.params``.
    """
    engine = Engine(objective, config, kernel)
    # config.rng holds for a step jitted or called by hand as in simulate, whatever JAX's global layout
    init, step, drive = (with_rng_layout(config.rng, fn) for fn in (engine.init, engine.step, engine.drive))
    return Dynamics(init=init, step=step, config=config, objective=objective, check=engine.check, record=record,
                    drive=None if kernel.per_particle_consensus else drive)
