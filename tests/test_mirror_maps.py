"""Mirror maps (cbo_jax.mirror_maps): each map's pair of gradients, projections, bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import mirror_maps as mm

from _stack import enable_x64


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


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_mirror_maps_grad_conj_inverts_grad():
    """Guards every invertible map's pair: ``∇φ*(∇φ(x)) = x`` on the map's domain (a sign or a
    root dropped in one half, e.g. NonsmoothBarrier's ``|y|^{-1/2}``, breaks the identity)."""
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


@pytest.mark.reference
def test_weighted_l2_gradient_uses_the_symmetric_part_of_a():
    """Guards ``∇φ(x) = Ā x`` with ``Ā = (A + Aᵀ)/2`` for a non-symmetric ``A`` (with ``A``
    itself, ``∇φ*∘∇φ`` is still the identity, so only the closed form tells)."""
    a = np.array([[2.0, 0.7], [-0.3, 1.0]])
    x = np.random.default_rng(2).standard_normal((5, 2))
    with enable_x64(True):
        got = np.asarray(mm.weighted_L2(a).grad(jnp.asarray(x)))
    np.testing.assert_allclose(got, x @ (0.5 * (a + a.T)).T, rtol=1e-12)


@pytest.mark.reference
def test_projection_maps_land_on_their_sets():
    """Guards the projections' formulas: ball of radius ``r`` about ``c`` (points outside land
    at distance ``r``, inside stay), hyperplane ``a·x = b`` with ``b != 0``."""
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
