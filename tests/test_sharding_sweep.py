"""A parameter sweep and random batches with the agent axis sharded over 4 simulated devices.

JAX fixes the device count at start-up, so the check runs in a subprocess (slow: a fresh
JAX process and its compilations).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    import cbo_jax as cj
    from cbo_jax import objectives, sharding
    out = {"devices": jax.device_count()}
    mesh = sharding.agent_mesh()
    x0 = np.random.default_rng(0).uniform(-2, 2, (2, 10, 3)).astype(np.float32)   # N=10: padded to 12
    dyn = cj.cbo(objectives.Rastrigin(), sigma1=1.0, alpha=10.0, rng="per-particle")
    grid = cj.params.grid(dyn, sigma1=[0.5, 1.0, 2.0], dt=[0.01, 0.02])
    a = cj.simulate(dyn, x0, 0, 20, num_runs=2, params=grid, mesh=mesh)
    b = cj.simulate(dyn, x0, 0, 20, num_runs=2, params=grid)
    out["sweep_shape"] = list(a.state.x.shape)
    out["sweep_spec"] = str(a.state.x.sharding.spec)
    out["sweep_diff"] = float(np.abs(np.asarray(a.state.x)[..., :10, :] - np.asarray(b.state.x)).max())
    rbm = cj.cbo(objectives.Rastrigin(), sigma1=1.0, alpha=10.0, rng="per-particle", batch_size=6)
    x12 = np.random.default_rng(1).uniform(-2, 2, (2, 12, 3)).astype(np.float32)
    c = cj.simulate(rbm, x12, 0, 20, num_runs=2, mesh=mesh)
    d = cj.simulate(rbm, x12, 0, 20, num_runs=2)
    out["batch_diff"] = float(np.abs(np.asarray(c.state.x) - np.asarray(d.state.x)).max())
    try:
        cj.simulate(rbm, x0, 0, 2, num_runs=2, mesh=mesh)
        out["batch_padding_refused"] = False
    except ValueError as err:
        out["batch_padding_refused"] = "random batches" in str(err)
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_sweep_and_batches_sharded_equal_unsharded():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=dict(os.environ, JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert out["sweep_shape"] == [3, 2, 2, 12, 3] and "agents" in out["sweep_spec"]
    assert out["sweep_diff"] < 1e-5, out
    assert out["batch_diff"] < 1e-5, out
    assert out["batch_padding_refused"], out
