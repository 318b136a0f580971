"""Constrained CBO: drift-constrained, hypersurface and regularised-combination dynamics.

Constraints are plain functions ``g(x) -> scalar`` of one particle
(:mod:`cbo_jax.constraints`); their gradients and Hessians come from automatic
differentiation. All three need an ``(N, d)`` array population; a constraint that
returns the wrong shape or a non-finite value at the initial particles is an error
before compilation.

* :func:`drift_constrained_cbo` (CBXpy's ``DriftConstrainedCBO``; Carrillo, Jin, Totzeck
  and Vaes, *An interacting particle consensus method for constrained global
  optimization*, 2024, eq. (2.3)): the constraint enters as a stiff drift
  ``-(1/ε) ∇G``, ``G = Σ_k g_k²``, treated implicitly::

      x ← x - (I + (dt/ε) ∇²G(x))^{-1} (λ1 dt (x - m_α) + (dt/ε) ∇G(x) + σ1 noise),

  with an optional independent noise ``σ_indep √dt ξ`` added (repeatedly) to a run whose
  particles have collapsed onto the previous consensus point (``mean |x_i - m|²/d <
  eps_indep``), drawn before the step's consensus, as CBXpy does.
* :func:`hypersurface_cbo` (CBXpy's ``HyperSurfaceCBO``; Fornasier, Huang, Pareschi and
  Sünnen, *Consensus-based optimization on hypersurfaces*, M3AS 30(14), 2020, eq. (2.6),
  and *on the sphere*, JMLR 22, 2021): the drift and noise are projected onto the tangent
  space, with the Itô correction of the surface's curvature, then projected back::

      x ← Π( x + P_x(-λ1 dt (x - m_α) + σ1 noise) - dt σ1²/2 |x - m_α|² Δd(x) ∇d(x) ).

  On the sphere ``P_x x = 0``, so the drift equals CBXpy's ``dt P_x m_α`` (CBXpy drops
  ``λ1``; it is ``1`` there). The anisotropic noise uses the sphere's correction
  ``dt σ1²/2 (|u|² + u∘u - 2 (u·x)²) x`` and needs the sphere.
* :func:`reg_combination_cbo` (CBXpy's ``RegCombinationCBO``; Carrillo, Totzeck and Vaes,
  *Consensus-based optimization and ensemble Kalman inversion for global optimization
  problems with constraints*, 2023, eq. (4.2)): CBO on the penalised objective
  ``f + (1/ν) Σ g_k²`` with a semi-implicit constraint drift ``-(dt/ε) ∇(Σ g_k²)``,
  ``∇g_k`` linearised at ``x``::

      (I + 2(dt/ε) Σ_k g_k H_k) x_new = x̃ - 2(dt/ε) Σ_k g_k (∇g_k - H_k x),
      x̃ = x - λ1 dt (x - m_α) + σ1 noise,

  which is CBXpy's closed form for its sphere, plane and quadric constraints and also
  allows several constraints at once. ``eps >= 1e15`` switches the constraint drift off.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax._xla_cpu import written_out
from cbo_jax import constraints as cons
from cbo_jax.dynamics import core
from cbo_jax.dynamics.cbo import Dynamics
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _no_gradient

__all__ = ["DriftConstrainedConfig", "HypersurfaceConfig", "RegCombinationConfig", "drift_constrained_cbo",
           "hypersurface_cbo", "reg_combination_cbo"]

_EPS_OFF = 1e15  # reg_combination_cbo: an eps at or above it leaves the constraint drift out


class DriftConstrainedParams(NamedTuple):
    eps: Any
    eps_indep: Any
    sigma_indep: Any


class RegCombinationParams(NamedTuple):
    eps: Any


def _check_constraints(cs, x0, n):
    core.require_array("x0", x0, "a constrained dynamic")
    for k, g in enumerate(cs):
        what = f"constraint {k} ({getattr(g, '__name__', 'g')})"
        core.check_values(what, core.host_eval(what, jax.vmap(g), x0), (n,))


@dataclasses.dataclass(frozen=True)
class DriftConstrainedConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus the constraint drift.

    Attributes:
      constraints: one function ``g(x) -> scalar`` or several (or CBXpy's dicts).
      eps: ``ε > 0``, the constraint drift's scale (CBXpy: 0.01).
      eps_indep: collapse threshold of the independent noise (CBXpy: 0.001).
      sigma_indep: strength of the independent noise (``0``: off, CBXpy's default).
    """

    constraints: Any = None
    eps: float = 0.01
    eps_indep: float = 0.001
    sigma_indep: float = 0.0

    EXTRA_RULES = {"eps": "positive", "eps_indep": "non_negative", "sigma_indep": "non_negative"}

    def __post_init__(self):
        super().__post_init__()
        cs = cons.as_constraints(self.constraints)
        if not cs:
            raise ValueError("drift_constrained_cbo needs at least one constraint function g(x)")
        object.__setattr__(self, "constraints", cs)
        _checks.positive("eps", self.eps)
        _checks.non_negative("eps_indep", self.eps_indep)
        _checks.non_negative("sigma_indep", self.sigma_indep)
        _no_gradient(self, "drift_constrained_cbo")

    def extra_params(self):
        return DriftConstrainedParams(float(self.eps), float(self.eps_indep), float(self.sigma_indep))

    def switched_off(self) -> dict:
        """Terms left out of the compiled step by this config's numbers (``params.validate``
        refuses a sweep that would switch them on): the independent noise at ``sigma_indep = 0``."""
        if self.sigma_indep > 0:
            return {}
        return {"extra.sigma_indep": (lambda v: v != 0, "sigma_indep=0, which leaves the independent noise",
                                     "a non-zero sigma_indep")}


