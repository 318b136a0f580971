"""cbo_jax: a JAX-vectorised simulator of consensus-based optimization.

Every agent (particle) is a row of one stacked pytree; every operation on agents is
one vectorised kernel; time is a ``lax.scan``.

>>> import jax, cbo_jax as cj
>>> cfg = cj.CBOConfig(lambda1=1.0, sigma1=1.0, dt=0.01, alpha=30.0)
>>> x0 = jax.random.uniform(jax.random.key(0), (200, 5), minval=-3, maxval=3)
>>> res = cj.minimize(cj.objectives.Rastrigin(), x0, jax.random.key(1), 500, cfg)
"""

from cbo_jax import (batching, consensus, constraints, meanfield, mirror_maps, objectives, params, plot, population,
                     resampling, schedules, sde, sharding)
from cbo_jax.consensus import consensus_point, consensus_weights, quantile_mask, subset_consensus
from cbo_jax.dynamics.cbo import CBOConfig, CBOState, Dynamics, cbo
from cbo_jax.dynamics.family import (adam_cbo, cbo_memory, cbs, drift_constrained_cbo, hypersurface_cbo, mirror_cbo,
                                     polar_cbo, pso, reg_combination_cbo)
from cbo_jax.dynamics.clustered import ClusteredConfig, ClusteredState, Malicious, Particles, cb2o, clustered, particles
from cbo_jax.asktell import AskTell, Optimizer, ask_tell
from cbo_jax.minimize import minimize
from cbo_jax.simulate import SimulationResult, simulate
from cbo_jax.runtime import checkpoint, writer  # cj.checkpoint, cj.writer: the modules of cbo_jax.runtime
from cbo_jax.runtime._moved import install as _install_moved
from cbo_jax.runtime.provenance import installed_version as _installed_version

_install_moved()  # cbo_jax.writer, cbo_jax.checkpoint, ...: the modules' old names, deprecated (runtime/_moved.py)

__version__: str = _installed_version()

__all__ = [
    "AskTell",
    "CBOConfig",
    "CBOState",
    "ClusteredConfig",
    "ClusteredState",
    "Dynamics",
    "Malicious",
    "Optimizer",
    "Particles",
    "SimulationResult",
    "adam_cbo",
    "ask_tell",
    "batching",
    "cb2o",
    "cbo",
    "cbo_memory",
    "cbs",
    "checkpoint",
    "clustered",
    "consensus",
    "consensus_point",
    "consensus_weights",
    "constraints",
    "drift_constrained_cbo",
    "hypersurface_cbo",
    "meanfield",
    "minimize",
    "mirror_cbo",
    "mirror_maps",
    "objectives",
    "params",
    "particles",
    "plot",
    "polar_cbo",
    "population",
    "pso",
    "quantile_mask",
    "reg_combination_cbo",
    "resampling",
    "schedules",
    "sde",
    "sharding",
    "writer",
    "simulate",
    "subset_consensus",
]
