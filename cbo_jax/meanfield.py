"""Mean-field diagnostics of the (clustered) CBO particle systems.

* :func:`class_variance`: ``V(ρ^k_t) = ½ ∫ |θ - θ*_k|² dρ^k_t`` for the empirical
  measure of each class (FedCBO Theorem 2.3).
* :func:`predicted_decay_rate`: the exponent of Theorem 2.3,
  ``2λ1 - 2λ2 M - d σ1² - d σ2² M²`` (isotropic noise; ``M`` the Lipschitz constant of
  the gradients), and its anisotropic counterpart.
* :func:`fit_decay_rate`: the exponent fitted from a simulated ``V_t``.
* :func:`sliced_wasserstein`: the sliced 1-Wasserstein (or p-Wasserstein) distance
  between two empirical measures of any sizes, exact per direction, vectorised over
  directions: the distance between an ``N``-particle system and a large-``N``
  reference (Theorem 2.2's mean-field limit, compared in law; not a propagation-of-chaos
  test, see below).
* :func:`fit_loglog_slope`: slope of ``log(error)`` against ``log(N)``.
* :func:`reference_consensus` and :func:`coupling`: propagation of chaos measured
  pathwise, as in the FedCBO JMLR version's Proposition 1, eq. (50). Each of the ``N``
  particles ``θ^i`` gets a mean-field copy ``θ̄^i`` started at the same point and driven
  by the same Brownian increments, whose consensus point is that of the mean-field law
  ``ρ_t`` instead of the ``N`` particles'; ``m_α(ρ_t)`` is taken from a large independent
  reference ensemble. Eq. (50) bounds ``E|θ^i_t - θ̄^i_t|² <= C (1/N_1 + 1/N_2)``, so the
  measured mean squared distance falls like ``1/N`` (log-log slope ``-1``).

What the two N-scaling measurements test. :func:`sliced_wasserstein` against a large
reference compares *distributions*: an empirical measure of ``N`` independent samples of
``ρ_T`` is already ``O(N^{-1/2})`` away from ``ρ_T``, so a slope of ``-1/2`` there shows the
particle system's law is close to ``ρ_T`` but cannot tell interacting particles from
independent ones (``cbo-jax reproduce meanfield-scaling``). :func:`coupling` compares
*trajectories*: it is zero for independent copies only if the interaction itself is
replaced by the mean-field one, and its ``1/N`` rate is the quantitative propagation of
chaos (``cbo-jax reproduce meanfield-coupling``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop

PyTree = Any

__all__ = [
    "class_variance",
    "predicted_decay_rate",
    "ideal_quadratic_rate",
    "fit_decay_rate",
    "sliced_wasserstein",
    "SlicedReference",
    "random_directions",
    "sorted_projections",
    "fit_loglog_slope",
    "reference_consensus",
    "coupling",
    "CouplingResult",
]


def class_variance(x: PyTree, label: jax.Array, centers: PyTree, include: jax.Array | None = None) -> jax.Array:
    """``V^k = ½ mean_{i : label_i = k} |θ_i - θ*_k|²`` for every class ``k``.

    Args:
      x: population ``(N, d)`` or stacked pytree.
      label: ``(N,)`` integer classes in ``[0, K)``.
      centers: the ``K`` reference points ``θ*_k`` (leading axis ``K``).
      include: optional ``(N,)`` boolean (for example the benign particles).

    Returns ``(K,)``; a class with no particle gets NaN. A label outside ``[0, K)`` is a
    ``ValueError`` when the labels are concrete; traced (under ``jit``), such a particle
    counts in no class. Excluded particles never enter a class's value (a NaN position
    of an excluded particle leaves the other classes finite).
    """
    _check_class_shapes(x, label, centers, include)
    k = jax.tree_util.tree_leaves(centers)[0].shape[0]
    if not isinstance(label, jax.core.Tracer):
        lab = np.asarray(label)
        bad = np.flatnonzero((lab < 0) | (lab >= k))
        if bad.size:
            raise ValueError(f"label must lie in [0, {k}) (one class per centre); particle {int(bad[0])} has "
                             f"{lab[bad[0]].item()!r} ({bad.size} outside)")
    diff = pop.tree_sub(x, pop.gather(centers, label))
    sq = 0.5 * pop.sq_norms(diff)
    onehot = jax.nn.one_hot(label, k, dtype=sq.dtype).T  # (K, N); no 1 for a label outside [0, K)
    if include is not None:
        onehot = onehot * jnp.asarray(include).astype(sq.dtype)[None, :]
    # Rows counted in no class are zeroed: 0 * NaN in the product would make every class NaN.
    sq = jnp.where(jnp.sum(onehot, axis=0) > 0, sq, 0)
    count = jnp.sum(onehot, axis=-1)
    return jnp.where(count > 0, (onehot @ sq) / jnp.maximum(count, 1), jnp.nan)


def _check_class_shapes(x, label, centers, include) -> None:
    """Shapes only (static, so also under ``jit``): mismatches would be TypeErrors from jnp's broadcasting."""
    leaves = jax.tree_util.tree_leaves(x)
    c_leaves = jax.tree_util.tree_leaves(centers)
    if not leaves or not c_leaves or any(np.ndim(v) < 1 for v in leaves + c_leaves):
        raise ValueError("class_variance: x and centers need a leading axis (N particles, K centres)")
    n, k = np.shape(leaves[0])[0], np.shape(c_leaves[0])[0]
    if np.shape(label) != (n,):
        runs = len(np.shape(label)) == 1 and np.ndim(leaves[0]) >= 3 and np.shape(leaves[0])[1] == np.shape(label)[0]
        hint = (f" (x looks like {n} runs stacked, {np.shape(leaves[0])}: class_variance takes one run's particles; "
                "for every run, jax.vmap(class_variance, in_axes=(0, None, None))(x, label, centers))" if runs else "")
        raise ValueError(f"class_variance: label must have shape ({n},), one class per particle, got "
                         f"{np.shape(label)}{hint}")
    if not jnp.issubdtype(jnp.result_type(label), jnp.integer):
        raise ValueError(f"class_variance: label must hold integers, got dtype {jnp.result_type(label)}")
    if include is not None and np.shape(include) != (n,):
        raise ValueError(f"class_variance: include must have shape ({n},), one flag per particle, got "
                         f"{np.shape(include)}")
    structure_x, structure_c = jax.tree_util.tree_structure(x), jax.tree_util.tree_structure(centers)
    same = bool(structure_x == structure_c) and all(  # type: ignore[operator]
        np.shape(c) == (k,) + np.shape(v)[1:] for v, c in zip(leaves, c_leaves))
    if not same:
        raise ValueError(f"class_variance: centers must be K points shaped like one particle, leaves "
                         f"{[(k,) + np.shape(v)[1:] for v in leaves]}; got {[np.shape(c) for c in c_leaves]}")