def drift_constrained_cbo(objective: Callable[[PyTree], jax.Array], config: DriftConstrainedConfig | None = None,
                          **overrides: Any) -> Dynamics:
    """Drift-constrained CBO (see the module docstring)."""
    config = _checks.config_with("drift_constrained_cbo", DriftConstrainedConfig, config, overrides)
    cs = config.constraints
    structured = cons.scaled_identity(cs)
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        x = st.x
        u = pop.tree_sub(x, ctx.m)
        f = prm.dt / prm.extra.eps
        g, dg = cons.values(cs, x), cons.gradients(cs, x)             # (K, N), (K, N, d)
        x_tilde = (prm.lambda1 * prm.dt) * u + f * jnp.sum(2 * g[..., None] * dg, axis=0)   # ∇G = 2 Σ g_k ∇g_k
        if not quiet:
            scale, d = ctx.noise(ctx.key, u)
            x_tilde = x_tilde + (prm.sigma1 * scale) * d
        # A = I + f ∇²G,  ∇²G = 2 Σ_k (∇g_k ∇g_kᵀ + g_k H_k)
        if structured:  # H_k = c_k I: A = s I + U Uᵀ with U = √(2f) [∇g_k]; Woodbury with a K × K system
            s = 1 + 2 * f * sum(c.hess_scale * g[k] for k, c in enumerate(cs))              # (N,)
            U = jnp.sqrt(2 * f) * jnp.moveaxis(dg, 0, -1)                                     # (N, d, K)
            Ut_b = jnp.einsum("ndk,nd->nk", U, x_tilde)
            small = s[:, None, None] * jnp.eye(len(cs), dtype=x.dtype)[None] + jnp.einsum("ndk,ndl->nkl", U, U)
            w = jnp.linalg.solve(small, Ut_b[..., None])[..., 0]
            delta = (x_tilde - jnp.einsum("ndk,nk->nd", U, w)) / s[:, None]
        else:
            H = cons.hessians(cs, x)
            A = jnp.eye(x.shape[1], dtype=x.dtype) + 2 * f * jnp.sum(
                dg[..., :, None] * dg[..., None, :] + g[..., None, None] * H, axis=0)
            delta = jnp.linalg.solve(A, x_tilde[..., None])[..., 0]
        return x - delta, st.aux

    def kicks(state, x):
        """Whether the independent noise kicks ``x`` (the particles around ``state``'s consensus;
        their spread over the real agents, not a sharded run's NaN padding). Never where this run's
        ``sigma_indep`` is ``0`` (a sweep's point): a kick would not move them, and the prestep's
        loop would never end (CBXpy's ``indep_noise_step`` checks ``sigma_indep > 0`` too)."""
        agents = core.real_agents(state, x.shape[0])
        real = jnp.arange(x.shape[0]) < agents
        sq = jnp.where(real, jnp.sum((x - state.consensus) ** 2, axis=1), 0)
        spread = jnp.sum(sq) / agents.astype(sq.dtype) / x.shape[1]
        extra = state.params.extra
        return (state.step > 0) & (extra.sigma_indep > 0) & (spread < extra.eps_indep)

    def prestep(state, key):
        prm = state.params
        x0 = state.x

        def cond(carry):
            x, i = carry
            return kicks(state, x)

        def body(carry):
            x, i = carry
            z = core.draw_normal(jax.random.fold_in(key, i), x, jnp.arange(x.shape[0]), config.rng)
            return x + (prm.extra.sigma_indep * jnp.sqrt(prm.dt)) * z, i + 1

        x, n_kicks = jax.lax.while_loop(cond, body, (x0, jnp.zeros((), jnp.int32)))
        kicked = n_kicks > 0
        energy = jax.lax.cond(kicked, objective, lambda _: state.energy, x)
        return state._replace(x=x, energy=energy), kicked

    def check(x0, n, cfg):
        _check_constraints(cfg.constraints, x0, n)

    kernel = core.Kernel(name="drift_constrained_cbo", move=move, corrects=False, check=check,
                         prestep=prestep if config.sigma_indep > 0 else None,
                         prestep_evaluates=(lambda state: kicks(state, state.x)) if config.sigma_indep > 0 else None)
    return core.build(objective, config, kernel)


