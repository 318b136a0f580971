"""Run by tests/dynamics/test_family.py (slow) in a subprocess with 8 simulated CPU devices.

Every CBX-family dynamic, N = 44 particles padded to 48 over 8 devices, per-particle
noise: the sharded run equals the single-device run. Prints one JSON line of max abs
differences (and the sharding of the result).
"""

import json
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax import objectives, sharding  # noqa: E402

assert jax.device_count() == 8, jax.devices()
mesh = sharding.agent_mesh()
rng = np.random.default_rng(0)
x0 = rng.uniform(-2, 2, (44, 3)).astype(np.float32)
sphere_x0 = x0 / np.linalg.norm(x0, axis=1, keepdims=True)
f = objectives.Quadratic(shift=0.5)
common = dict(rng="per-particle", alpha=20.0, sigma1=0.5)
cases = {
    "cbo_memory": (cj.cbo_memory(f, **common), x0),
    "pso": (cj.pso(f, **common), x0),
    "cbs": (cj.cbs(f, rng="per-particle", alpha=1.0, mode="sampling"), x0),
    "polar_cbo": (cj.polar_cbo(f, kappa=1.0, chunk=16, **common), x0),
    "adam_cbo": (cj.adam_cbo(f, lambda1=0.05, **common), x0),
    "mirror_cbo": (cj.mirror_cbo(f, mirror_map={"name": "ProjectionBall", "radius": 1.5}, **common), x0),
    "drift_constrained_cbo": (cj.drift_constrained_cbo(f, constraints=cj.constraints.sphere(1.0), **common), x0),
    "hypersurface_cbo": (cj.hypersurface_cbo(f, noise="isotropic", **common), sphere_x0),
    "reg_combination_cbo": (cj.reg_combination_cbo(f, constraints=cj.constraints.sphere(1.0), eps=0.1, **common), x0),
}
out = {"devices": jax.device_count()}
for name, (dyn, x) in cases.items():
    a = cj.simulate(dyn, x, jax.random.key(1), 60)
    b = cj.simulate(dyn, x, jax.random.key(1), 60, mesh=mesh)
    out[name] = float(np.max(np.abs(np.asarray(a.state.x, np.float64) - np.asarray(b.state.x[:44], np.float64))))
    out[name + "_best"] = abs(float(a.state.best_energy) - float(b.state.best_energy))
    out[name + "_spec"] = str(b.state.x.sharding.spec)
print(json.dumps(out))