def _rate_inputs(where: str, lambda1, lambda2, sigma1, sigma2, noise):
    """``(λ1, λ2, σ1, σ2, noise)`` from four numbers, or from dynamics, a config or a
    :class:`~cbo_jax.params.Params` given first (its numbers in its own order, and for a
    dynamics or config its noise kind)."""
    from cbo_jax import params as params_lib

    source = lambda1
    config = getattr(source, "config", source)
    if not (isinstance(source, params_lib.Params) or all(hasattr(config, f) for f in params_lib.SDE_FIELDS)):
        if noise is None:
            noise = "isotropic"  # the theorem's setting
        if any(v is None for v in (lambda2, sigma1, sigma2)):
            raise ValueError(f"{where} takes (lambda1, lambda2, sigma1, sigma2), in the theorem's order, or dynamics, "
                             "a config or a cbo_jax.params.Params first")
        return lambda1, lambda2, sigma1, sigma2, _checks.one_of("noise", noise, ("isotropic", "anisotropic"))
    if not (lambda2 is None and sigma1 is None and sigma2 is None):
        raise ValueError(f"{where}: give the numbers either as dynamics, a config or Params, or as four numbers, "
                         "not both")
    prm = source if isinstance(source, params_lib.Params) else params_lib.defaults(config)
    if noise is None:
        kind = getattr(config, "noise_kind", getattr(config, "noise", None))
        if isinstance(source, params_lib.Params):
            raise ValueError(f"{where}: Params carry no noise kind; pass noise='isotropic' or 'anisotropic' (or "
                             "the dynamics, whose config names it)")
        if kind not in ("isotropic", "anisotropic"):
            raise ValueError(f"{where}: Theorem 2.3's rate is for isotropic or anisotropic consensus noise; these "
                             f"dynamics have noise={kind!r}")
        noise = kind
    arrays = [np.asarray(v, np.float64) for v in (prm.lambda1, prm.lambda2, prm.sigma1, prm.sigma2)]
    values = [float(a) if a.ndim == 0 else a for a in arrays]  # a grid's leaves: the rates elementwise
    return (*values, _checks.one_of("noise", noise, ("isotropic", "anisotropic")))


