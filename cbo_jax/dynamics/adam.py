"""CBO with adaptive momentum estimation (CBXpy's ``AdamCBO``).

Chen, Jin and Lyu (*A consensus-based global optimization method with adaptive momentum
estimation*, Commun. Comput. Phys. 31(4), 2022, Algorithm 1): the drift ``u = x - m_α``
feeds Adam's moment estimates, and the particles move by the bias-corrected ratio::

    M ← β1 M + (1 - β1) u,          V ← β2 V + (1 - β2) u ∘ u,
    x ← x - λ1 (M / (1 - β1^{k+1})) / (√(V / (1 - β2^{k+1})) + ε) + σ1 · noise(u),

``k`` the number of steps taken. As in CBXpy, ``λ1`` is the step size itself (no ``dt``
in the drift; ``dt`` enters through the noise, ``√dt``). Elementwise, so any stacked
pytree population works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.dynamics import core
from cbo_jax.dynamics.base import AdamAux
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _no_gradient

__all__ = ["AdamCBOConfig", "AdamParams", "AdamAux", "adam_cbo"]


class AdamParams(NamedTuple):
    """AdamCBO's own numbers (``Params.extra``)."""

    beta1: Any
    beta2: Any
    eps: Any


@dataclasses.dataclass(frozen=True)
class AdamCBOConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus Adam's ``β1, β2 ∈ [0, 1)`` and ``ε > 0``
    (CBXpy's ``betas=(0.9, 0.99)``, ``eps=1e-8``)."""

    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8

    EXTRA_RULES = {"beta1": "unit", "beta2": "unit", "eps": "positive"}

    def __post_init__(self):
        super().__post_init__()
        for name in ("beta1", "beta2"):
            v = _checks.finite_number(name, getattr(self, name))
            if not 0 <= v < 1:
                raise ValueError(f"{name} must lie in [0, 1), got {v}")
        _checks.positive("eps", self.eps)
        _no_gradient(self, "adam_cbo")

    def extra_params(self) -> AdamParams:
        return AdamParams(float(self.beta1), float(self.beta2), float(self.eps))


def adam_cbo(objective: Callable[[PyTree], jax.Array], config: AdamCBOConfig | None = None,
             **overrides: Any) -> Dynamics:
    """AdamCBO (see the module docstring)."""
    config = _checks.config_with("adam_cbo", AdamCBOConfig, config, overrides)
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        b1, b2, eps = prm.extra.beta1, prm.extra.beta2, prm.extra.eps
        u = pop.tree_sub(st.x, ctx.m)
        m = jax.tree_util.tree_map(lambda a, g: b1 * a + (1 - b1) * g, st.aux.m, u)
        v = jax.tree_util.tree_map(lambda a, g: b2 * a + (1 - b2) * g ** 2, st.aux.v, u)
        k = (st.step + 1).astype(st.energy.dtype)
        mf, vf = 1 / (1 - b1 ** k), 1 / (1 - b2 ** k)
        step = jax.tree_util.tree_map(lambda mi, vi: prm.lambda1 * ((mi * mf) / ((vi * vf) ** 0.5 + eps)), m, v)
        if not quiet:
            scale, d = ctx.noise(ctx.key, u)
            step = jax.tree_util.tree_map(lambda s, di: s - prm.sigma1 * (scale * di), step, d)
        x = jax.tree_util.tree_map(jnp.subtract, st.x, step)
        return x, core_aux(m, v)

    def core_aux(m, v):
        return AdamAux(m=m, v=v)

    kernel = core.Kernel(name="adam_cbo", move=move, corrects=False, aux_rows=("m", "v"),
                         init_aux=lambda x0, e, prm: AdamAux(*(jax.tree_util.tree_map(jnp.zeros_like, x0),) * 2))
    return core.build(objective, config, kernel)
