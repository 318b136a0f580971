"""Constraints and hypersurfaces as plain functions, for the constrained CBO dynamics.

A **constraint** is a function ``g(x) -> scalar`` of one particle ``x ∈ R^d``; the
admissible set is ``{g_1 = ... = g_K = 0}``. Gradients and Hessians come from JAX's
automatic differentiation, so any differentiable function works. The constructors
below are CBXpy's (``cbx.constraints``) as functions:

* :func:`sphere` ``|x|² - r²``; :func:`plane` ``(a·x - b)/|a|``;
  :func:`quadric` ``xᵀAx + b·x + c``.

:func:`penalty` adds ``ρ Σ_k g_k²`` to an objective (the penalty method; with it, plain
CBO is a constrained method, and :func:`~cbo_jax.dynamics.constrained.reg_combination_cbo`
uses it with ``ρ = 1/ν``).

A **surface** for hypersurface CBO is given by its signed distance function ``d(x)``:
``∇d`` and ``Δd`` by automatic differentiation, the projection ``x - d(x) ∇d(x)`` and the
tangent projection ``z - ∇d (∇d·z)`` unless given. :func:`sphere_surface`,
:func:`plane_surface` and :func:`stiefel_surface` are CBXpy's ``sdf`` choices.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["sphere", "plane", "quadric", "as_constraints", "penalty", "Surface", "surface", "sphere_surface",
           "plane_surface", "stiefel_surface", "get_surface"]


def sphere(r: float = 1.0) -> Callable:
    """``g(x) = |x|² - r²`` (CBXpy's ``sphereConstraint``)."""
    return lambda x: jnp.sum(x * x) - r ** 2


def plane(a, b: float = 1.0) -> Callable:
    """``g(x) = (a·x - b)/|a|`` (CBXpy's ``planeConstraint``)."""
    a = np.asarray(a, np.float64)
    norm = float(np.linalg.norm(a))
    return lambda x: (jnp.sum(jnp.asarray(a, x.dtype) * x) - b) / norm


def quadric(A, b=None, c: float = 0.0) -> Callable:
    """``g(x) = xᵀAx + b·x + c`` (CBXpy's ``quadricConstraint``)."""
    A = np.asarray(A, np.float64)
    b = np.zeros(A.shape[0]) if b is None else np.asarray(b, np.float64)
    return lambda x: x @ (x @ jnp.asarray(A, x.dtype)) + jnp.sum(jnp.asarray(b, x.dtype) * x) + c


_NAMED = {"sphere": sphere, "plane": plane, "quadric": quadric}


def as_constraints(constraints) -> tuple:
    """A tuple of single-particle functions from functions or CBXpy's dicts ``{"name": ..., **kwargs}``."""
    if constraints is None:
        return ()
    if callable(constraints) or isinstance(constraints, dict):
        constraints = [constraints]
    out = []
    for c in constraints:
        if isinstance(c, dict):
            name = c.get("name")
            if name not in _NAMED:
                raise ValueError(f"unknown constraint {name!r}; choose from {sorted(_NAMED)} or pass a function")
            c = _NAMED[name](**{k: v for k, v in c.items() if k != "name"})
        if not callable(c):
            raise ValueError(f"a constraint must be a function g(x) -> scalar of one particle, got {c!r}")
        out.append(c)
    return tuple(out)


def squared_sum(constraints) -> Callable:
    """``G(x) = Σ_k g_k(x)²`` for one particle."""
    cs = as_constraints(constraints)
    return lambda x: sum(g(x) ** 2 for g in cs)


def penalty(objective: Callable, constraints, weight: float = 1.0) -> Callable:
    """The population objective ``f(x) + weight · Σ_k g_k(x)²``."""
    G = jax.vmap(squared_sum(constraints))
    return lambda x: objective(x) + weight * G(x)


class Surface(NamedTuple):
    """A hypersurface ``{d(x) = 0}`` for hypersurface CBO (functions of one particle ``(D,)``).

    Attributes:
      name: a label (``"sphere"`` enables the anisotropic noise's Itô correction).
      distance: the signed distance ``d(x)``.
      grad: ``∇d(x)``; laplacian: ``Δd(x)``; proj: the projection onto the surface;
      tangent: ``tangent(x, z)``, the projection of ``z`` onto the tangent space at ``x``.
    """

    name: str
    distance: Callable | None
    grad: Callable
    laplacian: Callable
    proj: Callable
    tangent: Callable


def surface(distance: Callable, *, proj: Callable | None = None, name: str = "custom") -> Surface:
    """A :class:`Surface` from a signed distance function (``∇d``, ``Δd`` by autodiff)."""
    if not callable(distance):
        raise ValueError("surface needs a signed distance function d(x) -> scalar")
    grad = jax.grad(distance)

    def laplacian(x):
        return jnp.trace(jax.hessian(distance)(x))

    def default_proj(x):
        return x - distance(x) * grad(x)

    def tangent(x, z):
        g = grad(x)
        return z - g * jnp.sum(g * z)

    return Surface(name, distance, grad, laplacian, proj or default_proj, tangent)


def sphere_surface() -> Surface:
    """The unit sphere, ``d(x) = |x| - 1`` (CBXpy's ``sphereDistance``)."""
    return surface(lambda x: jnp.linalg.norm(x) - 1.0, proj=lambda x: x / jnp.linalg.norm(x), name="sphere")


def plane_surface(a, b: float = 1.0) -> Surface:
    """The hyperplane ``a·x = b``, ``d(x) = (a·x - b)/|a|`` (CBXpy's ``planeDistance``)."""
    a = np.asarray(a, np.float64)
    norm = float(np.linalg.norm(a))
    return surface(lambda x: (jnp.sum(jnp.asarray(a, x.dtype) * x) - b) / norm, name="plane")


def stiefel_surface(n: int, k: int) -> Surface:
    """The Stiefel manifold ``{X ∈ R^{n×k}: XᵀX = I}`` for particles of length ``n k`` (CBXpy's
    ``StiefelDistance``: normal ``X``, constant ``Δ = (2n - k - 1)/2``, polar projection)."""

    def proj(x):
        u, _, vh = jnp.linalg.svd(x.reshape(n, k), full_matrices=False)
        return (u @ vh).reshape(x.shape)

    def tangent(x, z):
        X, Z = x.reshape(n, k), z.reshape(n, k)
        return (Z - 0.5 * X @ (Z.T @ X + X.T @ Z)).reshape(x.shape)

    return Surface("stiefel", None, lambda x: x, lambda x: jnp.asarray((2 * n - k - 1) / 2, x.dtype), proj, tangent)


def get_surface(spec) -> Surface:
    """A :class:`Surface` from ``None`` (the unit sphere), CBXpy's dicts (``{"name": "sphere"}``,
    ``{"name": "plane", "a": ..., "b": ...}``, ``{"name": "Stiefel", "nk": (n, k)}``), a
    signed distance function, or a :class:`Surface`."""
    if spec is None:
        return sphere_surface()
    if isinstance(spec, Surface):
        return spec
    if isinstance(spec, dict):
        name = spec.get("name")
        kw = {k: v for k, v in spec.items() if k != "name"}
        if name == "sphere":
            return sphere_surface()
        if name == "plane":
            return plane_surface(**kw)
        if name == "Stiefel":
            return stiefel_surface(*kw.get("nk", (1, 1)))
        raise ValueError(f"unknown surface {name!r}; choose from ['sphere', 'plane', 'Stiefel'] or pass a function")
    if callable(spec):
        return surface(spec)
    raise ValueError(f"surface must be None, a dict, a signed distance function or a Surface; got {spec!r}")