def predicted_decay_rate(lambda1, lambda2=None, sigma1=None, sigma2=None, d: int | None = None,
                         lipschitz: float | None = None, noise: str | None = None):
    """Decay exponent of ``V(ρ^k_t)`` predicted by FedCBO Theorem 2.3 (with ``τ → 0``).

    ``2λ1 - 2λ2 M - d σ1² - d σ2² M²`` for isotropic consensus noise (the theorem's
    setting). For anisotropic noise ``σ1 (θ - m) ∘ dB`` the Itô correction is
    ``σ1² |θ - m|²`` instead of ``d σ1² |θ - m|²``, so ``d σ1²`` becomes ``σ1²`` (the
    gradient noise is isotropic in both cases). The theorem needs the result ``> 0``.
    Works elementwise on arrays.

    The numbers are four arguments in the theorem's order ``(λ1, λ2, σ1, σ2)`` (``noise``
    then defaults to ``"isotropic"``), or one argument: dynamics or their config (numbers and
    noise kind from it), or a :class:`cbo_jax.params.Params`, whose order is ``λ1, σ1, λ2,
    σ2`` (a sweep grid gives the grid's rates; give ``noise``), e.g.
    ``predicted_decay_rate(dyn, d=2, lipschitz=1.0)``.
    """
    if d is None or lipschitz is None:
        raise ValueError("predicted_decay_rate needs the dimension d= and the gradients' Lipschitz constant "
                         "lipschitz= (0 without gradient terms)")
    _checks.positive_int("d", d)
    lambda1, lambda2, sigma1, sigma2, noise = _rate_inputs("predicted_decay_rate", lambda1, lambda2, sigma1, sigma2,
                                                           noise)
    # float() would refuse an array of constants ("works elementwise"); a scalar stays a float
    lip_arr = np.asarray(lipschitz, np.float64)
    if not np.all(np.isfinite(lip_arr)) or np.any(lip_arr < 0):  # -1 would turn a failed condition into a faster rate
        raise ValueError(f"predicted_decay_rate: lipschitz (M of Theorem 2.3) must be finite and >= 0, got {lipschitz!r}")
    lip: float | np.ndarray = float(lip_arr) if lip_arr.ndim == 0 else lip_arr
    c1 = d if noise == "isotropic" else 1
    return 2 * lambda1 - 2 * lambda2 * lip - c1 * np.square(sigma1) - d * np.square(sigma2) * lip**2


