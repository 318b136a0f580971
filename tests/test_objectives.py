"""The test objectives (cbo_jax.objectives): minimisers, values and gradients, bad input.

The numerical edge cases each pin a defect found by checking the numbers against closed forms
(or bad input against a clear ``ValueError``); the test fails on the code before its fix.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import objectives

from _stack import enable_x64


# ------------------------------------------------------------------------------ numerical edge cases

@pytest.mark.parametrize("obj", [objectives.DropWave(), objectives.Ackley(), objectives.AcceleratedSinus(),
                                 objectives.AckleyMultimodal(alpha=(1.0, 2.0))], ids=lambda o: o.name)
def test_gradient_at_the_origin_minimiser_is_zero_not_nan(obj):
    """jnp.sqrt's infinite derivative at 0 times the chain rule's 0 made jax.grad NaN at the minimiser 0
    (drop wave is smooth there, with gradient 0; Ackley's and the sinus' cones have the subgradient 0),
    which a gradient drift (λ2 > 0) carried into every later step."""
    with enable_x64(True):
        d = obj.dim or 3
        x = np.random.default_rng(0).uniform(-1.5, 1.5, d)
        g0, ga = np.asarray(jax.jit(jax.vmap(jax.grad(obj)))(jnp.asarray(np.stack([np.zeros(d), x]))))
        np.testing.assert_array_equal(g0, np.zeros(d))
        # elsewhere the gradient is unchanged: central differences in float64 (one jitted call)
        h = 1e-6
        pts = np.concatenate([x + h * np.eye(d), x - h * np.eye(d), np.zeros((1, d))])
        f = np.asarray(jax.jit(obj)(jnp.asarray(pts)))
        np.testing.assert_allclose(ga, (f[:d] - f[d:2 * d]) / (2 * h), rtol=1e-6, atol=1e-8)
        assert f[-1] == pytest.approx(obj.minimum(d), abs=1e-12)


def test_drop_wave_smooth_at_origin_second_order():
    """Near 0, f(z) = -2 + 73 |z|² + O(|z|⁴): the gradient at a tiny z is 146 z, not NaN."""
    with enable_x64(True):
        z = jnp.asarray([1e-5, -2e-5])
        g = np.asarray(jax.jit(jax.grad(objectives.DropWave()))(z))
        np.testing.assert_allclose(g, 146 * np.asarray(z), rtol=1e-6)


def test_gaussian_mixture_particles_of_another_dimension_are_a_value_error():
    """The mixture lives in R^2; particles in R^3 were a TypeError from jnp's broadcasting."""
    gm = objectives.GaussianMixture()
    with pytest.raises(ValueError, match=r"lives in R\^2.*dimension 3"):
        gm(jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"lives in R\^2"):
        jax.jit(gm)(jnp.zeros((4, 3)))
    np.testing.assert_allclose(np.asarray(jax.jit(gm)(jnp.zeros((2, 2)))), np.log(2 * np.pi), rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(means=(0.0, 0.0)), r"means must be a \(K, d\)"),  # was "not enough values to unpack"
    (dict(means=[[0.0, 0.0], [3.0, 3.0]], covs=[np.eye(2), -np.eye(2)]), "positive definite"),  # silently wrong
    (dict(means=[[0.0, 0.0]], covs=[[[1.0, 2.0], [0.0, 1.0]]]), "symmetric positive definite"),
    (dict(means=[[0.0, 0.0]], covs=np.eye(3)), r"covs must be 1 finite \(2, 2\)"),
])
def test_gaussian_mixture_bad_means_or_covariances_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        objectives.GaussianMixture(**kwargs)


def test_gaussian_mixture_shared_covariance():
    """One (d, d) covariance is shared by every component (it was an einsum shape error)."""
    with enable_x64(True):
        gm = objectives.GaussianMixture(means=[[0.0, 0.0], [10.0, 0.0]], covs=2 * np.eye(2))
        # -log(N(0; 0, 2I) + N(0; (10, 0), 2I)) with N(0; 0, 2I) = 1 / (4π)
        want = -np.log(1 / (4 * np.pi) * (1 + np.exp(-100 / 4)))
        assert float(jax.jit(gm)(jnp.zeros((1, 2)))[0]) == pytest.approx(want, rel=1e-12)


