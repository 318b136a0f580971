"""Consensus-based sampling (CBS) in its optimisation and sampling modes (CBXpy's ``CBS``).

Carrillo, Hoffmann, Stuart and Vaes (*Consensus-based sampling*, Stud. Appl. Math.
148(3), 2022, eq. (1.4)): particles move toward the Gibbs-weighted mean ``m_α`` with a
noise shaped by the Gibbs-weighted covariance ``C_α`` of the particles::

    dx_i = -λ1 (x_i - m_α) dt + √(2 λ^{-1} C_α) dW_i,
    C_α = Σ_j w_j (x_j - m_α)(x_j - m_α)ᵀ,   w_j ∝ e^{-α E(x_j)},

with ``λ = 1`` in optimisation mode (the particles contract to a minimiser) and
``λ = (1 + α)^{-1}`` in sampling mode, where for a Gaussian target ``e^{-E}`` the
Gaussian itself is invariant (``tests/test_cbx_family.py`` checks the sample mean and
covariance). Discretised by Euler–Maruyama exactly as CBXpy 1.0.4 does (its ``CBS`` is
its ``CBO`` step with the covariance noise, ``σ = 1``)::

    x_i ← x_i - λ1 dt (x_i - m_α) + σ1 √(2 dt / λ) C_α^{1/2} ξ_i.

``σ1`` defaults to ``1`` here (CBXpy forces it to 1). With ``N < d + 1`` particles the
sampling-mode covariance is singular; that is an error before compilation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.dynamics import core
from cbo_jax.dynamics.cbo import Dynamics, cbo_kernel
from cbo_jax.population import PyTree
from cbo_jax.dynamics.memory import _no_gradient

__all__ = ["CBSConfig", "cbs"]


@dataclasses.dataclass(frozen=True)
class CBSConfig(core.FamilyConfig):
    """:class:`~cbo_jax.dynamics.core.FamilyConfig` with CBS's defaults.

    Attributes:
      mode: ``"sampling"`` (``λ = 1/(1 + α)``) or ``"optimization"`` (``λ = 1``).
      noise: ``"covariance"`` by default (CBXpy's); other noise models run the CBO step.
      sigma1: ``1.0`` by default.
    """

    noise: object = "covariance"
    mode: str = "sampling"

    def __post_init__(self):
        super().__post_init__()
        _checks.one_of("mode", self.mode, ("sampling", "optimization"))
        _no_gradient(self, "cbs")


def cbs(objective: Callable[[PyTree], jax.Array], config: CBSConfig | None = None,
        **overrides: Any) -> Dynamics:
    """Consensus-based sampling / optimisation (see the module docstring)."""
    config = _checks.config_with("cbs", CBSConfig, config, overrides)

    def check(x0, n, cfg):
        if cfg.noise_kind != "covariance" or cfg.mode != "sampling":
            return
        d = int(pop.ravel(x0)[0].shape[1]) if not isinstance(x0, np.ndarray) else int(np.prod(x0.shape[1:]))
        if n < d + 1:
            raise ValueError(f"sampling-mode CBS needs at least d + 1 = {d + 1} particles for a non-singular "
                             f"covariance in dimension d = {d}; got N = {n}")

    kernel = cbo_kernel(objective, config, name="cbs")._replace(check=check)
    return core.build(objective, config, kernel)
