"""Constraints and hypersurfaces as plain functions, for the constrained CBO dynamics.

A **constraint** is a function ``g(x) -> scalar`` of one particle ``x ∈ R^d``; the
admissible set is ``{g_1 = ... = g_K = 0}``. Gradients and Hessians come from JAX's
automatic differentiation, so any differentiable function works. The constructors
below are CBXpy's (``cbx.constraints``), as :class:`Constraint` objects: callables like
any other constraint that also carry their gradient and the structure of their Hessian,
which the dynamics use for closed-form solves (a sphere's Hessian is ``2I``, so the
implicit steps are a Sherman–Morrison update or a division instead of a ``d × d`` solve
per particle):

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

from cbo_jax import _checks

__all__ = ["Constraint", "sphere", "plane", "quadric", "as_constraints", "penalty", "Surface", "surface", "sphere_surface",
           "plane_surface", "stiefel_surface", "get_surface"]


class Constraint:
    """A constraint function ``g(x)`` of one particle with what is known of its derivatives.

    Attributes:
      fn: ``g(x) -> scalar``.
      grad: ``∇g`` of a population, ``(N, d) -> (N, d)``, or ``None`` (automatic differentiation).
      hess_scale: ``c`` when the Hessian is ``c I`` everywhere, else ``None``.
      hess: the constant Hessian matrix (a NumPy array), or ``None``.
    """

    def __init__(self, fn: Callable, *, grad: Callable | None = None, hess_scale: float | None = None,
                 hess=None, name: str = "g"):
        self.fn, self.grad, self.hess_scale, self.hess, self.__name__ = fn, grad, hess_scale, hess, name

    def __call__(self, x):
        return self.fn(x)

    def __repr__(self):
        return f"Constraint({self.__name__})"


def sphere(r: float = 1.0) -> Constraint:
    """``g(x) = |x|² - r²`` (CBXpy's ``sphereConstraint``); ``∇g = 2x``, Hessian ``2I``."""
    r = _checks.finite_number("sphere r", r)  # else a NaN radius makes each constraint value NaN, a string fails traced
    return Constraint(lambda x: jnp.sum(x * x) - r ** 2, grad=lambda x: 2 * x, hess_scale=2.0, name="sphere")


def _hyperplane(a, b, x):
    """The plane ``a·x = b`` in ``x``'s dimension (a length-1 normal stands for ``(a, ..., a)``):
    its unit normal ``a/|a|`` and signed distance ``(a·x - b)/|a|`` along the last axis."""
    full = jnp.broadcast_to(jnp.asarray(a, x.dtype), x.shape[-1:])
    norm = jnp.linalg.norm(full)
    return full / norm, (jnp.sum(full * x, axis=-1) - b) / norm


def plane(a, b: float = 1.0) -> Constraint:
    """``g(x) = (a·x - b)/|a|`` (CBXpy's ``planeConstraint``); ``∇g = a/|a|``, Hessian ``0``.

    A normal of length 1 stands for ``(a, ..., a)`` in the particles' dimension, ``|a|`` that
    vector's norm."""
    a, _ = _checks.normal_vector("plane", a)
    b = _checks.finite_number("plane b", b)
    return Constraint(lambda x: _hyperplane(a, b, x)[1], hess_scale=0.0, name="plane",
                      grad=lambda x: jnp.broadcast_to(_hyperplane(a, b, x)[0], x.shape))


def quadric(A, b=None, c: float = 0.0) -> Constraint:
    """``g(x) = xᵀAx + b·x + c`` (CBXpy's ``quadricConstraint``); Hessian ``A + Aᵀ``."""
    A = np.asarray(A, np.float64)
    b = np.zeros(A.shape[0]) if b is None else np.asarray(b, np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"quadric: A must be a square (d, d) matrix, got shape {A.shape}")
    c = _checks.finite_number("quadric c", c)
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(b))):
        raise ValueError("quadric: A and b must be finite")
    if b.shape != (A.shape[0],):
        raise ValueError(f"quadric: b must have shape ({A.shape[0]},) like A's rows, got {b.shape}")
    return Constraint(lambda x: x @ (x @ jnp.asarray(A, x.dtype)) + jnp.sum(jnp.asarray(b, x.dtype) * x) + c,
                      grad=lambda x: x @ jnp.asarray(A + A.T, x.dtype) + jnp.asarray(b, x.dtype),
                      hess=A + A.T, name="quadric")


