"""Mirror maps for MirrorCBO: a convex ``φ`` through its gradient ``∇φ`` and ``∇φ*``.

A mirror map acts row by row on ``(..., d)`` arrays (one particle per row): ``grad``
maps a particle ``x`` to the dual variable ``y = ∇φ(x)``, ``grad_conj`` maps a dual
variable back, ``x = ∇φ*(y)``. MirrorCBO (:mod:`cbo_jax.dynamics.mirror`) moves ``y`` by
the CBO update and reads the particles off through ``∇φ*``; a projection map
(``∇φ = id``, ``∇φ*`` a projection) turns it into projected CBO.

Every mirror map CBXpy 1.0.4 ships (``cbx.dynamics.mirrorcbo.mirror_dict``), under the
same names, plus :func:`mirror_map` for your own pair of functions:

Each entry gives ``∇φ(x)`` ; ``∇φ*(y)``:

- ``L2`` (``None``): ``λ x`` ; ``y / λ``
- ``ElasticNet``: ``x/δ + λ sign(x)`` ; ``δ sign(y) max(|y| - λ, 0)``
- ``ProjectionBall``: ``x`` ; projection onto the ball ``|x - c| <= r``
- ``ProjectionHyperplane``: ``x`` ; projection onto ``a·x = b``
- ``ProjectionSphere``: ``x`` ; ``r y / |y|``
- ``ProjectionSquare``: ``x`` ; CBXpy's map onto the square's boundary (clip to ``[-r, r]``,
  then the largest coordinate becomes ``±1``)
- ``ProjectionStiefel``: ``x`` ; ``U Vᵀ`` of the SVD of ``y`` reshaped to ``(n, k)``
- ``LogBarrierBox``: ``1/(1-x) - 1/(1+x)`` ; ``y / (1 + √(1 + y²))`` (the box ``(-1, 1)^d``)
- ``NonsmoothBarrier``: ``sign(x)/(1 - |x|)²`` ; ``sign(y) max(1 - |y|^{-1/2}, 0)``
- ``weighted_L2``: ``Ā x`` ; ``Ā⁻¹ y`` with ``Ā = (A + Aᵀ)/2``
- ``Entropy``: ``log(1/(x + ε)) - 1`` ; ``exp(-(y + 1))``
- ``EntropySimplex``: ``log(max(x, 1e-32)) + 1`` ; ``softmax(y)`` (the simplex)

``ProjectionStiefel`` is not in CBXpy's table (CBXpy has a Stiefel projection elsewhere).
Three deviations from CBXpy, all fixes: ``ProjectionHyperplane``'s default normal
``(1, ..., 1)`` is normalised in the particles' dimension (CBXpy's is not, so its default
is not a projection for ``d > 1``); ``LogBarrierBox``'s ``∇φ*`` is written as
``y / (1 + √(1 + y²))`` (CBXpy's ``(√(1 + y²) - 1)/y`` is the same number but NaN at
``y = 0`` and loses digits near it), and ``weighted_L2``'s ``∇φ*`` solves with ``Ā``
(CBXpy returns ``y`` with a warning that it is not implemented).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks

__all__ = ["MirrorMap", "mirror_map", "get_mirror_map", "MIRROR_MAPS", "L2", "ElasticNet", "ProjectionBall",
           "ProjectionHyperplane", "ProjectionSphere", "ProjectionSquare", "ProjectionStiefel", "LogBarrierBox",
           "NonsmoothBarrier", "weighted_L2", "Entropy", "EntropySimplex"]


class MirrorMap(NamedTuple):
    """``grad(x) = ∇φ(x)`` and ``grad_conj(y) = ∇φ*(y)``, both ``(..., d) -> (..., d)``."""

    name: str
    grad: Callable
    grad_conj: Callable


def mirror_map(grad: Callable, grad_conj: Callable, name: str = "custom") -> MirrorMap:
    """A mirror map from your own ``∇φ`` and ``∇φ*`` (row-wise functions of ``(N, d)`` arrays)."""
    if not (callable(grad) and callable(grad_conj)):
        raise ValueError("mirror_map needs two callables, grad and grad_conj")
    return MirrorMap(name, grad, grad_conj)


def _identity(x):
    return x


def L2(lamda: float = 1.0) -> MirrorMap:
    """``φ(x) = λ |x|²/2``, ``λ > 0`` (MirrorCBO is then plain CBO for ``λ = 1``)."""
    _checks.positive("L2 lamda", lamda)
    return MirrorMap("L2", lambda x: lamda * x, lambda y: (1 / lamda) * y)


def ElasticNet(delta: float = 1.0, lamda: float = 1.0) -> MirrorMap:
    """``φ(x) = |x|²/(2δ) + λ |x|_1`` (``δ > 0``, ``λ >= 0``): sparse particles."""
    _checks.positive("ElasticNet delta", delta)
    _checks.non_negative("ElasticNet lamda", lamda)
    return MirrorMap("ElasticNet", lambda x: (1 / delta) * x + lamda * jnp.sign(x),
                     lambda y: delta * jnp.sign(y) * jnp.maximum(jnp.abs(y) - lamda, 0))


def ProjectionBall(radius: float = 1.0, center=0.0) -> MirrorMap:
    """Projection onto the ball ``|x - c| <= r`` (``r > 0``)."""
    _checks.positive("ProjectionBall radius", radius)
    c = jnp.asarray(center)

    def conj(y):
        ny = jnp.linalg.norm(y - c, axis=-1, keepdims=True)
        return c + (y - c) / jnp.maximum(1, ny / radius)

    return MirrorMap("ProjectionBall", _identity, conj)


def ProjectionHyperplane(a=None, b: float = 0.0) -> MirrorMap:
    """Projection onto the hyperplane ``a·x = b`` (CBXpy's default ``a = (1, ..., 1)``).

    A normal of length 1 (the default) stands for ``(a, ..., a)`` in the particles' ``d``:
    ``|a|²`` is that vector's (CBXpy divides by the length-1 vector's, ``a²``, and its
    default is then no projection for ``d > 1``)."""
    a, _ = _checks.normal_vector("ProjectionHyperplane", np.ones((1,)) if a is None else a)

    def conj(y):
        av = jnp.broadcast_to(jnp.asarray(a, y.dtype), y.shape[-1:])
        return y - ((jnp.sum(av * y, axis=-1, keepdims=True) - b) / jnp.sum(av * av)) * av

    return MirrorMap("ProjectionHyperplane", _identity, conj)


def ProjectionSphere(r: float = 1.0) -> MirrorMap:
    """Projection onto the sphere ``|x| = r`` (``r > 0``); ``y = 0``, where every point of the sphere is
    nearest, goes to ``r e_1`` (CBXpy's ``r y / |y|`` is NaN there, and the NaN stayed in the run)."""
    _checks.positive("ProjectionSphere r", r)

    def conj(y):
        ny = jnp.linalg.norm(y, axis=-1, keepdims=True)
        e1 = (jnp.arange(y.shape[-1]) == 0).astype(y.dtype)
        return jnp.where(ny > 0, r * y / jnp.where(ny > 0, ny, 1), r * e1)

    return MirrorMap("ProjectionSphere", _identity, conj)


def ProjectionSquare(r: float = 1.0) -> MirrorMap:
    """CBXpy's ``ProjectionSquare``: clip to ``[-r, r]``, then set the coordinate of largest
    modulus to its sign (``±1``, as CBXpy does, whatever ``r``). ``r > 0``."""
    _checks.positive("ProjectionSquare r", r)  # r <= 0 would clip every coordinate to -r silently

    def conj(y):
        c = jnp.clip(y, -r, r)
        top = jnp.argmax(jnp.abs(c), axis=-1)
        hot = jnp.arange(c.shape[-1]) == top[..., None]
        return jnp.where(hot, jnp.sign(c), c)

    return MirrorMap("ProjectionSquare", _identity, conj)


def ProjectionStiefel(nk=None) -> MirrorMap:
    """Projection onto the Stiefel manifold ``{X ∈ R^{n×k}: XᵀX = I}`` (particles of ``d = n k``)."""
    nk = (1, 1) if nk is None else tuple(nk)
    if len(nk) != 2 or not all(_checks.is_integer(v) and v >= 1 for v in nk):
        raise ValueError(f"ProjectionStiefel: nk must be two integers (n, k) >= 1, got {nk!r}")

    def conj(y):
        if y.shape[-1] != nk[0] * nk[1]:  # else a reshape TypeError from deep inside jnp
            raise ValueError(f"ProjectionStiefel with nk = {nk} needs particles of dimension n k = {nk[0] * nk[1]}, "
                             f"got {y.shape[-1]}")
        u, _, vh = jnp.linalg.svd(y.reshape(y.shape[:-1] + nk), full_matrices=False)
        return (u @ vh).reshape(y.shape)

    return MirrorMap("ProjectionStiefel", _identity, conj)


def LogBarrierBox() -> MirrorMap:
    """``φ(x) = Σ -log(1 - x_k) - log(1 + x_k)``: particles stay in the open box ``(-1, 1)^d``.

    ``∇φ*(y) = y / (1 + √(1 + y²))``, with ``√(1 + y²)`` as ``hypot(1, y)``: ``y²`` would
    overflow float32 beyond ``|y| ≈ 1.8e19`` and the inverse give 0 there instead of ``±1``."""
    return MirrorMap("LogBarrierBox", lambda x: 1 / (1 - x) - 1 / (1 + x),
                     lambda y: y / (1 + jnp.hypot(jnp.ones((), y.dtype), y)))


def NonsmoothBarrier() -> MirrorMap:
    """``φ(x) = Σ |x_k| / (1 - |x_k|)``."""
    return MirrorMap("NonsmoothBarrier", lambda x: jnp.sign(x) / (1 + jnp.abs(x) ** 2 - 2 * jnp.abs(x)),
                     lambda y: jnp.sign(y) * jnp.maximum(1 - jnp.sqrt(1 / jnp.abs(y)), 0))


def weighted_L2(A=None) -> MirrorMap:
    """``φ(x) = xᵀ A x / 2``: ``∇φ(x) = Ā x``, ``∇φ*(y) = Ā⁻¹ y``, ``Ā = (A + Aᵀ)/2``."""
    A = np.eye(1) if A is None else np.asarray(A, np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or not np.all(np.isfinite(A)):
        raise ValueError(f"weighted_L2: A must be a finite square (d, d) matrix, got shape {A.shape}")
    sym = 0.5 * (A + A.T)
    if np.min(np.linalg.eigvalsh(sym)) <= 0:  # φ is then not strictly convex: ∇φ has no inverse
        raise ValueError("weighted_L2: the symmetric part (A + Aᵀ)/2 must be positive definite, so that φ(x) = "
                         "xᵀAx/2 is strictly convex and ∇φ* = Ā⁻¹ exists")
    inv = np.linalg.inv(sym)
    return MirrorMap("weighted_L2", lambda x: x @ jnp.asarray(sym, x.dtype).T,
                     lambda y: y @ jnp.asarray(inv, y.dtype).T)


def Entropy(scale: float = 1.0) -> MirrorMap:
    """CBXpy's ``Entropy``: ``φ(x) = Σ x_k log(1/x_k)`` (positive particles), ``∇φ(x) =
    log(1/(x + ε)) - 1`` with ``ε`` float32's machine epsilon and ``∇φ*(y) = exp(-(y + 1))``.

    As in CBXpy, this ``φ`` is the (concave) Shannon entropy, the negative of ``Σ x_k log x_k``,
    and ``scale`` is accepted and not used."""
    eps = float(np.finfo(np.float32).eps)
    return MirrorMap("Entropy", lambda x: jnp.log(1 / (x + eps)) - 1, lambda y: jnp.exp(-(y + 1)))


def EntropySimplex() -> MirrorMap:
    """Negative entropy on the simplex: particles are probability vectors (``∇φ*`` is a softmax)."""
    return MirrorMap("EntropySimplex", lambda x: jnp.log(jnp.maximum(x, 1e-32)) + 1,
                     lambda y: jax.nn.softmax(y, axis=-1))


MIRROR_MAPS: dict[str, Callable[..., MirrorMap]] = {
    "L2": L2, "None": L2, "ElasticNet": ElasticNet, "ProjectionBall": ProjectionBall,
    "ProjectionHyperplane": ProjectionHyperplane, "ProjectionSphere": ProjectionSphere,
    "ProjectionSquare": ProjectionSquare, "ProjectionStiefel": ProjectionStiefel, "LogBarrierBox": LogBarrierBox,
    "NonsmoothBarrier": NonsmoothBarrier, "weighted_L2": weighted_L2, "Entropy": Entropy,
    "EntropySimplex": EntropySimplex,
}


def get_mirror_map(spec) -> MirrorMap:
    """A :class:`MirrorMap` from a name, ``None`` (``L2``), a dict ``{"name": ..., **kwargs}``
    (CBXpy's forms) or a :class:`MirrorMap` / object with ``grad`` and ``grad_conj``."""
    if spec is None:
        return L2()
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict):
        name = spec.get("name")
        if name not in MIRROR_MAPS:
            raise ValueError(f"unknown mirror map {name!r}; choose from {sorted(MIRROR_MAPS)} or pass "
                             "cbo_jax.mirror_maps.mirror_map(grad, grad_conj)")
        kwargs = {k: v for k, v in spec.items() if k != "name"}
        try:
            return MIRROR_MAPS[name](**kwargs)
        except TypeError as err:  # an unknown keyword: name the map and its keywords, as a ValueError
            import inspect

            raise ValueError(f"mirror map {name!r} takes {list(inspect.signature(MIRROR_MAPS[name]).parameters)}, "
                             f"got {sorted(kwargs)} ({err})") from None
    if isinstance(spec, MirrorMap):
        return spec
    if callable(getattr(spec, "grad", None)) and callable(getattr(spec, "grad_conj", None)):
        return MirrorMap(type(spec).__name__, spec.grad, spec.grad_conj)
    raise ValueError(f"mirror_map must be a name, a dict, or have grad and grad_conj; got {spec!r}")
