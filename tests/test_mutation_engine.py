"""Mutation-sweep guards for the engine modules: batching, simulate, meanfield, population,
objectives, mirror maps, constraints, params and CBS's covariance noise.

Each test pins a formula or an invariant that a single-point change of the library went
through the fast suite without breaking (see the mutation report). References are closed
forms, float64 NumPy or CBXpy, never the library's own earlier output. Tiny sizes: each
test runs in well under three seconds.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import batching, meanfield, objectives

from _stack import enable_x64


# --------------------------------------------------------------------------- batching

def test_first_batch_comes_from_a_fresh_permutation_on_the_batch_stream():
    """Guards: ``init`` puts ``pos = N`` so the first step draws a permutation (``pos = 0``
    walked the identity permutation, the first epoch's batches were ``0..b-1, b..2b-1, ...``),
    and the permutation's key is ``fold_in(step_key, BATCH_STREAM)`` (documented; the key
    itself is the one the noise is split from)."""
    n, b = 10, 3
    firsts = set()
    for seed in range(4):
        key = jax.random.key(seed)
        mask, state = batching.next_batch(batching.init(n), key, b)
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, batching.BATCH_STREAM), n))
        want = np.zeros(n, bool)
        want[perm[:b]] = True
        np.testing.assert_array_equal(np.asarray(mask), want)
        np.testing.assert_array_equal(np.asarray(state.perm), perm)
        assert int(state.pos) == b
        firsts.add(tuple(np.flatnonzero(np.asarray(mask))))
    assert len(firsts) > 1  # not the same first batch for every key


# --------------------------------------------------------------------------- objectives

def _x(d, n=16, seed=0, scale=3.0):
    return np.random.default_rng(seed).uniform(-scale, scale, (n, d))


def test_ackley_rastrigin_rosenbrock_values_match_cbxpy_away_from_the_minimiser():
    """Guards the classic objectives' formulas at generic points (the suite checked them only
    at and next to their minimiser, where e.g. Ackley's ``-0.2 r`` or Rosenbrock's ``100``
    can change without moving the minimum)."""
    import cbx.objectives as co

    with enable_x64(True):
        for d in (2, 5):
            x = _x(d)
            np.testing.assert_allclose(np.asarray(objectives.Ackley()(jnp.asarray(x))), co.Ackley()(x),
                                       rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(np.asarray(objectives.Rastrigin()(jnp.asarray(x))), co.Rastrigin()(x),
                                       rtol=1e-12, atol=1e-12)
        x = _x(2)
        np.testing.assert_allclose(np.asarray(objectives.Rosenbrock()(jnp.asarray(x))), co.Rosenbrock()(x),
                                   rtol=1e-12)


def test_griewank_and_styblinski_tang_match_their_textbook_formulas():
    """Guards Griewank's ``|z|²/4000`` and Styblinski–Tang's ``+5 z`` against float64 NumPy."""
    with enable_x64(True):
        x = _x(4, scale=5.0)
        i = np.arange(1, 5)
        grie = 1 + np.sum(x * x, -1) / 4000 - np.prod(np.cos(x / np.sqrt(i)), -1)
        np.testing.assert_allclose(np.asarray(objectives.Griewank()(jnp.asarray(x))), grie, rtol=1e-12)
        st = 0.5 * np.sum(x ** 4 - 16 * x * x + 5 * x, -1)
        np.testing.assert_allclose(np.asarray(objectives.StyblinskiTang()(jnp.asarray(x))), st, rtol=1e-12)


# --------------------------------------------------------------------------- meanfield

def test_sliced_wasserstein_p2_of_a_translation_in_one_dimension_is_the_shift():
    """Guards the final ``** (1/p)`` of SW_p: in 1-D (directions ±1, so every projection is
    exact) a sample and its translate by ``v`` are ``W_p = |v|`` apart for every ``p``; the
    suite only used ``p = 1``, where the root is the identity."""
    x = np.random.default_rng(0).standard_normal((9, 1))
    for p in (2.0, 3.0):
        got = float(meanfield.sliced_wasserstein(x, x + 3.0, jax.random.key(0), num_projections=5, p=p))
        assert got == pytest.approx(3.0, rel=1e-5)


def test_ideal_quadratic_rate_closed_form():
    """Guards ``2(λ1 + λ2) - c σ1² - d σ2²`` (``c = d`` isotropic, ``1`` anisotropic)."""
    assert meanfield.ideal_quadratic_rate(1.0, 0.5, 0.3, 0.2, d=3) == pytest.approx(3.0 - 3 * 0.09 - 3 * 0.04)
    assert meanfield.ideal_quadratic_rate(1.0, 0.5, 0.3, 0.2, d=3, noise="anisotropic") == pytest.approx(
        3.0 - 0.09 - 3 * 0.04)


def test_coupling_distance_is_averaged_over_the_benign_particles_only():
    """Guards the benign mean of ``|θ_i - θ̄_i|²`` in :func:`meanfield.coupling` (dividing by
    all ``N`` went unnoticed: the suite's coupling tests had no malicious particles). Noise
    off, copies driven to the own consensus shifted by ``δ``: for each benign particle
    ``|d_t|² = |δ|² (1 - (1 - λ1 dt)^t)²``, so their mean is that too."""
    from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, clustered, particles

    rng = np.random.default_rng(4)
    delta = np.array([0.3, -0.4])
    n = 10
    with enable_x64(True):
        cfg = ClusteredConfig(lambda1=0.8, sigma1=0.5, dt=0.02, alpha=10.0, noise="none", dtype="float64")
        attack = Malicious(drift=lambda t, x: -(x + 1.0))
        dyn = clustered([objectives.Quadratic(shift=c) for c in ([1.0, 1.0], [-1.0, -1.0])], cfg, malicious=attack)
        p = particles(rng.uniform(-2, 2, (n, 2)), np.arange(n) % 2, malicious=np.arange(n) % 5 == 0)
        own = cj.simulate(dyn, p, 1, 12, record_consensus=True)
        res = meanfield.coupling(dyn, p, 1, own.history["consensus"] + delta)
    t = np.arange(13)
    expected = np.sum(delta ** 2) * (1 - (1 - 0.8 * 0.02) ** t) ** 2
    np.testing.assert_allclose(res.sq_distance, expected, rtol=1e-10, atol=1e-15)


# --------------------------------------------------------------------------- mirror maps

def test_mirror_maps_grad_conj_inverts_grad():
    """Guards every invertible map's pair: ``∇φ*(∇φ(x)) = x`` on the map's domain (a sign or a
    root dropped in one half, e.g. NonsmoothBarrier's ``|y|^{-1/2}``, breaks the identity)."""
    from cbo_jax import mirror_maps as mm

    rng = np.random.default_rng(1)
    box = rng.uniform(-0.9, 0.9, (6, 3))
    free = rng.uniform(-3, 3, (6, 3))
    simplex = rng.dirichlet(np.ones(3), 6)
    a = np.array([[2.0, 0.7, 0.0], [-0.3, 1.0, 0.2], [0.1, 0.0, 3.0]])
    cases = [(mm.L2(2.0), free), (mm.ElasticNet(0.5, 0.3), free), (mm.LogBarrierBox(), box),
             (mm.NonsmoothBarrier(), box), (mm.weighted_L2(a), free), (mm.EntropySimplex(), simplex)]
    with enable_x64(True):
        for m, x in cases:
            back = np.asarray(m.grad_conj(m.grad(jnp.asarray(x))))
            np.testing.assert_allclose(back, x, rtol=1e-10, atol=1e-12, err_msg=m.name)


def test_weighted_l2_gradient_uses_the_symmetric_part_of_a():
    """Guards ``∇φ(x) = Ā x`` with ``Ā = (A + Aᵀ)/2`` for a non-symmetric ``A`` (with ``A``
    itself, ``∇φ*∘∇φ`` is still the identity, so only the closed form tells)."""
    from cbo_jax import mirror_maps as mm

    a = np.array([[2.0, 0.7], [-0.3, 1.0]])
    x = np.random.default_rng(2).standard_normal((5, 2))
    with enable_x64(True):
        got = np.asarray(mm.weighted_L2(a).grad(jnp.asarray(x)))
    np.testing.assert_allclose(got, x @ (0.5 * (a + a.T)).T, rtol=1e-12)


def test_projection_maps_land_on_their_sets():
    """Guards the projections' formulas: ball of radius ``r`` about ``c`` (points outside land
    at distance ``r``, inside stay), hyperplane ``a·x = b`` with ``b != 0``."""
    from cbo_jax import mirror_maps as mm

    rng = np.random.default_rng(3)
    y = 4.0 * rng.standard_normal((8, 3))
    c = np.array([0.5, -1.0, 0.2])
    with enable_x64(True):
        ball = np.asarray(mm.ProjectionBall(radius=2.0, center=c).grad_conj(jnp.asarray(y)))
        dist = np.linalg.norm(y - c, axis=1)
        want = np.where((dist > 2.0)[:, None], c + 2.0 * (y - c) / dist[:, None], y)
        np.testing.assert_allclose(ball, want, rtol=1e-12)
        a = np.array([1.0, 2.0, -2.0])
        hp = np.asarray(mm.ProjectionHyperplane(a=a, b=1.5).grad_conj(jnp.asarray(y)))
        np.testing.assert_allclose(hp @ a, 1.5, rtol=1e-12)
        np.testing.assert_allclose(hp, y - ((y @ a - 1.5) / 9.0)[:, None] * a, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- constraints and surfaces

def test_penalty_adds_weight_times_the_squared_constraints():
    """Guards ``penalty(f, cs, weight) = f + weight Σ g²`` (the weight was never other than 1
    or 1/ν inside a dynamic's own test)."""
    from cbo_jax import constraints as cons

    x = np.random.default_rng(4).standard_normal((5, 2))
    with enable_x64(True):
        f = cons.penalty(lambda z: jnp.sum(z, -1), [cons.sphere(1.0), cons.plane([1.0, 2.0], 0.5)], weight=3.0)
        got = np.asarray(f(jnp.asarray(x)))
    g1 = np.sum(x * x, -1) - 1.0
    g2 = (x @ np.array([1.0, 2.0]) - 0.5) / np.sqrt(5.0)
    np.testing.assert_allclose(got, x.sum(-1) + 3.0 * (g1 ** 2 + g2 ** 2), rtol=1e-12)


def test_sphere_surface_closed_forms_match_autodiff_of_the_distance():
    """Guards ``sphere_surface``'s ``Δd = (D - 1)/|x|``, ``∇d``, projection and tangent against
    :func:`surface` built from ``d(x) = |x| - 1`` by automatic differentiation, and the
    generic projection ``x - d(x) ∇d(x)`` (a radius-2 sphere: ``2 x/|x|``)."""
    from cbo_jax import constraints as cons

    rng = np.random.default_rng(5)
    x, z = rng.standard_normal((6, 4)) + 0.5, rng.standard_normal((6, 4))
    with enable_x64(True):
        closed, auto = cons.sphere_surface(), cons.surface(lambda p: jnp.linalg.norm(p) - 1.0)
        xj, zj = jnp.asarray(x), jnp.asarray(z)
        np.testing.assert_allclose(np.asarray(closed.laplacian(xj)), 3.0 / np.linalg.norm(x, axis=1), rtol=1e-12)
        for name in ("grad", "laplacian", "proj"):
            np.testing.assert_allclose(np.asarray(getattr(closed, name)(xj)), np.asarray(getattr(auto, name)(xj)),
                                       rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(np.asarray(closed.tangent(xj, zj)), np.asarray(auto.tangent(xj, zj)), rtol=1e-10)
        two = cons.surface(lambda p: jnp.linalg.norm(p) - 2.0)
        np.testing.assert_allclose(np.asarray(two.proj(xj)), 2.0 * x / np.linalg.norm(x, axis=1, keepdims=True),
                                   rtol=1e-12)


def test_stiefel_tangent_projection_lands_in_the_tangent_space_and_is_idempotent():
    """Guards ``T = Z - ½ X (ZᵀX + XᵀZ)``: at ``X`` on the Stiefel manifold, ``XᵀT + TᵀX = 0``
    and ``T(T(Z)) = T(Z)``."""
    from cbo_jax import constraints as cons

    n, k = 4, 2
    rng = np.random.default_rng(6)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    x = q[:, :k].reshape(1, n * k)
    z = rng.standard_normal((1, n * k))
    with enable_x64(True):
        s = cons.stiefel_surface(n, k)
        t = np.asarray(s.tangent(jnp.asarray(x), jnp.asarray(z)))
        tt = np.asarray(s.tangent(jnp.asarray(x), jnp.asarray(t)))
    X, T = x.reshape(n, k), t.reshape(n, k)
    np.testing.assert_allclose(X.T @ T + T.T @ X, 0.0, atol=1e-12)
    np.testing.assert_allclose(tt, t, atol=1e-12)


# --------------------------------------------------------------------------- population

def test_pad_agents_mask_marks_exactly_the_real_agents():
    """Guards ``mask = arange(N_padded) < N`` (``<=`` marked the first padding row as real)."""
    from cbo_jax import population as pop

    x = {"a": jnp.ones((5, 2)), "b": jnp.ones((5,))}
    padded, mask = pop.pad_agents(x, 4)
    assert padded["a"].shape == (8, 2) and padded["b"].shape == (8,)
    np.testing.assert_array_equal(np.asarray(mask), np.arange(8) < 5)
    np.testing.assert_array_equal(np.asarray(padded["a"][5:]), 0.0)


def test_resize_rows_fills_floats_with_fill_and_repeats_the_last_key():
    """Guards ``resize_rows``'s new rows: ``fill`` for floating leaves (not ``0``), ``False`` /
    ``0`` for bool / int, the last key repeated for key leaves."""
    from cbo_jax import population as pop

    keys = jax.random.split(jax.random.key(0), 3)
    tree = {"x": jnp.arange(6.0).reshape(3, 2), "b": jnp.ones(3, bool), "i": jnp.arange(3), "k": keys}
    out = pop.resize_rows(tree, 5, fill=np.nan)
    assert np.isnan(np.asarray(out["x"][3:])).all() and np.asarray(out["x"][:3]).tolist() == [[0, 1], [2, 3], [4, 5]]
    np.testing.assert_array_equal(np.asarray(out["b"]), [True] * 3 + [False] * 2)
    np.testing.assert_array_equal(np.asarray(out["i"]), [0, 1, 2, 0, 0])
    data = np.asarray(jax.random.key_data(out["k"]))
    last = np.asarray(jax.random.key_data(keys))[-1]
    np.testing.assert_array_equal(data[3], last)
    np.testing.assert_array_equal(data[4], last)


def test_isfinite_rows_needs_every_leaf_finite():
    """Guards the ``&`` over leaves in ``tree_isfinite_rows`` / ``zero_nonfinite_rows``: a
    particle with a NaN in one leaf is non-finite even when another leaf is finite."""
    from cbo_jax import population as pop

    tree = {"a": jnp.array([[np.nan], [1.0], [2.0]]), "b": jnp.array([[1.0, 2.0], [np.inf, 0.0], [3.0, 4.0]])}
    np.testing.assert_array_equal(np.asarray(pop.tree_isfinite_rows(tree)), [False, False, True])
    clean, ok = pop.zero_nonfinite_rows(tree)
    np.testing.assert_array_equal(np.asarray(clean["b"]), [[0, 0], [0, 0], [3, 4]])


def test_weighted_average_normalises_and_gives_zero_for_zero_weights():
    """Guards ``Σ w_i x_i / Σ w_i`` (rows of zero total give zeros)."""
    from cbo_jax import population as pop

    x = jnp.array([[1.0, 2.0], [3.0, 6.0]])
    got = np.asarray(pop.weighted_average(x, jnp.array([[1.0, 3.0], [0.0, 0.0]])))
    np.testing.assert_allclose(got, [[2.5, 5.0], [0.0, 0.0]], rtol=1e-6)


# --------------------------------------------------------------------------- params

def test_alpha0_equal_to_alpha_max_is_a_valid_grid_point():
    """Guards ``alpha0 > alpha_max`` (strict) in :func:`params.validate`: ``alpha0 = alpha_max``
    is a schedule that starts at its cap, which ``Multiplicative`` itself accepts."""
    import cbo_jax as cj
    from cbo_jax import params as P, schedules

    dyn = cj.cbo(objectives.Sphere(), alpha=schedules.Multiplicative(alpha0=10.0, factor=1.1, alpha_max=100.0))
    g = P.grid(dyn, alpha0=[50.0, 100.0])
    assert P.validate(g, dyn) == (2,)
    with pytest.raises(ValueError, match="above alpha_max"):
        P.validate(P.grid(dyn, alpha0=[50.0, 100.5]), dyn)


def test_point_accepts_the_most_negative_index_of_each_axis():
    """Guards ``-s <= i < s`` in :func:`params.point` (``-shape[k]`` is the first point)."""
    import cbo_jax as cj
    from cbo_jax import params as P

    g = P.grid(cj.cbo(objectives.Sphere()), sigma1=[0.1, 0.2, 0.3], dt=[0.01, 0.02])
    pt = P.point(g, (-3, -2))
    assert (pt.sigma1, pt.dt) == (0.1, 0.01)


# --------------------------------------------------------------------------- CBS

def test_sampling_mode_cbs_needs_d_plus_one_particles_and_optimisation_mode_does_not():
    """Guards CBS's host check: sampling mode refuses ``N = d`` (singular covariance; ``N < d``
    let ``N = d`` through) and optimisation mode does not check at all."""
    import cbo_jax as cj

    d = 3
    x = np.random.default_rng(7).standard_normal((d, d)).astype(np.float32)
    with pytest.raises(ValueError, match="d \\+ 1"):
        cj.simulate(cj.cbs(objectives.Sphere(), mode="sampling"), x, 0, 1)
    res = cj.simulate(cj.cbs(objectives.Sphere(), mode="optimization"), x, 0, 1)
    assert res.steps == 1
    x4 = np.random.default_rng(7).standard_normal((d + 1, d)).astype(np.float32)
    assert cj.simulate(cj.cbs(objectives.Sphere(), mode="sampling"), x4, 0, 1).steps == 1
