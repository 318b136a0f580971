"""Clustered (FedCBO eq. (4)) and bi-level (CB²O eq. (1.2)–(1.5), (3.10)) particle systems.

One population of ``N`` particles, ``K`` lower-level objectives ``L_1..L_K``. Particle
``i`` carries a class label ``k_i`` that only selects which objective it follows
(FedCBO eq. (4), Euler–Maruyama eq. (15))::

    θ ← θ - λ1 γ (θ - m_k) - λ2 γ ∇L_k(θ) + σ1 √γ D(θ - m_k) z + σ2 √γ |∇L_k(θ)| z~,

    m_k = Σ_{p ∈ Q_k} θ_p e^{-α E_k(θ_p)} / Σ_{p ∈ Q_k} e^{-α E_k(θ_p)}.

The consensus point ``m_k`` runs over ALL particles, whatever their class: a particle
never needs to know anyone's class, and its own label enters ``m_k`` only through the
losses. Without an upper level, ``E_k = L_k`` and ``Q_k`` is every particle (FedCBO).
With an upper-level objective ``G`` (one shared, or one per class), ``E_k = G`` (or
``G_k``) and ``Q_k = {p : L_k(θ_p) <= q_β(L_k)}`` is the β-quantile sub-level set of
the lower level: the CB²O consensus, eq. (1.3)–(1.4) for ``K = 1`` and its clustered
form (3.10) for ``K > 1``.

Malicious particles (CB²O eq. (1.7b)) follow their own SDE ``dθ = a(t, θ) dt +
A(t, θ) dB`` with user-supplied drift and diffusion; they are part of the population
every benign particle's consensus is computed from, and nothing marks them there.

The numbers live in the state (a :class:`cbo_jax.params.Params`: ``λ1, σ1, λ2, σ2``,
``dt`` and the α schedule's numbers), so a sweep over them is a ``vmap`` over states
(``simulate(..., params=P)``); which terms exist is static and set by the
:class:`ClusteredConfig` (a term whose config strength is ``0`` is left out).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
from jax.typing import ArrayLike
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import batching
from cbo_jax import params as params_lib
from cbo_jax import population as pop
from cbo_jax.consensus import consensus_point, quantile_mask, streaming_consensus_point
from cbo_jax._xla_cpu import written_out
from cbo_jax.dynamics.base import Dynamics, Particles, check_batch
from cbo_jax.dynamics.checks import check_objective, check_population
from cbo_jax.dynamics.core import INVARIANT_LAYOUTS, auto_block_rows, clip, with_rng_layout
from cbo_jax.schedules import as_schedule
from cbo_jax.sde import NOISE_KINDS, counter_normal, euler_maruyama, normal_like, per_particle_normal

PyTree = Any

__all__ = [
    "ClusteredConfig",
    "ClusteredState",
    "Malicious",
    "Particles",
    "SDEParams",
    "cb2o",
    "clustered",
    "particles",
]

RNG_MODES = ("counter", "fast", "partitionable", "per-particle")


@dataclasses.dataclass(frozen=True)
class ClusteredConfig:
    """Parameters of the clustered / bi-level particle system, validated on construction.

    Attributes:
      lambda1, sigma1: consensus drift and noise strengths (``>= 0``).
      dt: time step ``γ > 0``.
      alpha: inverse temperature: a number ``>= 0`` or a schedule of
        :mod:`cbo_jax.schedules`; each class keeps its own α (a schedule that reads
        the energies sees its class's energies).
      noise: ``"isotropic"`` (eq. (4): ``σ1 |θ - m_k| dB``, the default), ``"anisotropic"``
        (``σ1 (θ - m_k) ∘ dB``) or ``"none"``.
      lambda2, sigma2: gradient drift ``-λ2 ∇L_k dt`` and gradient noise
        ``σ2 |∇L_k| dB~`` (the objectives must then be differentiable).
      beta: quantile ``β ∈ (0, 1]`` of the lower-level sub-level set (CB²O eq. (1.4));
        ``1`` keeps every particle. Only used with an upper-level objective.
      max_abs: clip coordinates to ``[-max_abs, max_abs]`` after each step (``None``:
        off).
      dtype: ``"float32"`` or ``"float64"`` (needs ``jax_enable_x64``).
      rng: ``"counter"`` (default: particle ``i``'s draw depends on the step's key and its id
        ``id_i`` only, :func:`cbo_jax.sde.counter_normal`), ``"per-particle"`` (particle ``i``
        draws from ``fold_in(step_key, id_i)``; slower), or JAX's ``"fast"`` /
        ``"partitionable"`` layouts (see :class:`CBOConfig`). With the first two the
        simulation is exactly invariant under permutations of the particles, and a step in
        blocks draws what the whole population would.
      batch_size, batch_partial: the random batch method (:mod:`cbo_jax.batching`):
        every ``m_k`` (and the β-quantile set of CB²O) runs over a random batch of
        ``batch_size`` particles; ``batch_partial=True`` moves only the batch's particles
        (benign and malicious alike), ``False`` moves all.
      particle_chunk: the rows per block of a step (``None``: chosen from ``N``,
        :func:`~cbo_jax.dynamics.core.auto_block_rows`, with the ``"counter"`` and
        ``"per-particle"`` layouts): the consensus points are a streaming reduction and the
        particles move and are evaluated block by block, in place; the attackers' drift and
        diffusion are then called on blocks of rows.
    """

    lambda1: float = 1.0
    sigma1: float = 0.5
    dt: float = 0.01
    alpha: Any = 1e3
    noise: str = "isotropic"
    lambda2: float = 0.0
    sigma2: float = 0.0
    beta: float = 1.0
    max_abs: float | None = None
    dtype: str = "float32"
    rng: str = "counter"
    batch_size: int | None = None
    batch_partial: bool = True
    particle_chunk: int | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        check_batch(self)
        if self.particle_chunk is not None:
            set_("particle_chunk", _checks.positive_int("particle_chunk", self.particle_chunk))
        for name in ("lambda1", "sigma1", "lambda2", "sigma2"):
            set_(name, _checks.non_negative(name, getattr(self, name)))
        set_("dt", _checks.positive("dt", self.dt))
        set_("alpha", as_schedule(self.alpha))
        beta = _checks.finite_number("beta", self.beta)
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must lie in (0, 1], got {beta}")
        set_("beta", beta)
        _checks.one_of("noise", self.noise, NOISE_KINDS)
        _checks.one_of("dtype", self.dtype, ("float32", "float64"))
        _checks.one_of("rng", self.rng, RNG_MODES)
        if self.max_abs is not None:
            set_("max_abs", _checks.positive("max_abs", self.max_abs))
        _checks.fits_dtype(self)

    @property
    def uses_gradient(self) -> bool:
        return self.lambda2 > 0 or self.sigma2 > 0

    early_stop = False


class SDEParams(NamedTuple):
    """Strengths of the SDE terms as arrays (vmappable for parameter sweeps).

    Accepted wherever a :class:`cbo_jax.params.Params` is (``dt`` and the α numbers then
    come from the config); the state itself carries the full ``Params``.
    """

    lambda1: jax.Array
    sigma1: jax.Array
    lambda2: jax.Array
    sigma2: jax.Array


def particles(x: PyTree, label: ArrayLike | None = None, malicious: ArrayLike | None = None,
              pid: ArrayLike | None = None, *, num_runs: int | None = None) -> Particles:
    """Bundle positions with labels (default all ``0``), a malicious mask (default none)
    and ids (default ``0..N-1``). Host-side shape checks.

    With ``num_runs=M`` the positions carry a leading run axis (``(M, N, d)``, for
    ``simulate(..., num_runs=M)``); each other field is given per particle (``(N,)``, the
    same in every run, repeated ``M`` times) or per run and particle (``(M, N)``).
    """
    if num_runs is not None:
        _checks.positive_int("num_runs", num_runs)
        lead = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(x)}
        if lead != {num_runs}:
            raise ValueError(f"with num_runs={num_runs}, every leaf of x needs a leading run axis of {num_runs}, got "
                             f"shapes {[np.shape(v) for v in jax.tree_util.tree_leaves(x)]}")
        given = {"label": label, "malicious": malicious, "pid": pid}
        for name, v in given.items():
            if v is not None and np.ndim(v) == 2 and np.shape(v)[0] != num_runs:
                raise ValueError(f"{name} must have shape (N,) (one per particle, the same in every run) or "
                                 f"({num_runs}, N) (per run), got {np.shape(v)}")
        def row(v, r: int):
            return None if v is None else (np.asarray(v) if np.ndim(v) < 2 else np.asarray(v)[r])

        runs = [particles(jax.tree_util.tree_map(lambda leaf, r=r: leaf[r], x),  # each run checked as one bundle
                          row(label, r), row(malicious, r), row(pid, r))
                for r in range(num_runs)]
        return Particles(x=x, **{k: jnp.stack([getattr(one, k) for one in runs]) for k in given})
    n = pop.num_agents(x)
    label = np.zeros(n, np.int32) if label is None else np.asarray(label)
    malicious = np.zeros(n, bool) if malicious is None else np.asarray(malicious)
    pid = np.arange(n, dtype=np.int32) if pid is None else np.asarray(pid)
    for name, arr in (("label", label), ("malicious", malicious), ("pid", pid)):
        if arr.shape != (n,):
            hint = (f" (x has {n} rows: for runs stacked (M, N, ...), pass num_runs=M)"
                    if arr.ndim in (1, 2) and len(jax.tree_util.tree_leaves(x)[0].shape) > 2 else "")
            raise ValueError(f"{name} must have shape ({n},) (one per particle), got {arr.shape}{hint}")
    for name, arr in (("label", label), ("pid", pid)):  # 1.9 would be truncated to 1
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if malicious.dtype != np.bool_:  # 0.5 and 2 would become True
        raise ValueError(f"malicious must be a boolean mask, got dtype {malicious.dtype}"
                         + (" (a 0/1 array: malicious.astype(bool))" if np.isin(malicious, (0, 1)).all() else ""))
    return Particles(x=x, label=jnp.asarray(label, jnp.int32), malicious=jnp.asarray(malicious, bool),
                     pid=jnp.asarray(pid, jnp.int32))


class Malicious(NamedTuple):
    """Malicious particles' SDE ``dθ = a(t, θ) dt + A(t, θ) dB`` (CB²O eq. (1.7b)).

    Attributes:
      drift: ``a(t, x) -> `` a population like ``x`` (evaluated on every particle;
        only the malicious rows are used).
      diffusion: ``A(t, x) ->`` either a population like ``x`` (diagonal diffusion,
        component-wise with ``dB``) or an ``(N,)`` array (scalar per particle); ``None``
        for a deterministic attacker.
    """

    drift: Callable[[jax.Array, PyTree], PyTree]
    diffusion: Callable[[jax.Array, PyTree], Any] | None = None


class ClusteredState(NamedTuple):
    """State of one run of the clustered / bi-level system.

    Attributes:
      x, label, malicious, pid: the particles (see :class:`Particles`).
      loss: ``(K, N)`` lower-level losses ``L_k(θ_i)`` of every particle for every class.
      energy: ``(K, N)`` energies the consensus weights use (``loss``, or the upper level).
      grad: ``∇L_{k_i}(θ_i)`` per particle when gradient terms are on, else ``None``.
      consensus: the ``K`` consensus points used by the last step (leading axis ``K``).
      alpha: ``(K,)`` α for the next step.
      params: :class:`cbo_jax.params.Params` (the numbers of this run, traced).
      key: PRNG key for the next step.
      step: steps taken; ``time`` = ``step * dt``.
      time: current time ``t``.
      batch, in_batch: the random batch method's state and the mask of the last
        step's batch (``None`` without batches; see :class:`~cbo_jax.dynamics.cbo.CBOState`).
    """

    x: PyTree
    label: jax.Array
    malicious: jax.Array
    pid: jax.Array | np.ndarray
    loss: jax.Array
    energy: jax.Array
    grad: PyTree | None
    consensus: PyTree
    alpha: jax.Array
    params: params_lib.Params
    key: jax.Array
    step: jax.Array
    time: jax.Array
    batch: Any = None
    in_batch: Any = None


def _as_objective_list(name: str, objs) -> list:
    if callable(objs):
        return [objs]
    objs = list(objs)
    if not objs or not all(callable(f) for f in objs):
        raise ValueError(f"{name} must be a callable or a non-empty sequence of callables")
    return objs


def clustered(
    objectives: Callable | Sequence[Callable],
    config: ClusteredConfig | None = None,
    *,
    upper: Callable | Sequence[Callable] | None = None,
    malicious: Malicious | None = None,
    **overrides: Any,
) -> Dynamics:
    """Build the clustered particle system of FedCBO eq. (4) (CB²O (3.10) with ``upper``).

    Args:
      objectives: the ``K`` lower-level objectives ``L_k``, each mapping a population
        to ``(N,)`` losses (every :mod:`cbo_jax.objectives` function qualifies).
      config: a :class:`ClusteredConfig`; keyword ``overrides`` replace its fields.
      upper: optional upper-level objective(s) ``G``: one callable shared by every
        class, or ``K`` of them. The consensus weights become ``exp(-α G)`` on the
        β-quantile sub-level set of ``L_k`` (CB²O eq. (1.3)–(1.4)).
      malicious: the attackers' SDE, applied to particles marked malicious.

    Returns a :class:`~cbo_jax.dynamics.base.Dynamics`. ``init(p, key)`` takes a
    :class:`Particles` (from :func:`particles`); :func:`cbo_jax.simulate` runs it.
    """
    config = _checks.config_with("clustered", ClusteredConfig, config, overrides)
    lower = _as_objective_list("objectives", objectives)
    uppers = None if upper is None else _as_objective_list("upper", upper)
    if uppers is not None and len(uppers) not in (1, len(lower)):
        raise ValueError(f"upper must be one objective or K={len(lower)} of them, got {len(uppers)}")
    if malicious is not None and not isinstance(malicious, Malicious):
        raise ValueError("malicious must be a cbo_jax.dynamics.clustered.Malicious(drift, diffusion)")
    system = _System(config, lower, uppers, malicious)
    init, step, drive = (with_rng_layout(config.rng, fn) for fn in (system.init, system.step, system.drive))
    return Dynamics(init=init, step=step, config=config, objective=system.losses, check=system.check,
                    record=system.record, drive=drive)


class _System:
    """The clustered system's ``init`` and ``step``, phase by phase (built by :func:`clustered`):
    ``batch`` and ``consensus`` (the ``K`` points, over the β-quantile sets of CB²O), ``move``
    (Euler–Maruyama, :func:`cbo_jax.sde.euler_maruyama`, and the attackers' own SDE), then the
    evaluation and the α schedules."""

    def __init__(self, config: ClusteredConfig, lower: list, uppers: list | None, malicious: Malicious | None):
        self.config, self.lower, self.uppers, self.malicious = config, lower, uppers, malicious
        self.k_classes = len(lower)
        self.dtype = jnp.dtype(config.dtype)
        self.default_params = params_lib.defaults(config)
        self.beta = config.beta if uppers is not None else 1.0

    # --- energies ------------------------------------------------------------------------------

    def losses(self, x):
        """``(K, N)`` lower-level losses."""
        return jnp.stack([f(x) for f in self.lower])

    def energies(self, x, loss):
        """``(K, N)`` energies of the consensus weights: the losses, or the upper level."""
        if self.uppers is None:
            return loss
        g = jnp.stack([f(x) for f in self.uppers])
        return jnp.broadcast_to(g, loss.shape)

    def evaluate(self, x, label):
        """``(K, N)`` losses and ``∇L_{k_i}(θ_i)`` (``None`` without gradient terms)."""
        if not self.config.uses_gradient:
            return self.losses(x), None

        def own_total(x):
            loss = self.losses(x)
            own = jnp.take_along_axis(loss, label[None, :], axis=0)[0]
            return jnp.sum(own), loss

        (_, loss), g = jax.value_and_grad(own_total, has_aux=True)(x)
        return loss, g

    # --- phases ----------------------------------------------------------------------------------

    def consensus(self, x, loss, energy, alpha, in_batch=None, rows: int | None = None):
        """The ``K`` consensus points (leading axis ``K``); with ``rows``, a streaming reduction
        over blocks of that many particles."""
        mask = in_batch if in_batch is None else jnp.broadcast_to(in_batch, loss.shape)
        if self.beta < 1.0:
            mask = quantile_mask(loss, self.beta, mask)
        if rows is not None and rows < loss.shape[-1]:
            return streaming_consensus_point(x, energy, alpha, mask, chunk=rows)
        return consensus_point(x, energy, alpha, mask)

    def block_rows(self, n: int, blocking: bool = True) -> int:
        """Rows per block of a step of ``n`` particles (see :meth:`cbo_jax.dynamics.core.Engine.block_rows`)."""
        if any(getattr(f, "host", False) for f in self.lower + list(self.uppers or [])):
            return n  # a host objective (objectives.from_numpy): one call per step
        if self.config.particle_chunk is not None:
            return min(self.config.particle_chunk, n)
        if not blocking or self.config.rng not in INVARIANT_LAYOUTS:
            return n
        return auto_block_rows(n)

    def init(self, p: Particles, key: jax.Array, params: params_lib.Params | SDEParams | None = None) -> ClusteredState:
        config, dtype = self.config, self.dtype
        _checks.x64_for(config)  # at trace time: a float64 run in 32-bit JAX would be float32 throughout
        key = _checks.as_key("key", key)  # an integer seed (64 bits); anything but a key or a seed is refused
        x0 = jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype), p.x)
        prm = params_lib.in_dtype(self.default_params if params is None else params_lib.as_params(params, config),
                                  dtype)
        loss, grad = self.evaluate(x0, p.label)
        energy = self.energies(x0, loss)
        alpha = jnp.full((self.k_classes,), params_lib.alpha_init(config.alpha, prm.alpha), dtype)
        return ClusteredState(
            x=x0, label=p.label, malicious=p.malicious, pid=p.pid, loss=loss, energy=energy, grad=grad,
            consensus=self.consensus(x0, loss, energy, alpha), alpha=alpha, params=prm,
            key=key, step=jnp.zeros((), jnp.int32), time=jnp.zeros((), dtype),
            batch=None if config.batch_size is None else batching.init(loss.shape[1]),
            in_batch=None if config.batch_size is None else jnp.ones(loss.shape[1:], bool),
        )

    def normal(self, pid):
        """The draw function of the particles ``pid``."""
        # The draw is computed in a kernel of its own on XLA:CPU (normal_like does so itself):
        # fused into the gather-and-update, the per-particle draw runs 1.7x slower. Written out
        # here, not in sde.per_particle_normal: there it gains the CBX family little (1.03x) and
        # moves the pinned FedCBO runs by float32 rounding (benchmarks/RESULTS_cbx.md, the A/B of the
        # written-out draw).
        if self.config.rng == "per-particle":
            return lambda key, tree: jax.tree_util.tree_map(lambda z: written_out(z, key),
                                                            per_particle_normal(key, tree, pid))
        if self.config.rng == "counter":
            return lambda key, tree: counter_normal(key, tree, pid)
        return normal_like

    def move(self, x, grad, label, bad_mask, pid, m, prm, t, k_benign, k_mal, in_batch):
        """Euler–Maruyama (eq. (15)) for the rows ``x`` (all, or one chunk), the attackers'
        own SDE (CB²O eq. (1.7b)), clipping, the partial batch update and the evaluation:
        ``(x, loss, energy, grad)``."""
        config, malicious = self.config, self.malicious
        m_own = pop.gather(m, label)  # each particle's own class's consensus point
        normal = self.normal(pid)
        # Static zeros leave a term out entirely; otherwise the (traced) state value is used.
        strength = lambda name: 0.0 if getattr(config, name) == 0 else getattr(prm, name)  # noqa: E731
        new = euler_maruyama(
            k_benign, x, m_own, dt=prm.dt, lambda1=prm.lambda1, sigma1=strength("sigma1"),
            noise=config.noise, grad=grad, lambda2=strength("lambda2"), sigma2=strength("sigma2"),
            normal=normal,
        )
        if malicious is not None:
            bad = jax.tree_util.tree_map(lambda xi, ai: xi + prm.dt * ai, x, malicious.drift(t, x))
            if malicious.diffusion is not None:
                a_diff = malicious.diffusion(t, x)
                z = normal(k_mal, x)
                sq = jnp.sqrt(prm.dt)
                if isinstance(a_diff, jax.Array) and a_diff.ndim == 1:  # one scalar per particle
                    kick = pop.tree_scale_rows(z, a_diff)
                else:
                    kick = jax.tree_util.tree_map(jnp.multiply, a_diff, z)
                bad = jax.tree_util.tree_map(lambda bi, ki: bi + sq * ki, bad, kick)
            new = pop.tree_where_rows(bad_mask, bad, new)
        new = clip(new, config.max_abs)
        if in_batch is not None and config.batch_partial:  # only the batch's particles move
            new = pop.tree_where_rows(in_batch, new, x)
        loss, g = self.evaluate(new, label)
        return new, loss, self.energies(new, loss), g

    def advance(self, state: ClusteredState, m, k_benign, k_mal, in_batch, rows: int):
        """New positions, ``(K, N)`` losses and energies, and gradients of every particle, in blocks
        of ``rows`` particles updated in place (one block: all at once)."""
        args = (state.x, state.grad, state.label, state.malicious, state.pid)
        n = state.label.shape[0]
        if rows >= n:
            return self.move(*args, m, state.params, state.time, k_benign, k_mal, in_batch)
        invariant = self.config.rng in INVARIANT_LAYOUTS

        def body(c, bufs):
            x_buf, loss_buf, e_buf, g_buf = bufs
            start = jnp.minimum(c * rows, n - rows)  # the last block ends at N; its rows already done are kept
            fresh = start + jnp.arange(rows) >= c * rows
            take = lambda tree, axis=0: pop.slice_rows(tree, start, rows, axis)  # noqa: E731
            # Invariant layouts draw by particle id; the others draw block c from fold_in(key, c).
            fold = (lambda k: k) if invariant else (lambda k: jax.random.fold_in(k, c))
            x_old, loss_old, e_old, g_old = take(x_buf), take(loss_buf, 1), take(e_buf, 1), take(g_buf)
            new, loss, energy, g = self.move(
                x_old, g_old, take(state.label), take(state.malicious), take(state.pid), m, state.params,
                state.time, fold(k_benign), fold(k_mal), None if in_batch is None else take(in_batch))
            keep = lambda a, b, axis=0: jax.tree_util.tree_map(  # noqa: E731
                lambda u, v: jnp.where(fresh.reshape((1,) * axis + (-1,) + (1,) * (u.ndim - axis - 1)), u, v), a, b)
            put = lambda buf, v, axis=0: pop.update_rows(buf, v, start, axis)  # noqa: E731
            return (put(x_buf, keep(new, x_old)), put(loss_buf, keep(loss, loss_old, 1), 1),
                    put(e_buf, keep(energy, e_old, 1), 1), None if g_buf is None else put(g_buf, keep(g, g_old)))

        # The buffers are updated in place, block by block: no (N, d) temporary besides x.
        return jax.lax.fori_loop(0, -(-n // rows), body, (state.x, state.loss, state.energy, state.grad))

    def step(self, state: ClusteredState, m_given=None, blocking: bool = True) -> ClusteredState:
        """One step (toward the ``K`` points ``m_given`` instead of the particles' own); ``blocking``:
        in blocks of :meth:`block_rows` particles where the noise layout allows it."""
        config, prm = self.config, state.params
        rows = self.block_rows(state.label.shape[0], blocking)
        batch, in_batch = state.batch, None
        if config.batch_size is not None:
            in_batch, batch = batching.next_batch(state.batch, state.key, config.batch_size)
        if m_given is None:
            m = self.consensus(state.x, state.loss, state.energy, state.alpha, in_batch, rows)  # leading axis K
        else:
            m = m_given
        key, k_benign, k_mal = jax.random.split(state.key, 3)
        new, loss, energy, grad = self.advance(state, m, k_benign, k_mal, in_batch, rows)
        return ClusteredState(
            x=new, label=state.label, malicious=state.malicious, pid=state.pid, loss=loss,
            energy=energy, grad=grad, consensus=m,
            alpha=jax.vmap(lambda a, e: params_lib.alpha_update(config.alpha, a, e, prm.alpha, in_batch))(
                state.alpha, state.energy).astype(self.dtype),
            params=prm, key=key, step=state.step + 1, batch=batch, in_batch=in_batch,
            time=(state.step + 1).astype(self.dtype) * prm.dt,  # step · dt: a running sum drifts in float32
        )

    def drive(self, state: ClusteredState, m: PyTree, blocking: bool = True) -> ClusteredState:
        """One step toward the given ``K`` consensus points ``m`` (leading axis ``K``) instead
        of the particles' own, with exactly the noise (and random batch) of :meth:`step`."""
        return self.step(state, jax.tree_util.tree_map(lambda v, c: jnp.asarray(v, c.dtype), m, state.consensus),
                         blocking)

    # --- host side -------------------------------------------------------------------------------

    def check(self, name: str, p, num_runs: int | None = None) -> int:
        """Host checks of a :class:`Particles` bundle (one run, or ``num_runs`` runs)."""
        if not isinstance(p, Particles):
            raise ValueError(f"{name} must be a Particles bundle: cbo_jax.dynamics.clustered.particles(x, label, ...)")
        n = check_population(f"{name}.x", p.x, self.lower[0], num_runs)
        single = jax.tree_util.tree_map(lambda leaf: leaf[0], p.x) if num_runs is not None else p.x
        for what, fs in (("lower objective", self.lower), ("upper objective", self.uppers or [])):
            for i, f in enumerate(fs):
                if not (what == "lower objective" and i == 0):  # checked with the population above
                    check_objective(f"{name}.x", f, single, n, what=f"{what} {i}")
        for field in ("label", "malicious", "pid"):
            want = (num_runs, n) if num_runs is not None else (n,)
            if np.shape(getattr(p, field)) != want:
                per = f"one per particle of each of the {num_runs} runs" if num_runs is not None else "one per particle"
                fix = (": build the bundle with particles(x, label, ..., num_runs=M), which repeats one run's "
                       "fields" if num_runs is not None and np.shape(getattr(p, field)) == (n,) else "")
                raise ValueError(f"{name}.{field} must have shape {want} ({per}), got "
                                 f"{np.shape(getattr(p, field))}{fix}")
        self._check_roles(name, p)
        return n

    def _check_roles(self, name: str, p) -> None:
        lab = np.asarray(p.label)
        if lab.size and (lab.min() < 0 or lab.max() >= self.k_classes):
            raise ValueError(f"{name}.label must lie in [0, K) with K={self.k_classes}, got range "
                             f"[{lab.min()}, {lab.max()}]")
        benign = ~np.asarray(p.malicious, bool)
        per_run = np.atleast_2d(benign).reshape(-1, benign.shape[-1]) if benign.ndim else benign.reshape(1, 1)
        empty = ~per_run.any(axis=1)  # every run needs one: its consensus is over benign particles only
        if empty.any():
            which = f" in run {int(np.argmax(empty))}" if per_run.shape[0] > 1 else ""
            raise ValueError(f"{name} has no benign particle{which}")
        if self.malicious is None and not benign.all():  # the marks would do nothing: they would move as benign ones
            raise ValueError(f"{name} marks {int((~benign).sum())} particles malicious, but these dynamics have no "
                             "attackers' SDE: build them with malicious=Malicious(drift, diffusion)")

    @staticmethod
    def record(state: ClusteredState) -> dict:
        e = jnp.where(jnp.isnan(state.energy), jnp.inf, state.energy)
        return {"min_energy": jnp.min(e, axis=-1), "alpha": state.alpha}


def cb2o(
    lower: Callable,
    upper: Callable,
    config: ClusteredConfig | None = None,
    *,
    malicious: Malicious | None = None,
    **overrides: Any,
) -> Dynamics:
    """The single-class CB²O system, eq. (1.2)–(1.5): minimise ``G`` over the minimisers of ``L``.

    Consensus weights ``exp(-α G)`` on the β-quantile sub-level set of ``L``;
    ``beta`` is a :class:`ClusteredConfig` field. Without ``config`` it defaults to ``0.5``
    here; a ``config`` given is used as it is, and :class:`ClusteredConfig`'s own default
    ``beta=1.0`` keeps every particle in the quantile set, so the lower level then plays no
    part in the weights: set ``beta`` in the config.
    """
    if config is None:
        overrides.setdefault("beta", 0.5)
    return clustered([lower], config, upper=upper, malicious=malicious, **overrides)
