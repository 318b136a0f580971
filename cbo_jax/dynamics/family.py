"""The CBX family: every dynamic of CBXpy as a pure ``(init, step)`` pair.

Each builder takes an objective (a population function ``(N, d) -> (N,)``, or a stacked
pytree one) and a config (or keyword overrides) and returns a
:class:`~cbo_jax.dynamics.cbo.Dynamics` for :func:`cbo_jax.simulate`, so every dynamic
runs ``M`` vmapped runs (``num_runs``), parameter sweeps (``params=``, including a
dynamic's own numbers such as ``kappa``), and a device mesh (``mesh=``). They share one
step core (:mod:`cbo_jax.dynamics.core`).

=========================  ======================================  ==================================
CBXpy                      cbo_jax                                 module
=========================  ======================================  ==================================
``CBO``                    :func:`~cbo_jax.cbo`                    :mod:`cbo_jax.dynamics.cbo`
``CBOMemory``              :func:`cbo_memory`                      :mod:`cbo_jax.dynamics.memory`
``PSO``                    :func:`pso`                             :mod:`cbo_jax.dynamics.pso`
``CBS``                    :func:`cbs`                             :mod:`cbo_jax.dynamics.cbs`
``PolarCBO``               :func:`polar_cbo`                       :mod:`cbo_jax.dynamics.polar`
``AdamCBO``                :func:`adam_cbo`                        :mod:`cbo_jax.dynamics.adam`
``MirrorCBO``              :func:`mirror_cbo`                      :mod:`cbo_jax.dynamics.mirror`
``DriftConstrainedCBO``    :func:`drift_constrained_cbo`           :mod:`cbo_jax.dynamics.constrained`
``HyperSurfaceCBO``        :func:`hypersurface_cbo`                :mod:`cbo_jax.dynamics.constrained`
``RegCombinationCBO``      :func:`reg_combination_cbo`             :mod:`cbo_jax.dynamics.constrained`
=========================  ======================================  ==================================

``DYNAMICS`` maps each name to its builder and ``CONFIGS`` to its config class.
"""

from __future__ import annotations

from typing import Callable

from cbo_jax.dynamics.adam import AdamCBOConfig, adam_cbo
from cbo_jax.dynamics.cbo import CBOConfig, Dynamics, cbo
from cbo_jax.dynamics.cbs import CBSConfig, cbs
from cbo_jax.dynamics.constrained import (DriftConstrainedConfig, HypersurfaceConfig, RegCombinationConfig,
                                          drift_constrained_cbo, hypersurface_cbo, reg_combination_cbo)
from cbo_jax.dynamics.memory import CBOMemoryConfig, cbo_memory
from cbo_jax.dynamics.mirror import MirrorCBOConfig, mirror_cbo
from cbo_jax.dynamics.polar import PolarCBOConfig, polar_cbo
from cbo_jax.dynamics.pso import PSOConfig, pso

__all__ = ["DYNAMICS", "CONFIGS", "cbo", "cbo_memory", "pso", "cbs", "polar_cbo", "adam_cbo", "mirror_cbo",
           "drift_constrained_cbo", "hypersurface_cbo", "reg_combination_cbo", "CBOConfig", "CBOMemoryConfig",
           "PSOConfig", "CBSConfig", "PolarCBOConfig", "AdamCBOConfig", "MirrorCBOConfig", "DriftConstrainedConfig",
           "HypersurfaceConfig", "RegCombinationConfig"]

DYNAMICS: dict[str, Callable[..., Dynamics]] = {
    "cbo": cbo, "cbo_memory": cbo_memory, "pso": pso, "cbs": cbs, "polar_cbo": polar_cbo, "adam_cbo": adam_cbo,
    "mirror_cbo": mirror_cbo, "drift_constrained_cbo": drift_constrained_cbo, "hypersurface_cbo": hypersurface_cbo,
    "reg_combination_cbo": reg_combination_cbo,
}

CONFIGS = {
    "cbo": CBOConfig, "cbo_memory": CBOMemoryConfig, "pso": PSOConfig, "cbs": CBSConfig, "polar_cbo": PolarCBOConfig,
    "adam_cbo": AdamCBOConfig, "mirror_cbo": MirrorCBOConfig, "drift_constrained_cbo": DriftConstrainedConfig,
    "hypersurface_cbo": HypersurfaceConfig, "reg_combination_cbo": RegCombinationConfig,
}
