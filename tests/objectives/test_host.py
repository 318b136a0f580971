"""Objectives computed on the host by NumPy functions (cbo_jax.objectives.from_numpy, issue 60)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj



@pytest.fixture
def x64():
    """float64 for the whole process (XLA calls a host objective on a thread of its own, which the
    thread-local ``jax.enable_x64`` context does not reach), restored afterwards."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def np_rastrigin(x):
    """CBXpy's Rastrigin in NumPy, (n, d) -> (n,)."""
    return 10 * x.shape[1] + np.sum(x**2 - 10 * np.cos(2 * np.pi * x), axis=1)


def _x0(n=200, d=10, seed=0):
    return np.random.default_rng(seed).uniform(-3, 3, (n, d))


def test_a_numpy_objective_runs_the_computation_of_the_jax_one(x64):
    """float64, CBO on Rastrigin d = 10, N = 200, 100 steps: the same trajectory up to rounding
    (NumPy's cos against the JAX one), one host call per step plus the initial evaluation."""
    host = cj.objectives.from_numpy(np_rastrigin)
    ref = cj.simulate(cj.cbo(cj.objectives.Rastrigin(), dtype="float64"), _x0(), 1, 100)
    res = cj.simulate(cj.cbo(host, dtype="float64"), _x0(), 1, 100)
    assert np.max(np.abs(np.asarray(res.state.x) - np.asarray(ref.state.x))) <= 1e-10
    assert abs(float(res.state.best_energy) - float(ref.state.best_energy)) <= 1e-10
    assert host.calls == 101 and host.evaluations == 101 * 200
    one = cj.objectives.from_numpy(lambda p: float(np_rastrigin(p[None])[0]), vectorized=False, name="one")
    per = cj.simulate(cj.cbo(one, dtype="float64"), _x0(30, 3), 2, 5)
    vec = cj.simulate(cj.cbo(cj.objectives.from_numpy(np_rastrigin), dtype="float64"), _x0(30, 3), 2, 5)
    np.testing.assert_array_equal(np.asarray(per.state.x), np.asarray(vec.state.x))
    assert one.calls == 6 and one.evaluations == 6 * 30


def test_runs_and_sweeps_are_one_host_call_per_step():
    host = cj.objectives.from_numpy(np_rastrigin)
    x0 = np.stack([_x0(20, 2, s) for s in range(3)]).astype(np.float32)
    res = cj.simulate(cj.cbo(host), x0, 0, 4, num_runs=3)
    assert res.state.x.shape == (3, 20, 2) and res.state.x.dtype == jnp.float32
    assert host.calls == 5 and host.evaluations == 5 * 3 * 20
    host.reset()
    dyn = cj.cbo(host)
    res = cj.simulate(dyn, _x0(20, 2).astype(np.float32), 0, 4, params=cj.params.grid(dyn, sigma1=[0.5, 1.0]))
    assert res.state.x.shape == (2, 20, 2) and host.calls == 5


@pytest.mark.parametrize("make", [cj.pso, cj.cbo_memory, cj.polar_cbo, cj.adam_cbo, cj.cbs])
def test_other_dynamics_take_a_host_objective(make, x64):
    f = cj.objectives.Rastrigin()
    host = cj.objectives.from_numpy(np_rastrigin)
    ref = cj.simulate(make(f, dtype="float64"), _x0(24, 2), 3, 5)
    res = cj.simulate(make(host, dtype="float64"), _x0(24, 2), 3, 5)
    np.testing.assert_allclose(np.asarray(res.state.x), np.asarray(ref.state.x), atol=1e-9)


def test_nan_energies_behave_as_a_jax_objectives(x64):
    """Particles with NaN energies get no consensus weight, with either kind of objective."""
    def np_f(x):
        e = np_rastrigin(x)
        return np.where(x[:, 0] > 1.5, np.nan, e)

    def jax_f(x):
        e = cj.objectives.Rastrigin()(x)
        return jnp.where(x[:, 0] > 1.5, jnp.nan, e)

    x0 = _x0(40, 2)
    x0[0, 0] = 0.0  # at least one particle with a finite energy
    ref = cj.simulate(cj.cbo(jax_f, dtype="float64"), x0, 4, 10)
    res = cj.simulate(cj.cbo(cj.objectives.from_numpy(np_f), dtype="float64"), x0, 4, 10)
    np.testing.assert_allclose(np.asarray(res.state.x), np.asarray(ref.state.x), atol=1e-9)
    assert np.isfinite(float(res.state.best_energy))