def values(cs, x):
    """``(K, N)``: every constraint at every particle of ``x`` (``(N, d)``)."""
    return jnp.stack([jax.vmap(g)(x) for g in cs])


def gradients(cs, x):
    """``(K, N, d)``: ``∇g_k`` at every particle (closed forms where known)."""
    return jnp.stack([g.grad(x) if getattr(g, "grad", None) is not None else jax.vmap(jax.grad(g))(x) for g in cs])


def hessians(cs, x):
    """``(K, N, d, d)`` Hessians (constant ones broadcast, the rest by automatic differentiation)."""
    out = []
    for g in cs:
        if getattr(g, "hess_scale", None) is not None:
            out.append(jnp.broadcast_to(g.hess_scale * jnp.eye(x.shape[1], dtype=x.dtype), x.shape + (x.shape[1],)))
        elif getattr(g, "hess", None) is not None:
            out.append(jnp.broadcast_to(jnp.asarray(g.hess, x.dtype), x.shape + (x.shape[1],)))
        else:
            out.append(jax.vmap(jax.hessian(g))(x))
    return jnp.stack(out)


def scaled_identity(cs) -> bool:
    """Whether every constraint's Hessian is a multiple of the identity (closed-form solves)."""
    return all(getattr(g, "hess_scale", None) is not None for g in cs)


_NAMED: dict[str, Callable[..., Constraint]] = {"sphere": sphere, "plane": plane, "quadric": quadric}


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
            kwargs = {k: v for k, v in c.items() if k != "name"}
            try:
                c = _NAMED[name](**kwargs)
            except TypeError as err:  # an unknown or missing keyword: a ValueError naming the constraint
                import inspect

                raise ValueError(f"constraint {name!r} takes {list(inspect.signature(_NAMED[name]).parameters)}, got "
                                 f"{sorted(kwargs)} ({err})") from None
        if not callable(c):
            raise ValueError(f"a constraint must be a function g(x) -> scalar of one particle, got {c!r}")
        out.append(c if isinstance(c, Constraint) else Constraint(c, name=getattr(c, "__name__", "g")))
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
    """A hypersurface ``{d(x) = 0}`` for hypersurface CBO; every function acts on a population ``(N, D)``.

    Attributes:
      name: a label (``"sphere"`` enables the anisotropic noise's Itô correction).
      distance: the signed distance of one particle ``d(x)`` (or ``None``).
      grad: ``∇d`` per particle ``(N, D)``; laplacian: ``Δd`` per particle ``(N,)``;
      proj: the projection onto the surface; tangent: ``tangent(x, z)``, the projection
      of ``z`` onto the tangent space at ``x``.
    """

    name: str
    distance: Callable | None
    grad: Callable
    laplacian: Callable
    proj: Callable
    tangent: Callable


def surface(distance: Callable, *, proj: Callable | None = None, name: str = "custom") -> Surface:
    """A :class:`Surface` from a signed distance function of one particle (``∇d``, ``Δd`` by autodiff;
    projection ``x - d(x) ∇d(x)`` unless ``proj``, a function of one particle, is given)."""
    if not callable(distance):
        raise ValueError("surface needs a signed distance function d(x) -> scalar")
    grad1 = jax.grad(distance)

    def laplacian1(x):
        return jnp.trace(jax.hessian(distance)(x))

    def proj1(x):
        return x - distance(x) * grad1(x)

    def tangent1(x, z):
        g = grad1(x)
        return z - g * jnp.sum(g * z)

    return Surface(name, distance, jax.vmap(grad1), jax.vmap(laplacian1), jax.vmap(proj or proj1),
                   jax.vmap(tangent1))


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def sphere_surface() -> Surface:
    """The unit sphere, ``d(x) = |x| - 1`` (CBXpy's ``sphereDistance``): ``∇d = x/|x|``,
    ``Δd = (D - 1)/|x|``, projection ``x/|x|``."""

    def tangent(x, z):
        g = _unit(x)
        return z - g * jnp.sum(g * z, axis=-1, keepdims=True)

    return Surface("sphere", lambda x: jnp.linalg.norm(x) - 1.0, _unit,
                   lambda x: (x.shape[-1] - 1) / jnp.linalg.norm(x, axis=-1), _unit, tangent)