@dataclasses.dataclass(frozen=True)
class HypersurfaceConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus the surface.

    Attributes:
      surface: a :class:`~cbo_jax.constraints.Surface`, a signed distance function, CBXpy's
        ``sdf`` dicts, or ``None`` (the unit sphere).
      noise: ``"isotropic"`` by default (CBXpy's); ``"anisotropic"`` needs the sphere.
    """

    noise: Any = "isotropic"
    surface: Any = None

    def __post_init__(self):
        super().__post_init__()
        s = cons.get_surface(self.surface)
        object.__setattr__(self, "surface", s)
        if self.noise_kind not in ("isotropic", "anisotropic", "none"):
            raise ValueError(f"hypersurface_cbo has the isotropic and anisotropic noise (with their Itô "
                             f"corrections), not {self.noise!r}")
        if self.noise_kind == "anisotropic" and s.name != "sphere":
            raise ValueError("hypersurface_cbo's anisotropic noise correction is the sphere's; use noise='isotropic' "
                             f"on the surface {s.name!r}")
        _no_gradient(self, "hypersurface_cbo")


def hypersurface_cbo(objective: Callable[[PyTree], jax.Array], config: HypersurfaceConfig | None = None,
                     **overrides: Any) -> Dynamics:
    """Hypersurface CBO (see the module docstring)."""
    config = _checks.config_with("hypersurface_cbo", HypersurfaceConfig, config, overrides)
    s = config.surface
    tangent, proj, grad, lap = s.tangent, s.proj, s.grad, s.laplacian
    aniso = config.noise_kind == "anisotropic"
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        x = st.x
        u = pop.tree_sub(x, ctx.m)
        t = -(prm.lambda1 * prm.dt) * u
        if not quiet:
            scale, d = ctx.noise(ctx.key, u)
            t = t + (prm.sigma1 * scale) * d
        x_tilde = x + tangent(x, t)
        if not quiet:
            u2 = jnp.sum(u * u, axis=1, keepdims=True)
            c = prm.dt * prm.sigma1 ** 2 / 2
            if aniso:
                x_tilde = x_tilde - c * (u2 + u * u - 2 * jnp.sum(u * x, axis=1, keepdims=True) ** 2) * x
            else:
                x_tilde = x_tilde - c * lap(x)[:, None] * u2 * grad(x)
        return proj(x_tilde), st.aux

    def check(x0, n, cfg):
        core.require_array("x0", x0, "hypersurface_cbo")
        what = f"the surface {cfg.surface.name!r}"
        proj = core.host_eval(f"{what}'s projection", cfg.surface.proj, x0)
        if proj.shape != np.shape(x0):
            raise ValueError(f"{what}'s projection returned shape {proj.shape} for x0 of shape {np.shape(x0)}")
        core.host_eval(f"{what}'s normal", cfg.surface.grad, x0)

    kernel = core.Kernel(name="hypersurface_cbo", move=move, corrects=False, check=check, admissible=proj)
    return core.build(objective, config, kernel)


@dataclasses.dataclass(frozen=True)
class RegCombinationConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` plus the constraints and their weights.

    Attributes:
      constraints: one function ``g(x) -> scalar`` or several (or CBXpy's dicts).
      eps: ``ε > 0`` of the semi-implicit constraint drift (CBXpy: 0.01; ``>= 1e15``: off).
      nu: ``ν > 0``; the objective is penalised by ``(1/ν) Σ g_k²`` (CBXpy: 1).
    """

    constraints: Any = None
    eps: float = 0.01
    nu: float = 1.0

    EXTRA_RULES = {"eps": "positive"}

    def __post_init__(self):
        super().__post_init__()
        cs = cons.as_constraints(self.constraints)
        if not cs:
            raise ValueError("reg_combination_cbo needs at least one constraint function g(x)")
        object.__setattr__(self, "constraints", cs)
        _checks.positive("eps", self.eps)
        _checks.positive("nu", self.nu)
        _no_gradient(self, "reg_combination_cbo")

    def extra_params(self):
        return RegCombinationParams(float(self.eps))

    def switched_off(self) -> dict:
        """Terms left out of the compiled step (see :meth:`DriftConstrainedConfig.switched_off`):
        the semi-implicit constraint drift at ``eps >= 1e15``."""
        if self.eps < _EPS_OFF:
            return {}
        return {"extra.eps": (lambda v: v < _EPS_OFF, f"eps={float(self.eps):g} (>= 1e15), which leaves the constraint drift",
                              "an eps below 1e15")}


def reg_combination_cbo(objective: Callable[[PyTree], jax.Array], config: RegCombinationConfig | None = None,
                        **overrides: Any) -> Dynamics:
    """Regularised-combination CBO (see the module docstring). The dynamics' ``objective`` is the
    penalised one, ``f + (1/ν) Σ g_k²``."""
    config = _checks.config_with("reg_combination_cbo", RegCombinationConfig, config, overrides)
    cs = config.constraints
    penalised = cons.penalty(objective, cs, 1.0 / config.nu)
    structured = cons.scaled_identity(cs)
    one_constant = len(cs) == 1 and getattr(cs[0], "hess", None) is not None
    if one_constant:  # a single quadric: A_i = I + t_i H = Q (1 + t_i Λ) Qᵀ, one eigendecomposition
        lam_h, q_h = np.linalg.eigh(np.asarray(cs[0].hess, np.float64))
    implicit = config.eps < _EPS_OFF
    quiet = config.noise_kind == "none"

    def move(ctx: core.Move):
        st, prm = ctx.state, ctx.prm
        x = st.x
        u = pop.tree_sub(x, ctx.m)
        x_tilde = x - (prm.lambda1 * prm.dt) * u
        if not quiet:
            scale, d = ctx.noise(ctx.key, u)
            x_tilde = x_tilde + (prm.sigma1 * scale) * d
        if not implicit:
            return x_tilde, st.aux
        f = prm.dt / prm.extra.eps
        g, dg = cons.values(cs, x), cons.gradients(cs, x)
        if structured:  # H_k = c_k I: (1 + 2f Σ g_k c_k) x_new = x̃ - 2f Σ g_k (∇g_k - c_k x)
            s = 1 + 2 * f * sum(c.hess_scale * g[k] for k, c in enumerate(cs))
            rhs = x_tilde - 2 * f * sum(g[k][:, None] * (dg[k] - c.hess_scale * x) for k, c in enumerate(cs))
            # Written out once: otherwise XLA:CPU recomputes this elementwise update (with its
            # transposed read of the noise) inside each of its consumers; 1.12x faster
            # steps, the same numbers (benchmarks/RESULTS_cbx.md).
            return written_out(rhs / s[:, None], ctx.key), st.aux
        H = cons.hessians(cs, x)
        rhs = x_tilde - 2 * f * jnp.sum(g[..., None] * (dg - jnp.einsum("knab,nb->kna", H, x)), axis=0)
        if one_constant:
            q = jnp.asarray(q_h, x.dtype)
            t = (2 * f) * g[0]
            return ((rhs @ q) / (1 + t[:, None] * jnp.asarray(lam_h, x.dtype))) @ q.T, st.aux
        A = jnp.eye(x.shape[1], dtype=x.dtype) + 2 * f * jnp.sum(g[..., None, None] * H, axis=0)
        return jnp.linalg.solve(A, rhs[..., None])[..., 0], st.aux

    def check(x0, n, cfg):
        _check_constraints(cfg.constraints, x0, n)

    kernel = core.Kernel(name="reg_combination_cbo", move=move, corrects=False, check=check)
    return core.build(penalised, config, kernel)