def ideal_quadratic_rate(lambda1, lambda2=None, sigma1=None, sigma2=None, d: int | None = None,
                         noise: str | None = None):
    """Exact decay exponent of ``E|θ - θ*|²`` for ``L = ½|θ - θ*|²`` when ``m = θ*``.

    Itô on ``|u|²`` with ``u = θ - θ*``: drift ``-2(λ1 + λ2)|u|²``, consensus noise
    ``d σ1² |u|²`` (isotropic; ``σ1² |u|²`` anisotropic), gradient noise ``d σ2² |u|²``.
    Theorem 2.3 bounds the gradient drift by ``-2λ2 M`` from the wrong side (it allows
    any ``L`` with ``M``-Lipschitz gradient), so for this ``L`` the measured rate
    should sit near this value, above the theorem's. The numbers are given as for
    :func:`predicted_decay_rate`.
    """
    if d is None:
        raise ValueError("ideal_quadratic_rate needs the dimension d=")
    _checks.positive_int("d", d)
    lambda1, lambda2, sigma1, sigma2, noise = _rate_inputs("ideal_quadratic_rate", lambda1, lambda2, sigma1, sigma2,
                                                           noise)
    c1 = d if noise == "isotropic" else 1
    return 2 * (lambda1 + lambda2) - c1 * np.square(sigma1) - d * np.square(sigma2)