def plane_surface(a, b: float = 1.0) -> Surface:
    """The hyperplane ``a·x = b``, ``d(x) = (a·x - b)/|a|`` (CBXpy's ``planeDistance``); a normal
    of length 1 stands for ``(a, ..., a)`` in the particles' dimension."""
    a, _ = _checks.normal_vector("plane_surface", a)

    def dist(x):
        return _hyperplane(a, b, x)[1]

    def grad(x):
        return jnp.broadcast_to(_hyperplane(a, b, x)[0], x.shape)

    def tangent(x, z):
        unit, _ = _hyperplane(a, b, x)
        return z - unit * jnp.sum(unit * z, axis=-1, keepdims=True)

    def proj(x):
        unit, d = _hyperplane(a, b, x)
        return x - d[..., None] * unit

    return Surface("plane", dist, grad, lambda x: jnp.zeros(x.shape[:-1], x.dtype), proj, tangent)


def stiefel_surface(n: int, k: int) -> Surface:
    """The Stiefel manifold ``{X ∈ R^{n×k}: XᵀX = I}`` for particles of length ``n k`` (CBXpy's
    ``StiefelDistance``: normal ``X``, constant ``Δ = (2n - k - 1)/2``, polar projection)."""
    if not (_checks.is_integer(n) and _checks.is_integer(k) and n >= 1 and k >= 1):
        raise ValueError(f"stiefel_surface: n and k must be integers >= 1, got n={n!r}, k={k!r}")

    def fits(x):
        # reshape(-1, n, k) of particles of another length would pair rows up silently
        if x.shape[-1] != n * k:
            raise ValueError(f"the Stiefel surface for n * k = {n * k} needs particles of that length, got d = "
                             f"{x.shape[-1]}")

    def proj(x):
        fits(x)
        u, _, vh = jnp.linalg.svd(x.reshape(-1, n, k), full_matrices=False)
        return (u @ vh).reshape(x.shape)

    def tangent(x, z):
        fits(x)
        X, Z = x.reshape(-1, n, k), z.reshape(-1, n, k)
        sym = jnp.swapaxes(Z, -1, -2) @ X + jnp.swapaxes(X, -1, -2) @ Z
        return (Z - 0.5 * X @ sym).reshape(x.shape)

    return Surface("stiefel", None, lambda x: x, lambda x: jnp.full(x.shape[:-1], (2 * n - k - 1) / 2, x.dtype),
                   proj, tangent)


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
        takes = {"sphere": (), "plane": ("a", "b"), "Stiefel": ("nk",)}
        if name not in takes:
            raise ValueError(f"unknown surface {name!r}; choose from ['sphere', 'plane', 'Stiefel'] or pass a function")
        extra = sorted(set(kw) - set(takes[name]))
        if extra:  # {"name": "sphere", "r": 2} would be the unit sphere, the radius silently dropped
            hint = " (it is the unit sphere; pass a signed distance function for another one)" if name == "sphere" else ""
            raise ValueError(f"surface {name!r} takes {list(takes[name]) or 'no parameters'}, got {extra}{hint}")
        if name == "sphere":
            return sphere_surface()
        if name == "plane":
            if "a" not in kw:
                raise ValueError("surface 'plane' needs its normal a (and b, default 1)")
            return plane_surface(**kw)
        nk = kw.get("nk", (1, 1))
        if np.ndim(nk) != 1 or len(nk) != 2:
            raise ValueError(f"surface 'Stiefel': nk must be a pair (n, k), got {nk!r}")
        return stiefel_surface(*nk)
    if callable(spec):
        return surface(spec)
    raise ValueError(f"surface must be None, a dict, a signed distance function or a Surface; got {spec!r}")
