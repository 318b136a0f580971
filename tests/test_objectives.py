"""Numerical edge cases of the objectives, mirror maps, SDE step, parameter sweeps and plots.

Each test pins a defect found by checking the numbers against closed forms (or bad input
against a clear ``ValueError``); the test fails on the code before its fix.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import mirror_maps as mm
from cbo_jax import objectives
from cbo_jax import params as P
from cbo_jax import sde

from _stack import enable_x64


# ------------------------------------------------------------------------------ objectives

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


# ------------------------------------------------------------------------------ mirror maps

def test_projection_sphere_of_the_origin_lands_on_the_sphere():
    """r y / |y| was NaN at y = 0 (every point of the sphere is nearest there)."""
    m = mm.ProjectionSphere(2.0)
    x = np.asarray(m.grad_conj(jnp.asarray([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]])))
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 2.0, rtol=1e-6)
    np.testing.assert_allclose(x[1], [1.2, 0.0, 1.6], rtol=1e-6)


def test_log_barrier_inverse_saturates_at_the_box_edge_for_huge_duals():
    """``∇φ*(y) = y / (1 + √(1 + y²))`` tends to ±1; ``y²`` overflowed float32 past 1.8e19 and
    gave 0 (the box's centre). Moderate duals keep the float64 value."""
    m = mm.LogBarrierBox()
    y = jnp.asarray([1e20, -3e30, 0.5, -2.0, 0.0], jnp.float32)
    x = np.asarray(m.grad_conj(y))
    ref = np.array([1.0, -1.0, 0.5 / (1 + np.sqrt(1.25)), -2.0 / (1 + np.sqrt(5.0)), 0.0])
    np.testing.assert_allclose(x, ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(np.asarray(m.grad(jnp.asarray(x[2:]))), np.asarray(y[2:]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("build,match", [
    (lambda: mm.ProjectionSquare(-1.0), "r must be > 0"),  # clipped every coordinate to 1 silently
    (lambda: mm.ProjectionStiefel((2,)), "two integers"),
    (lambda: mm.ProjectionStiefel((2, 2)).grad_conj(jnp.ones((3, 5))), "dimension n k = 4, got 5"),
    (lambda: mm.weighted_L2(np.ones((2, 3))), "square"),
    (lambda: mm.weighted_L2([[1.0, 0.0], [0.0, -1.0]]), "positive definite"),  # an indefinite φ
    (lambda: mm.get_mirror_map({"name": "L2", "lambda": 2.0}), r"'L2' takes \['lamda'\]"),  # was a TypeError
])
def test_mirror_map_bad_input_is_a_clear_value_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# ------------------------------------------------------------------------------ SDE step

def test_euler_maruyama_negative_dt_is_refused_not_nan():
    x = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="dt must be a finite number >= 0"):
        sde.euler_maruyama(jax.random.key(0), x, jnp.zeros(2), dt=-0.1, lambda1=1.0, sigma1=1.0)
    out = sde.euler_maruyama(jax.random.key(0), x, jnp.zeros(2), dt=0.1, lambda1=1.0, sigma1=0.0)
    np.testing.assert_allclose(np.asarray(out), 0.9, rtol=1e-6)  # the noiseless step (1 - λ dt) x


# ------------------------------------------------------------------------------ parameter sweeps

def _dyn():
    return cj.cbo(objectives.Sphere(), sigma1=1.0)


@pytest.mark.parametrize("leaf,match", [
    (np.array([]), r"sweep grid \(0,\) has no points"),  # was a bare IndexError inside simulate
    (np.ones((0, 3)), r"sweep grid \(0, 3\) has no points"),
    (np.array([1 + 2j, 1.0]), "must hold real numbers"),  # the imaginary part was dropped with a warning
    (True, "must hold real numbers"),
    ("0.5", "must hold real numbers"),
    (None, "must hold real numbers"),  # was "= nan: must be finite"
])
def test_validate_refuses_empty_grids_and_non_real_leaves(leaf, match):
    dyn = _dyn()
    with pytest.raises(ValueError, match=match):
        P.validate(P.defaults(dyn)._replace(sigma1=leaf), dyn)


def test_validate_still_accepts_integer_and_low_precision_leaves():
    dyn = _dyn()
    p = P.defaults(dyn)._replace(lambda1=np.array([1, 2], np.int32), sigma1=jnp.array([0.5, 1.0], jnp.bfloat16))
    assert P.validate(p, dyn) == (2,)


# ------------------------------------------------------------------------------ plots

def test_contour_names_an_objective_of_the_wrong_output_shape():
    """The shape check ran after the reshape, so NumPy's "cannot reshape" came first."""
    from cbo_jax import plot

    # the grid evaluation behind contour() (no matplotlib needed to reach the check)
    with pytest.raises(ValueError, match=r"must map an \(n, 2\) array of points to \(n,\) values"):
        plot._grid_values(lambda x: jnp.sum(x), ((-1.0, 1.0), (-1.0, 1.0)), 8)
    gx, gy, z = plot._grid_values(lambda x: jnp.sum(x * x, axis=-1, keepdims=True), ((-1.0, 1.0), (-1.0, 1.0)), 8)
    np.testing.assert_allclose(z, gx ** 2 + gy ** 2, rtol=1e-6)  # an (n, 1) output still reshapes


# ------------------------------------------------------------------------------ constraints

@pytest.mark.parametrize("spec,match", [
    ({"name": "sphere", "r": 2.0}, r"'sphere' takes no parameters, got \['r'\]"),  # was the unit sphere, silently
    ({"name": "Stiefel", "nk": (2, 1), "n": 3}, r"'Stiefel' takes \['nk'\], got \['n'\]"),
    ({"name": "plane"}, "needs its normal a"),  # was a TypeError
])
def test_get_surface_refuses_parameters_it_would_drop(spec, match):
    from cbo_jax import constraints as cons

    with pytest.raises(ValueError, match=match):
        cons.get_surface(spec)


def test_named_constraint_with_a_wrong_keyword_is_a_value_error():
    from cbo_jax import constraints as cons

    with pytest.raises(ValueError, match=r"constraint 'sphere' takes \['r'\], got \['radius'\]"):
        cons.as_constraints({"name": "sphere", "radius": 2.0})
    (g,) = cons.as_constraints({"name": "sphere", "r": 2.0})
    assert float(g(jnp.asarray([2.0, 0.0]))) == 0.0


# ------------------------------------------------------------------------------ mean-field diagnostics

@pytest.mark.parametrize("label,centers,include,match", [
    (np.zeros(5, int), np.zeros((2, 2)), None, r"label must have shape \(6,\)"),
    (np.zeros(6, int), np.zeros((2, 3)), None, r"centers must be K points shaped like one particle"),
    (np.zeros(6, int), np.zeros((2, 2)), np.ones(4, bool), r"include must have shape \(6,\)"),
    (np.zeros(6), np.zeros((2, 2)), None, "label must hold integers"),
])
def test_class_variance_shape_mismatches_are_named(label, centers, include, match):
    """These were TypeErrors from jnp's broadcasting ("sub got incompatible shapes")."""
    from cbo_jax import meanfield

    with pytest.raises(ValueError, match=match):
        meanfield.class_variance(jnp.ones((6, 2)), label, centers, include=include)


def test_class_variance_closed_form():
    from cbo_jax import meanfield

    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [1.0, 1.0]])
    got = np.asarray(meanfield.class_variance(x, np.array([0, 0, 1, 1]), np.array([[0.0, 0.0], [1.0, 1.0]])))
    np.testing.assert_allclose(got, [0.5 * (1 + 4) / 2, 0.5 * (8 + 0) / 2], rtol=1e-6)


@pytest.mark.parametrize("x", [3.0, np.zeros((4, 0))], ids=["scalar", "d=0"])
def test_objective_of_a_scalar_or_of_zero_dimensional_particles_is_refused(x):
    """A scalar was NumPy's "axis -1 is out of bounds"; particles in R^0 got the energy 0 silently."""
    with pytest.raises(ValueError, match=r"particles of shape \(\.\.\., d\) with d >= 1"):
        objectives.Sphere()(x)


def test_predicted_decay_rate_is_elementwise_in_the_lipschitz_constant_too():
    """Documented as elementwise on arrays, but float(lipschitz) refused an array."""
    from cbo_jax import meanfield

    got = meanfield.predicted_decay_rate(1.0, 0.5, 0.1, 0.2, 2, np.array([0.0, 1.0, 2.0]))
    want = [2 * 1.0 - 2 * 0.5 * m - 2 * 0.01 - 2 * 0.04 * m ** 2 for m in (0.0, 1.0, 2.0)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert meanfield.predicted_decay_rate(1.0, 0.5, 0.1, 0.2, 2, 1.0) == pytest.approx(want[1], rel=1e-12)


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


@pytest.mark.parametrize("values", [[0.1, "a"], [True, False], [0.5 + 1j]])
def test_grid_refuses_values_that_are_not_real_numbers(values):
    """grid() read bools as 1/0 and dropped imaginary parts (a ComplexWarning); a string was NumPy's
    "could not convert", without the parameter's name."""
    with pytest.raises(ValueError, match=r"grid: sigma1 must hold real numbers"):
        P.grid(_dyn(), sigma1=values)


@pytest.mark.parametrize("build,match", [
    (lambda c: c.sphere(float("nan")), "sphere r must be finite"),  # every g(x) was NaN
    (lambda c: c.sphere("2"), "sphere r must be a real number"),  # a TypeError once traced
    (lambda c: c.plane([1.0, 0.0], float("nan")), "plane b must be finite"),
    (lambda c: c.quadric(np.eye(2), None, float("inf")), "quadric c must be finite"),
    (lambda c: c.quadric([[1.0, float("nan")], [0.0, 1.0]]), "A and b must be finite"),
])
def test_constraint_constants_must_be_finite_numbers(build, match):
    from cbo_jax import constraints as cons

    with pytest.raises(ValueError, match=match):
        build(cons)


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