def fit_decay_rate(t, v, *, t_min: float | None = None, floor_factor: float = 10.0) -> float:
    """Exponent ``r`` of ``v(t) ≈ C exp(-r t)`` by least squares on ``log v``.

    Uses the points with ``t >= t_min`` (default: the first 5 % of the horizon is
    skipped as transient) and ``v > floor_factor · min(v)`` (the finite-``N``,
    finite-``α`` floor where the decay stops is excluded; on a run too short to
    decay by ``floor_factor²``, the bottom quarter of the log range is excluded
    instead). Needs at least 3 points.
    """
    t = np.asarray(t, np.float64)
    v = np.asarray(v, np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(f"t and v must be 1-D of the same length, got {t.shape} and {v.shape}")
    if t.size < 3:  # an empty t would be an IndexError
        raise ValueError(f"fitting a decay rate needs at least 3 points, got {t.size}")
    t_min = t[0] + 0.05 * (t[-1] - t[0]) if t_min is None else t_min
    ok = np.isfinite(v) & (v > 0) & (t >= t_min)
    if np.any(ok):
        lo, hi = np.log(np.min(v[ok])), np.log(v[ok][0])
        # Above the floor: 10x its level, or the top 3/4 of the log range on short runs.
        ok &= np.log(np.where(v > 0, v, 1.0)) > lo + min(np.log(floor_factor), 0.25 * (hi - lo))
    if np.sum(ok) < 3:
        raise ValueError("fewer than 3 points above the floor: run longer or lower floor_factor")
    slope, _ = np.polyfit(t[ok], np.log(v[ok]), 1)
    return float(-slope)


def _quantile_grid(n: int, r: int, dtype):
    """Merged breakpoints of two empirical quantile functions with n and r atoms.

    Returns the widths of the pieces of ``(0, 1)`` on which both quantile functions
    are constant and, for each piece, the atom index into each sorted sample.
    """
    levels = np.unique(np.concatenate([np.arange(1, n + 1) / n, np.arange(1, r + 1) / r]))
    levels[-1] = 1.0
    lower = np.concatenate([[0.0], levels[:-1]])
    mid = 0.5 * (lower + levels)
    widths = levels - lower
    ix = np.minimum((mid * n).astype(np.int64), n - 1)
    iy = np.minimum((mid * r).astype(np.int64), r - 1)
    return jnp.asarray(widths, dtype), jnp.asarray(ix, jnp.int32), jnp.asarray(iy, jnp.int32)


def random_directions(key: jax.Array, num: int, d: int, dtype=jnp.float32) -> jax.Array:
    """``num`` directions drawn uniformly on the unit sphere of ``R^d``: ``(num, d)`` (``key`` may be a seed)."""
    theta = jax.random.normal(_checks.as_key("key", key), (num, d), dtype)
    return theta / jnp.linalg.norm(theta, axis=-1, keepdims=True)


@jax.jit
def sorted_projections(y: jax.Array, directions: jax.Array) -> jax.Array:
    """``(P, R)``: the samples ``y`` projected on each direction, sorted."""
    return jnp.sort(directions @ y.T, axis=-1)


@functools.partial(jax.jit, static_argnames=("p",))
def _sw_from_sorted(x, directions, py, widths, ix, iy, *, p: float):
    px = sorted_projections(x, directions)  # (P, N)
    per_dir = jax.lax.map(lambda ab: jnp.sum(widths * jnp.abs(ab[0][ix] - ab[1][iy]) ** p), (px, py))
    return jnp.mean(per_dir) ** (1.0 / p)


def _as_samples(name, x):
    x = pop.ravel(x)[0] if not isinstance(x, (jax.Array, np.ndarray)) else jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be (n, d) samples, got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sample, got shape {x.shape}")
    return x


def sliced_wasserstein(x, y, key: jax.Array, *, num_projections: int = 64, p: float = 1.0) -> jax.Array:
    """Sliced ``p``-Wasserstein distance between the empirical measures of ``x`` and ``y``.

    ``SW_p(μ, ν)^p = E_θ W_p(θ·μ, θ·ν)^p`` over uniformly random directions ``θ`` on the
    sphere (``num_projections`` of them, drawn from ``key``). Each 1-D distance is the
    exact ``∫_0^1 |F^{-1}(u) - G^{-1}(u)|^p du`` of the two empirical quantile
    functions (sizes may differ; the integral runs over their merged breakpoints).
    Cost ``O(P (N + R) log(N + R))``.

    Args:
      x: ``(N, d)`` samples (or a stacked pytree, raveled per particle).
      y: ``(R, d)`` samples.

    To compare many samples with one large reference, see :class:`SlicedReference`
    (the reference is projected and sorted once). A NaN or infinite sample gives a NaN or
    infinite distance: it is not dropped, since a diverged particle is part of what is measured.
    """
    return SlicedReference(y, key, num_projections=num_projections, p=p).distance(x)


class SlicedReference:
    """A reference sample projected on fixed random directions and sorted once.

    ``ref.distance(x)`` is :func:`sliced_wasserstein` between ``x`` and the reference,
    on the same directions for every ``x`` (so distances of different samples are
    directly comparable and the reference's sort is not repeated).
    """

    def __init__(self, y, key: jax.Array, *, num_projections: int = 64, p: float = 1.0):
        _checks.positive_int("num_projections", num_projections)
        self.p = float(_checks.positive("p", p))
        y = _as_samples("y", y)
        self.d, self.size, self.dtype = y.shape[1], y.shape[0], y.dtype
        self.directions = random_directions(key, num_projections, self.d, y.dtype)
        self.sorted = sorted_projections(y, self.directions)

    def distance(self, x) -> jax.Array:
        x = _as_samples("x", x)
        if x.shape[1] != self.d:
            raise ValueError(f"x has dimension {x.shape[1]}, the reference {self.d}")
        dtype = jnp.result_type(x.dtype, self.dtype)
        widths, ix, iy = _quantile_grid(x.shape[0], self.size, dtype)
        return _sw_from_sorted(x.astype(dtype), self.directions.astype(dtype), self.sorted.astype(dtype), widths,
                               ix, iy, p=self.p)


def fit_loglog_slope(n, err) -> float:
    """Least-squares slope of ``log(err)`` against ``log(n)``."""
    n = np.asarray(n, np.float64)
    err = np.asarray(err, np.float64)
    if n.shape != err.shape or n.size < 2 or np.any(n <= 0) or np.any(err <= 0):
        raise ValueError("need at least 2 positive (n, err) pairs of equal length")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(err))):  # a NaN slope, or numpy's LinAlgError
        raise ValueError(f"n and err must be finite, got n = {n.tolist()}, err = {err.tolist()}")
    if np.unique(n).size < 2:  # one distinct n: no line through it (np.polyfit returns noise)
        raise ValueError(f"need at least 2 different n, got n = {n.tolist()}")
    return float(np.polyfit(np.log(n), np.log(err), 1)[0])


