"""Mirror CBO: the CBO update in the dual space of a mirror map (CBXpy's ``MirrorCBO``).

Bungert, Hoffmann, Kim and Roith (*MirrorCBO: a consensus-based optimization method in
the spirit of mirror descent*, 2025, eq. (1.4)): for a convex ``φ`` with ``∇φ*`` mapping
onto the admissible set, the dual variables ``y_i = ∇φ(x_i)`` follow the CBO drift and
noise of the primal particles::

    dy_i = -λ1 (x_i - m_α) dt + σ1 D(x_i - m_α) dB_i,   x_i = ∇φ*(y_i).

Euler–Maruyama as in CBXpy: ``y ← y - λ1 dt u + σ1 · noise(u)`` with the (optionally
corrected) drift ``u = x - m_α``, then ``x = ∇φ*(y)``; ``y_0 = ∇φ(x_0)``. Mirror maps
live in :mod:`cbo_jax.mirror_maps` (every map CBXpy ships, or your own pair of
functions); a map that returns the wrong shape or a non-finite value at the initial
particles is an error before compilation. Needs an ``(N, d)`` array population.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax import mirror_maps
from cbo_jax.dynamics import core
from cbo_jax.dynamics.base import MirrorAux
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _no_gradient

__all__ = ["MirrorCBOConfig", "MirrorAux", "mirror_cbo"]


@dataclasses.dataclass(frozen=True)
class MirrorCBOConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus ``mirror_map``: a
    :class:`~cbo_jax.mirror_maps.MirrorMap`, a name of :data:`~cbo_jax.mirror_maps.MIRROR_MAPS`,
    a dict ``{"name": ..., **kwargs}`` or ``None`` (``L2``)."""

    mirror_map: Any = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "mirror_map", mirror_maps.get_mirror_map(self.mirror_map))
        _no_gradient(self, "mirror_cbo")


def mirror_cbo(objective: Callable[[PyTree], jax.Array], config: MirrorCBOConfig | None = None,
               **overrides: Any) -> Dynamics:
    """MirrorCBO (see the module docstring)."""
    config = _checks.config_with("mirror_cbo", MirrorCBOConfig, config, overrides)
    mm = config.mirror_map
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        u = ctx.correct(pop.tree_sub(st.x, ctx.m))
        y = st.aux.y - (prm.lambda1 * prm.dt) * u
        if not quiet:
            scale, d = ctx.noise(ctx.key, u)
            y = y + (prm.sigma1 * scale) * d
        return mm.grad_conj(y), MirrorAux(y=y)

    def check(x0, n, cfg):
        core.require_array("x0", x0, "mirror_cbo")
        what = f"the mirror map {mm.name!r}"
        y0 = core.host_eval(f"{what}'s grad", mm.grad, x0)
        core.check_values(f"{what}'s grad", y0, np.shape(x0))
        core.check_values(f"{what}'s grad_conj", core.host_eval(f"{what}'s grad_conj", mm.grad_conj, y0, "grad(x0)"),
                          np.shape(x0))

    kernel = core.Kernel(name="mirror_cbo", move=move, init_aux=lambda x0, e, prm: MirrorAux(y=mm.grad(x0)),
                         aux_rows=("y",), check=check, admissible=lambda x: mm.grad_conj(mm.grad(x)))
    return core.build(objective, config, kernel)