def test_an_exception_in_the_function_reaches_the_caller_as_itself():
    calls = []

    def flaky(x):
        calls.append(1)
        if len(calls) == 4:
            raise FloatingPointError("the simulator diverged")
        return np_rastrigin(x)

    host = cj.objectives.from_numpy(flaky)
    with pytest.raises(FloatingPointError, match="the simulator diverged") as info:
        cj.simulate(cj.cbo(host), _x0(10, 2).astype(np.float32), 0, 20)
    assert any("call 4" in note and "'flaky'" in note and "step 3" in note for note in info.value.__notes__)
    # the same through minimize, and for a wrong output shape (a ValueError of its own)
    with pytest.raises(ValueError, match=r"returned shape \(\) for 10 particles.*vectorized=False"):
        cj.minimize(cj.objectives.from_numpy(lambda x: 1.0), _x0(10, 2).astype(np.float32), num_steps=3)
    with pytest.raises(ValueError, match=r"returned shape \(2,\) for one particle"):
        cj.minimize(cj.objectives.from_numpy(lambda p: p, vectorized=False), _x0(10, 2).astype(np.float32),
                    num_steps=3)
    # a later run with a good objective is not haunted by the earlier error
    assert cj.simulate(cj.cbo(cj.objectives.from_numpy(np_rastrigin)), _x0(10, 2).astype(np.float32), 0, 3).steps == 3


def test_an_objective_that_is_not_jax_says_how_to_wrap_it():
    with pytest.raises(ValueError, match=r"from_numpy\(f\)"):
        cj.minimize(np_rastrigin, dim=3, num_steps=5)
    with pytest.raises(ValueError, match="host objective.*no derivative"):
        cj.simulate(cj.cbo(cj.objectives.from_numpy(np_rastrigin), lambda2=0.1, sigma2=0.1),
                    _x0(10, 2).astype(np.float32), 0, 3)
    with pytest.raises(TypeError, match="function of a NumPy array"):
        cj.objectives.from_numpy(3.0)
    with pytest.raises(ValueError, match="float dtype"):
        cj.objectives.from_numpy(np_rastrigin, dtype=np.int32)


def test_a_large_population_is_one_host_call_per_step():
    """Above 2**17 particles a step runs in blocks (auto_block_rows), but not with a host objective."""
    host = cj.objectives.from_numpy(lambda x: np.sum(x**2, axis=1))
    n = 2**17 + 5
    res = cj.simulate(cj.cbo(host), np.random.default_rng(0).uniform(-1, 1, (n, 1)).astype(np.float32), 0, 2)
    assert host.calls == 3 and host.evaluations == 3 * n and res.steps == 2
    assert repr(host).startswith("HostObjective(<lambda>")


def test_workers_split_a_step_and_count_the_evaluations(capsys):
    """workers=3: a step's particles in three chunks at once (threads; processes spawned, with a
    picklable function), the same energies and trajectory, and a bar that counts evaluations."""
    import functools
    import threading
    import time

    seen = set()

    def slow(x):
        seen.add(threading.get_ident())
        time.sleep(0.05)  # busy while the next chunk is submitted: a pool reuses an idle thread, and a
        return np_rastrigin(x)  # chunk finished before the next submit left one thread (a loaded CI host)

    x0 = _x0(30, 3).astype(np.float32)
    ref = cj.simulate(cj.cbo(cj.objectives.from_numpy(np_rastrigin)), x0, 0, 5)
    pooled = cj.objectives.from_numpy(slow, workers=3, progress=True)
    res = cj.simulate(cj.cbo(pooled), x0, 0, 5)
    np.testing.assert_array_equal(np.asarray(res.state.x), np.asarray(ref.state.x))
    assert pooled.calls == 6 and pooled.evaluations == 180 and len(seen) >= 2
    pooled.close()
    assert "180eval" in capsys.readouterr().err.replace(" ", "")
    procs = cj.objectives.from_numpy(functools.partial(np.sum, axis=1), workers=2, pool="process")
    got = cj.simulate(cj.cbo(procs), x0, 0, 3)
    want = cj.simulate(cj.cbo(lambda x: jnp.sum(x, axis=1)), x0, 0, 3)
    np.testing.assert_allclose(np.asarray(got.state.x), np.asarray(want.state.x), rtol=1e-6, atol=1e-6)
    procs.close()
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        cj.objectives.from_numpy(np_rastrigin, workers=0)
    with pytest.raises(ValueError, match="pool must be"):
        cj.objectives.from_numpy(np_rastrigin, workers=2, pool="gpu")


def test_a_sharded_run_takes_a_host_objective():
    """mesh= over 4 simulated CPU devices (a subprocess): the host objective's run equals the JAX
    objective's, padding rows included (N = 30 on 4 devices)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, cbo_jax as cj
        from cbo_jax.sharding import agent_mesh
        def ras(x):
            return 10 * x.shape[1] + np.sum(x**2 - 10 * np.cos(2 * np.pi * x), axis=1)
        h = cj.objectives.from_numpy(ras)
        x0 = np.random.default_rng(0).uniform(-3, 3, (30, 3)).astype(np.float32)
        a = cj.simulate(cj.cbo(h), x0, 0, 10, mesh=agent_mesh())
        b = cj.simulate(cj.cbo(cj.objectives.Rastrigin()), x0, 0, 10, mesh=agent_mesh())
        xa, xb = np.asarray(a.state.x), np.asarray(b.state.x)
        assert np.array_equal(np.isnan(xa), np.isnan(xb)) and h.calls == 11
        print("DIFF", float(np.nanmax(np.abs(xa - xb))))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split("DIFF")[1]) < 1e-5