def reference_consensus(dynamics, x_ref, key, num_steps: int, **simulate_kwargs) -> np.ndarray:
    """The consensus points ``m_α(ρ^R_t)`` of a reference ensemble at every step: ``(T, ...)``.

    Runs :func:`cbo_jax.simulate` on ``x_ref`` (``R`` independent samples of ``ρ_0``, for
    example ``1e6``; build ``dynamics`` with ``particle_chunk`` for a large ``R``) and
    returns row ``t`` = the consensus point the ``(t+1)``-th step used (one per class for
    the clustered system: ``(T, K, d)``). It approximates ``m_α(ρ_t)`` of the mean-field
    law up to ``O(R^{-1/2})``; pass it to :func:`coupling`. ``simulate_kwargs`` go to
    :func:`cbo_jax.simulate` (``progress``, ``chunk_size``, ``params`` for one point of other
    numbers, which :func:`coupling` must then be given too, ...).
    """
    from cbo_jax.simulate import simulate

    res = simulate(dynamics, x_ref, key, num_steps, record_consensus=True, **simulate_kwargs)
    return res.history["consensus"]


class CouplingResult(NamedTuple):
    """What :func:`coupling` returns.

    Attributes:
      sq_distance: ``(T + 1,)``, or ``(M, T + 1)`` with runs: the mean over the (benign)
        particles ``i`` of ``|θ^i_t - θ̄^i_t|²`` after ``t`` steps (``0`` at ``t = 0``); its
        mean over runs estimates ``E|θ^i_t - θ̄^i_t|²`` of eq. (50).
      final_x: the ``N``-particle system's final positions.
      final_copies: the mean-field copies' final positions.
    """

    sq_distance: np.ndarray
    final_x: Any
    final_copies: Any


@functools.partial(jax.jit, static_argnames=("init", "step", "drive", "batched"))
def _coupled(x0, key, path, params, *, init, step, drive, batched: bool):
    # static: the dynamics' functions (hashed by identity), not the Dynamics itself, whose
    # config need not be hashable (a schedule dict)
    def one(x0, key):
        system = init(x0, key) if params is None else init(x0, key, params)
        copies = system  # the same initial points and the same key: the same Brownian increments

        def dist(a, b):
            d2 = pop.sq_norms(pop.tree_sub(a.x, b.x))
            benign = ~a.malicious if hasattr(a, "malicious") else jnp.ones(d2.shape, bool)
            return jnp.sum(jnp.where(benign, d2, 0)) / jnp.maximum(jnp.sum(benign), 1)

        def body(carry, m_t):
            system, copies = carry
            system = step(system)
            copies = drive(copies, m_t)
            return (system, copies), dist(system, copies)

        (system, copies), d2 = jax.lax.scan(body, (system, copies), path)
        return jnp.concatenate([jnp.zeros((1,), d2.dtype), d2]), system.x, copies.x

    return jax.vmap(one)(x0, key) if batched else one(x0, key)


def _check_path_fits(dynamics, x0, key, path, num_runs) -> None:
    """Each step of ``path`` must have the shape of these dynamics' consensus point (shapes only,
    nothing runs): a path of another dimension, or one with a run axis, would fail inside the
    ``lax.scan`` (a carry of another shape), and a ``(T, 1)`` path would broadcast silently."""
    one = (lambda v: v[0]) if num_runs is not None else (lambda v: v)  # noqa: E731
    single = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(
        np.shape(leaf)[1 if num_runs else 0:], leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype), x0)
    want = jax.eval_shape(dynamics.init, single, one(key)).consensus
    got_steps = jax.tree_util.tree_map(lambda leaf: tuple(leaf.shape[1:]), path)
    want_steps = jax.tree_util.tree_map(lambda leaf: tuple(leaf.shape), want)
    same = jax.tree_util.tree_structure(path) == jax.tree_util.tree_structure(want) and all(  # type: ignore[operator]
        a == b for a, b in zip(jax.tree_util.tree_leaves(got_steps, is_leaf=lambda v: isinstance(v, tuple)),
                               jax.tree_util.tree_leaves(want_steps, is_leaf=lambda v: isinstance(v, tuple))))
    if not same:
        raise ValueError(f"consensus_path's steps have shape {got_steps}, but the consensus point of these dynamics "
                         f"on x0 has shape {want_steps}: pass reference_consensus(...) of the same dynamics, one run "
                         "(its path is shared by every run here)")