def test_nd_sinus_has_a_minimiser_in_one_dimension():
    """sin(s) = -1 zeroes f in R^1 too (at 0.3 x = √(3π/2)); d = 1 was refused with a wrong reason."""
    with enable_x64(True):
        obj = objectives.NdSinus()
        m = obj.minimisers(1)
        assert m.shape == (1, 1)
        assert float(jax.jit(obj)(jnp.asarray(m))[0]) == pytest.approx(0.0, abs=1e-14)


@pytest.mark.parametrize("x", [3.0, np.zeros((4, 0))], ids=["scalar", "d=0"])
def test_objective_of_a_scalar_or_of_zero_dimensional_particles_is_refused(x):
    """A scalar was NumPy's "axis -1 is out of bounds"; particles in R^0 got the energy 0 silently."""
    with pytest.raises(ValueError, match=r"particles of shape \(\.\.\., d\) with d >= 1"):
        objectives.Sphere()(x)


@pytest.mark.parametrize("point", [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
def test_cross_in_tray_and_holder_table_gradients_are_finite_on_the_axes(point):
    """log|sin x sin y| (cross-in-tray) made jax.grad NaN on both axes, where sin x sin y = 0, and
    √(x² + y²) (both) at the origin; the values there are unchanged (-1e-4, and -0)."""
    cit, holder = objectives.CrossInTray(), objectives.HolderTable()
    grads, value = jax.jit(lambda p: (jnp.stack([jax.grad(cit)(p), jax.grad(holder)(p)]), cit(p)))(
        jnp.asarray(point))
    assert np.all(np.isfinite(np.asarray(grads)))
    np.testing.assert_array_equal(np.asarray(grads[0]), [0.0, 0.0])
    assert float(value) == pytest.approx(-1e-4, rel=1e-6)


@pytest.mark.parametrize("obj,outside", [(objectives.McCormick(), [-10.0, -10.0]),
                                         (objectives.CrossInTray(), [1000.0 * np.pi / np.sqrt(2) + 0.3,
                                                                     1000.0 * np.pi / np.sqrt(2) + 0.9])],
                         ids=lambda v: getattr(v, "name", ""))
def test_objectives_unbounded_below_on_the_plane_name_the_domain_of_their_minimum(obj, outside):
    """McCormick (f(t, t) = sin 2t + t + 1) and cross-in-tray (e^{r/π - 100}) go below their documented
    minimum far from it: the minimum holds on a box only, which ``domain`` must give (it was None,
    which says "all of R^2")."""
    with enable_x64(True):
        assert float(jax.jit(obj)(jnp.asarray(outside))) < obj.minimum(2)  # unbounded outside the box
        assert obj.domain is not None
        lo, hi = (np.broadcast_to(np.asarray(b, float), (2,)) for b in obj.domain)
        assert np.all(np.asarray(outside) < lo) or np.any(np.asarray(outside) > hi)
        assert np.all((obj.minimisers(2) >= lo) & (obj.minimisers(2) <= hi))
        grid = np.stack(np.meshgrid(np.linspace(lo[0], hi[0], 201), np.linspace(lo[1], hi[1], 201)), -1).reshape(-1, 2)
        assert float(jnp.min(jax.jit(obj)(jnp.asarray(grid)))) >= obj.minimum(2) - 1e-9


def test_bimodal_energy_is_finite_far_from_its_modes():
    """-log(e^{-a} + e^{-b}/2) underflowed to -log(0) = +inf a few units away (|y| > 8 in float32);
    there the energy is b + log 2, the second mode's quadratic."""
    pts = np.array([[0.0, 8.0], [0.0, -9.0], [40.0, 0.0]])
    b = (pts[:, 0] + 1.2) ** 2 / 8 + (pts[:, 1] + 0.7) ** 2 / 0.5 + np.log(2.0)
    got = np.asarray(jax.jit(objectives.Bimodal())(jnp.asarray(pts, jnp.float32)))
    np.testing.assert_allclose(got, b, rtol=1e-6)
    with enable_x64(True):  # near the modes, the value of the plain formula
        x = np.array([[0.3, -0.2], [1.0, 1.5]])
        a = (x[:, 0] - 1) ** 2 + (x[:, 1] - 1.5) ** 2 / 0.2
        bb = (x[:, 0] + 1.2) ** 2 / 8 + (x[:, 1] + 0.7) ** 2 / 0.5
        np.testing.assert_allclose(np.asarray(objectives.Bimodal()(jnp.asarray(x))),
                                   -np.log(np.exp(-a) + 0.5 * np.exp(-bb)), rtol=1e-12, atol=1e-15)


def test_objective_keeps_its_own_copy_of_an_array_shift():
    """An objective is frozen: the caller's shift array changed afterwards does not move it
    (eager calls followed the caller's array while compiled runs kept the old value)."""
    b = np.zeros(2)
    f = objectives.Sphere(shift=b)
    b[:] = 2.0
    np.testing.assert_array_equal(f.minimiser(2), [0.0, 0.0])
    assert float(f(jnp.zeros((1, 2)))[0]) == 0.0
    with pytest.raises(ValueError):
        f.shift[0] = 1.0  # read-only


# ------------------------------------------------------------------------------ minimisers and named objectives

@pytest.mark.parametrize("name", [n for n, c in sorted(objectives.OBJECTIVES.items()) if c.dim is None and
                                  c.domain is None and c.isolated and n != "gaussian-mixture"])
def test_objectives_minimisers(name):
    d = 7
    obj = objectives.get_objective(name, shift=0.25)
    xstar = obj.minimiser(d)
    with enable_x64(True):
        f_star = float(obj(jnp.asarray(xstar[None], jnp.float64))[0])
        assert f_star == pytest.approx(obj.minimum(d), abs=1e-9)
        pert = xstar[None] + 0.05 * np.random.default_rng(0).normal(size=(64, d))
        assert np.all(np.asarray(obj(jnp.asarray(pert))) > f_star)
    # batched over runs too
    assert obj(jnp.zeros((3, 5, d))).shape == (3, 5)


def test_objectives_refuse_or_promote_odd_inputs():
    # integer particles are promoted to float: a fractional shift is not truncated to 0
    np.testing.assert_allclose(np.asarray(objectives.Sphere(shift=0.5)(jnp.asarray([[1, 2]]))), [2.5])
    # a shift of the wrong length is named, not a broadcasting error
    with pytest.raises(ValueError, match="shift has 3 coordinates, but the particles have dimension 2"):
        objectives.Sphere(shift=[1.0, 2.0, 3.0])(jnp.ones((4, 2)))
    with pytest.raises(ValueError, match="shift has 3 coordinates"):
        objectives.Sphere(shift=[1.0, 2.0, 3.0]).minimiser(2)
    assert objectives.Sphere(shift=[0.5])(jnp.ones((4, 2))).shape == (4,)  # a (1,) shift still broadcasts
    # a shift that is not numbers is refused, not read as one ("1" was 1.0, True was 1)
    for bad in ("1", True, 1j, [1.0, "a"], None):
        with pytest.raises(ValueError, match="shift must be a number or a vector of numbers"):
            objectives.Rastrigin(shift=bad)
    assert objectives.Rastrigin(shift=np.int64(2)).minimiser(2).tolist() == [2.0, 2.0]
    # a product of no factors is the constant 1, not one energy per particle
    with pytest.raises(ValueError, match="alpha must be a non-empty sequence"):
        objectives.RastriginMultimodal(alpha=())


@pytest.mark.parametrize("cls", [objectives.RastriginMultimodal, objectives.AckleyMultimodal])
def test_multimodal_centres_are_checked_against_alpha_and_the_dimension(cls):
    """The centres ``z`` are named when they do not fit: one row per factor of ``alpha``, and
    coordinates matching the particles (was NumPy's opaque broadcasting error)."""
    x = jnp.ones((4, 2))
    with pytest.raises(ValueError, match=r"z has 3 centres \(rows\), but alpha has 2 factors"):
        cls(alpha=(1.0, 2.0), z=[[0, 0], [1, 1], [2, 2]])
    with pytest.raises(ValueError, match=r"z must be None or finite numbers"):
        cls(alpha=(1.0,), z=[[0.0, np.nan]])
    with pytest.raises(ValueError, match=r"z must be None or finite numbers"):
        cls(alpha=(1.0,), z="origin")
    with pytest.raises(ValueError, match=r"z must have shape \(K, d\)"):
        cls(alpha=(1.0,), z=np.zeros((1, 1, 2)))
    with pytest.raises(ValueError, match=r"z's centres have 3 coordinates, but the particles have dimension 2"):
        cls(alpha=(1.0, 2.0), z=[[0, 0, 0], [1, 1, 1]])(x)
    with pytest.raises(ValueError, match=r"z's centres have 3 coordinates, but the particles have dimension 2"):
        cls(alpha=(1.0, 2.0), z=[[0, 0, 0], [1, 1, 1]]).minimisers(2)
    with pytest.raises(ValueError, match=r"z's centres have 3 coordinates"):
        cls(alpha=(1.0, 2.0), z=[0.0, 1.0, 2.0])(x)  # one (d,) centre for every factor, of the wrong d
    # what fits still broadcasts: (K, d), one (d,) centre for all factors, (K, 1) and (1, d) rows, a scalar
    for z in ([[0, 0], [1, 1]], [1.0, 1.0], [[0.0], [1.0]], [[1.0, 1.0]], 1.0):
        assert cls(alpha=(1.0, 2.0), z=z)(x).shape == (4,)
    np.testing.assert_array_equal(cls(alpha=(1.0, 2.0), z=[[0, 0], [1, 1]]).minimisers(2), [[0, 0], [1, 1]])


def test_rastrigin_forms_are_named_apart():
    x = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_allclose(np.asarray(objectives.Rastrigin()(x)), [5.0, 25.0, 61.0], atol=1e-4)
    np.testing.assert_allclose(np.asarray(objectives.RastriginNormalized()(x)), [2.5, 12.5, 30.5], atol=1e-4)
    with pytest.raises(ValueError, match="unknown objective"):
        objectives.get_objective("rastrigon")


def test_cos_2pi_matches_float64_cos():
    z = np.concatenate([np.linspace(-3, 3, 20001), np.random.default_rng(0).uniform(-1e4, 1e4, 20000),
                        np.arange(-50, 51) * 0.25])
    z32 = z.astype(np.float32)
    got = np.asarray(objectives.cos_2pi(jnp.asarray(z32)), np.float64)
    ref = np.cos(2 * np.pi * z32.astype(np.float64))
    assert np.max(np.abs(got - ref)) < 5e-7
    with enable_x64(True):
        got64 = np.asarray(objectives.cos_2pi(jnp.asarray(z)))
    assert got64.dtype == np.float64
    assert np.max(np.abs(got64 - np.cos(2 * np.pi * (z - np.round(z))))) < 1e-14
    special = np.asarray(objectives.cos_2pi(jnp.asarray([0.0, 1.0, -7.0, 0.5, 0.25, 1e9])))
    np.testing.assert_allclose(special, [1, 1, 1, -1, 0, 1], atol=2e-7)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

def _x(d, n=16, seed=0, scale=3.0):
    return np.random.default_rng(seed).uniform(-scale, scale, (n, d))


@pytest.mark.reference
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


@pytest.mark.reference
def test_griewank_and_styblinski_tang_match_their_textbook_formulas():
    """Guards Griewank's ``|z|²/4000`` and Styblinski–Tang's ``+5 z`` against float64 NumPy."""
    with enable_x64(True):
        x = _x(4, scale=5.0)
        i = np.arange(1, 5)
        grie = 1 + np.sum(x * x, -1) / 4000 - np.prod(np.cos(x / np.sqrt(i)), -1)
        np.testing.assert_allclose(np.asarray(objectives.Griewank()(jnp.asarray(x))), grie, rtol=1e-12)
        st = 0.5 * np.sum(x ** 4 - 16 * x * x + 5 * x, -1)
        np.testing.assert_allclose(np.asarray(objectives.StyblinskiTang()(jnp.asarray(x))), st, rtol=1e-12)
