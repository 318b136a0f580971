"""Constraints and hypersurfaces (cbo_jax.constraints): closed forms, penalties, bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import constraints as cons

from _stack import enable_x64


@pytest.mark.parametrize("spec,match", [
    ({"name": "sphere", "r": 2.0}, r"'sphere' takes no parameters, got \['r'\]"),  # was the unit sphere, silently
    ({"name": "Stiefel", "nk": (2, 1), "n": 3}, r"'Stiefel' takes \['nk'\], got \['n'\]"),
    ({"name": "plane"}, "needs its normal a"),  # was a TypeError
])
def test_get_surface_refuses_parameters_it_would_drop(spec, match):
    with pytest.raises(ValueError, match=match):
        cons.get_surface(spec)


def test_named_constraint_with_a_wrong_keyword_is_a_value_error():
    with pytest.raises(ValueError, match=r"constraint 'sphere' takes \['r'\], got \['radius'\]"):
        cons.as_constraints({"name": "sphere", "radius": 2.0})
    (g,) = cons.as_constraints({"name": "sphere", "r": 2.0})
    assert float(g(jnp.asarray([2.0, 0.0]))) == 0.0


@pytest.mark.parametrize("build,match", [
    (lambda c: c.sphere(float("nan")), "sphere r must be finite"),  # every g(x) was NaN
    (lambda c: c.sphere("2"), "sphere r must be a real number"),  # a TypeError once traced
    (lambda c: c.plane([1.0, 0.0], float("nan")), "plane b must be finite"),
    (lambda c: c.quadric(np.eye(2), None, float("inf")), "quadric c must be finite"),
    (lambda c: c.quadric([[1.0, float("nan")], [0.0, 1.0]]), "A and b must be finite"),
])
def test_constraint_constants_must_be_finite_numbers(build, match):
    with pytest.raises(ValueError, match=match):
        build(cons)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_penalty_adds_weight_times_the_squared_constraints():
    """Guards ``penalty(f, cs, weight) = f + weight Σ g²`` (the weight was never other than 1
    or 1/ν inside a dynamic's own test)."""
    x = np.random.default_rng(4).standard_normal((5, 2))
    with enable_x64(True):
        f = cons.penalty(lambda z: jnp.sum(z, -1), [cons.sphere(1.0), cons.plane([1.0, 2.0], 0.5)], weight=3.0)
        got = np.asarray(f(jnp.asarray(x)))
    g1 = np.sum(x * x, -1) - 1.0
    g2 = (x @ np.array([1.0, 2.0]) - 0.5) / np.sqrt(5.0)
    np.testing.assert_allclose(got, x.sum(-1) + 3.0 * (g1 ** 2 + g2 ** 2), rtol=1e-12)


@pytest.mark.reference
def test_sphere_surface_closed_forms_match_autodiff_of_the_distance():
    """Guards ``sphere_surface``'s ``Δd = (D - 1)/|x|``, ``∇d``, projection and tangent against
    :func:`surface` built from ``d(x) = |x| - 1`` by automatic differentiation, and the
    generic projection ``x - d(x) ∇d(x)`` (a radius-2 sphere: ``2 x/|x|``)."""
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


@pytest.mark.reference
def test_stiefel_tangent_projection_lands_in_the_tangent_space_and_is_idempotent():
    """Guards ``T = Z - ½ X (ZᵀX + XᵀZ)``: at ``X`` on the Stiefel manifold, ``XᵀT + TᵀX = 0``
    and ``T(T(Z)) = T(Z)``."""
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