def coupling(dynamics, x0, key, consensus_path, *, num_runs: int | None = None, params=None) -> CouplingResult:
    """``N`` particles and their mean-field copies, coupled (FedCBO JMLR Proposition 1, eq. (50)).

    The ``N``-particle system runs from ``x0`` with ``dynamics.step``; the copies run from
    the same ``x0`` with ``dynamics.drive(state, m_t)``: the same Euler–Maruyama scheme
    (eq. (15)) and the same Brownian increments (the same PRNG key, step by step), but
    toward ``m_t = consensus_path[t]``, the mean-field consensus point from
    :func:`reference_consensus`, instead of their own. One jitted ``lax.scan`` over the
    steps (``T = len(consensus_path)``), ``vmap``-ped over ``num_runs`` runs
    (``x0`` then carries a run axis and run ``r`` uses ``jax.random.split(key, M)[r]``).

    ``params``: one point of numbers (a :class:`cbo_jax.params.Params` whose leaves are
    numbers, e.g. ``cj.params.defaults(dyn)._replace(sigma1=1.5)``) to run instead of the
    dynamics' own, as ``simulate(..., params=)`` does; give :func:`reference_consensus` the
    same, or the copies follow the mean-field path of another SDE.

    Returns a :class:`CouplingResult`; ``sq_distance`` is averaged over the benign
    particles (every particle, for systems without attackers).
    """
    from cbo_jax import _checks
    from cbo_jax import params as params_lib

    if dynamics.drive is None:
        raise ValueError("these dynamics have no drive(state, m); coupling needs cbo(), clustered() or cb2o()")
    _checks.x64_for(dynamics.config)  # float64 dynamics would run in float32 here, without a word
    point = None
    if params is not None:
        params = params_lib.as_params(params, dynamics)
        if params_lib.validate(params, dynamics) != ():
            raise ValueError(f"coupling runs one point of numbers; params has a sweep grid of shape "
                             f"{params_lib.grid_shape(params)}: call coupling once per point "
                             "(cbo_jax.params.point(grid, index))")
        point = params_lib.in_dtype(params, jnp.dtype(getattr(dynamics.config, "dtype", "float32")))
    from cbo_jax.dynamics.cbo import check_population
    from cbo_jax.simulate import rng_context

    key = _checks.as_key("key", key)
    path = jax.tree_util.tree_map(jnp.asarray, consensus_path)
    lengths = {leaf.shape[0] if leaf.ndim else 0 for leaf in jax.tree_util.tree_leaves(path)}
    if len(lengths) != 1 or min(lengths) < 1:
        raise ValueError("consensus_path must have one leading step axis (T >= 1) on every leaf, got shapes "
                         f"{[np.shape(v) for v in jax.tree_util.tree_leaves(path)]}")
    _checks.all_finite("consensus_path (the reference ensemble diverged?)", path)
    if num_runs is not None:
        _checks.positive_int("num_runs", num_runs)
        key = jax.random.split(key, num_runs)
    if dynamics.check is not None:
        dynamics.check("x0", x0, num_runs)
    else:
        check_population("x0", x0, dynamics.objective, num_runs)
    _check_path_fits(dynamics, x0, key, path, num_runs)

    with rng_context(dynamics.config):  # as in simulate: for dynamics of one's own with a drive
        d2, x, xbar = _coupled(x0, key, path, point, init=dynamics.init, step=dynamics.step, drive=dynamics.drive,
                               batched=num_runs is not None)
    return CouplingResult(sq_distance=np.asarray(d2), final_x=x, final_copies=xbar)
