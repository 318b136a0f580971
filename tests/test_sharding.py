"""Agent axis sharded over 8 simulated CPU devices equals the single-device run.

JAX fixes the device count at start-up, so the runs happen in a subprocess started
with ``--xla_force_host_platform_device_count=8`` (tests/_sharded_runs.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import sharding

import _federated_variants as fv


@pytest.fixture(scope="module")
def sharded_results():  # several minutes on 2 cores: only the tests marked slow use it
    # XLA's backend optimisation on (off in the test run, tests/conftest.py): the runs are compared
    # with the pins bit for bit where they were recorded
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="0")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_sharded_runs.py"))], env=env,
                          capture_output=True, text=True, timeout=1200)  # 299 s measured on a loaded 2-core host
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_eight_devices(sharded_results):
    assert sharded_results["devices"] == 8
    assert sharded_results["cbo_sharded_spec"] == "PartitionSpec('agents', None)" or "agents" in sharded_results[
        "cbo_sharded_spec"]
    # a continued state with mesh= is placed over the devices (it was run on one device, mesh ignored)
    assert "agents" in sharded_results["cbo_resumed_sharded_spec"], sharded_results["cbo_resumed_sharded_spec"]
    assert sharded_results["cbo_resumed_sharded_x"] == 0.0
    # every pinned variant ran on the 8 devices, and each is compared below
    ran = {k[len("fed_"):-len("_vs_pinned_mesh8")] for k in sharded_results if k.endswith("_vs_pinned_mesh8")}
    assert ran == set(VARIANTS), ran ^ set(VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cbo_padded_x", "cbo_padded_consensus", "cbo_runs_x", "clustered_padded_x",
                                  "clustered_padded_consensus", "cb2o_padded_consensus", "agg_sharded_loss",
                                  "agg_sharded_m"])
def test_sharded_equals_unsharded(sharded_results, name):
    assert sharded_results[name] < 1e-4, sharded_results


VARIANTS = ("fedcbo_egreedy_iso", "fedcbo_uniform_aniso", "fedcbo_probsampling", "fedavg", "ifca", "local", "fedpd",
            "noisy_fedpd", "fedsgld", "fedsgld_cold", "fedcb2o_G", "fedcb2o_self", "fedcb2o_loss", "oracle_max",
            "oracle_min", "fedprox", "fedadam", "fedyogi", "ditto", "dfedavg_median", "dfedavg_trimmed_mean",
            "dfedavg_krum", "scaffold", "cfl")


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_federated_runs_sharded_equal_the_pinned_runs(sharded_results, name, optimized_xla):
    """Every algorithm, N = 13 (attacks: 12) padded to 16 on 8 devices, 3 rounds: the final
    state and every metric of every round equal the pinned runs (tests/pinned/federated.npz)
    on 8 devices bitwise, and the unsharded ones up to float rounding."""
    r = sharded_results
    assert r[f"fed_{name}_pinned_arrays"] > 0, r  # a run without a pin compares nothing
    assert r[f"fed_{name}_vs_pinned_mesh8"] <= fv.pinned_atol(fv.recorded_on(name)), r  # bitwise on the recording host
    assert r[f"fed_{name}_vs_single"] < 1e-5, r
    assert r[f"fed_{name}_missing"] == [], r


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedcbo_egreedy_iso", "fedcbo_probsampling", "fedavg", "ifca", "local", "fedsgld",
                                  "fedcb2o_G", "oracle_max", "fedprox", "ditto", "dfedavg_krum", "scaffold", "cfl"])
def test_padding_agents_never_count(sharded_results, name):
    # Padding agents given data (full counts) and garbage models change nothing: they are
    # never selected, downloaded, averaged or counted in a metric.
    assert sharded_results[f"fed_{name}_poisoned"] == 0.0, sharded_results
    assert sharded_results["fed_poisoned_padding_used"]


@pytest.mark.slow
def test_fedcbo_exchange_never_gathers_the_population(sharded_results):
    assert sharded_results["fed_exchange_vs_single"] < 1e-5
    assert sharded_results["exchange_random"] == 0.0 and sharded_results["exchange_skewed"] == 0.0
    assert sharded_results["agg_sharded_all_gathers"] == 0


@pytest.mark.slow
def test_padding_agents_stay_inert(sharded_results):
    assert sharded_results["cbo_padding_rows_nan"]
    assert sharded_results["cbo_padded_best"] < 1e-5  # a padding agent never became the best
    assert sharded_results["max_abs_refused"]


def test_pad_rows_and_sizes():
    mesh = sharding.agent_mesh()
    assert sharding.padded_size(5, mesh) % mesh.size == 0
    x = np.arange(6.0).reshape(3, 2)
    padded = sharding.pad_rows({"a": x, "i": np.arange(3)}, 5)
    assert padded["a"].shape == (5, 2) and np.all(np.isnan(padded["a"][3:])) and list(padded["i"][3:]) == [0, 0]
    with pytest.raises(ValueError):
        sharding.pad_rows(x, 2)


def test_padding_helpers():

    from cbo_jax.federated.local import agent_keys
    from cbo_jax.population import resize_rows

    tree = {"f": jnp.ones((3, 2)), "b": jnp.ones(3, bool), "i": jnp.arange(3)}
    big = resize_rows(tree, 5, fill=7.0)
    assert big["f"].shape == (5, 2) and float(big["f"][4, 0]) == 7.0
    assert not bool(big["b"][3]) and int(big["i"][4]) == 0
    back = resize_rows(big, 3)
    assert all(np.array_equal(back[k], tree[k]) for k in tree)
    key = jax.random.key(0)
    keys = agent_keys(key, 5)  # fold_in(key, j): agent j's key does not depend on how many follow
    assert np.array_equal(jax.random.key_data(keys[:3]), jax.random.key_data(agent_keys(key, 3)))


def test_a_padding_row_with_a_finite_energy_is_never_the_best_point():
    # A sharded run pads the agent axis with NaN rows. An objective that maps NaN to a number
    # (jnp.nansum here: the padding's energy is 0, below every real one) made a padding row the
    # run's best point and its least energy. The padded run, stepped as the mesh would step it,
    # must report the unpadded run's best point and min_energy.

    import cbo_jax as cj
    from cbo_jax.dynamics import core

    x = np.random.default_rng(0).uniform(-3, 3, (31, 3)).astype(np.float32)
    dyn = cj.cbo(lambda z: jnp.nansum((z - 1.0) ** 2, axis=-1), alpha=10.0, rng="per-particle")
    padded = sharding.pad_rows(x, 32)
    key = jax.random.key(0)
    run = jax.jit(lambda x0: jax.lax.fori_loop(0, 5, lambda i, s: dyn.step(s), dyn.init(x0, key)))
    one, two = run(x), run(padded)
    assert float(two.ctrl.agents) == 31 and np.isnan(np.asarray(two.x)[31]).all()
    assert float(two.best_energy) > 0.0  # the padding's energy is 0
    np.testing.assert_allclose(float(two.best_energy), float(one.best_energy), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(two.best_x), np.asarray(one.best_x), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(core.record(two)["min_energy"]), np.asarray(core.record(one)["min_energy"]),
                               rtol=1e-5)
    init_only = dyn.init(padded, key)
    assert float(init_only.best_energy) > 0.0 and np.isfinite(np.asarray(init_only.best_x)).all()


def test_pad_rows_makes_bfloat16_padding_agents_inactive():
    """NumPy does not count bfloat16 as floating, so its padding rows were 0, not NaN: on a
    mesh the padding agents of a bfloat16 population were real agents at the origin (the
    consensus of a run on 8 devices went to 0 where the unsharded run's was about 2)."""
    out = sharding.pad_rows({"x": np.ones((5, 2), jnp.bfloat16), "f16": np.ones((5,), np.float16)}, 8)
    assert out["x"].dtype == jnp.bfloat16
    assert np.all(np.isnan(np.asarray(out["x"][5:], np.float32)))
    assert np.all(np.isnan(out["f16"][5:]))
    ints = sharding.pad_rows(np.ones((5,), np.int32), 8)
    np.testing.assert_array_equal(ints[5:], 0)  # integer leaves keep their 0 padding


def test_prepare_population_refuses_a_population_without_an_agent_axis():
    """A 0-d population failed with "IndexError: tuple index out of range"; leaves with
    different agent counts were padded one by one, out of step with each other."""
    mesh = sharding.agent_mesh(jax.devices()[:1])
    with pytest.raises(ValueError, match="agent axis 0"):
        sharding.prepare_population(np.float32(1.0), mesh)
    with pytest.raises(ValueError, match="agent axis 0"):
        sharding.prepare_population({}, mesh)
    with pytest.raises(ValueError, match="same number of agents"):
        sharding.prepare_population({"a": np.ones((5, 2), np.float32), "b": np.ones(6, np.float32)}, mesh)
