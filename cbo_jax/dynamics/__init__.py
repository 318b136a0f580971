"""Particle systems as pure ``(init, step)`` pairs."""

from cbo_jax.dynamics.cbo import CBOConfig, CBOState, Dynamics, cbo
from cbo_jax.dynamics.family import (AdamCBOConfig, CBOMemoryConfig, CBSConfig, DriftConstrainedConfig,
                                     HypersurfaceConfig, MirrorCBOConfig, PolarCBOConfig, PSOConfig,
                                     RegCombinationConfig, adam_cbo, cbo_memory, cbs, drift_constrained_cbo,
                                     hypersurface_cbo, mirror_cbo, polar_cbo, pso, reg_combination_cbo)

__all__ = ["CBOConfig", "CBOState", "Dynamics", "cbo", "cbo_memory", "pso", "cbs", "polar_cbo", "adam_cbo",
           "mirror_cbo", "drift_constrained_cbo", "hypersurface_cbo", "reg_combination_cbo", "CBOMemoryConfig",
           "PSOConfig", "CBSConfig", "PolarCBOConfig", "AdamCBOConfig", "MirrorCBOConfig", "DriftConstrainedConfig",
           "HypersurfaceConfig", "RegCombinationConfig"]
