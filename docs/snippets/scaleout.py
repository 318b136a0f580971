import os
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")   # 4 simulated CPU devices

import tempfile
import jax
import numpy as np
import cbo_jax as cj

dyn = cj.cbo(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=1.0, dt=0.01, alpha=100.0, rng="per-particle")
x0 = jax.random.uniform(jax.random.key(0), (1001, 10), minval=-3, maxval=3)     # N need not divide evenly

mesh = cj.sharding.agent_mesh()                       # one mesh axis "agents" over all devices
sharded = cj.simulate(dyn, x0, jax.random.key(1), 200, mesh=mesh)
single = cj.simulate(dyn, x0, jax.random.key(1), 200)
print(len(mesh.devices.ravel()), np.abs(np.asarray(sharded.state.consensus) - np.asarray(single.state.consensus)).max())

# Checkpoint after 100 steps, restore, continue: equals the uninterrupted run
first = cj.simulate(dyn, x0, jax.random.key(1), 100)
path = os.path.join(tempfile.mkdtemp(), "ckpt")
cj.checkpoint.save(path, first.state, step=100)
state, meta = cj.checkpoint.restore(path, like=first.state)
rest = cj.simulate(dyn, None, None, 100, initial_state=state)
print(meta["step"], np.array_equal(np.asarray(rest.state.x), np.asarray(single.state.x)))
