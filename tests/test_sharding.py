"""Agent axis sharded over 8 simulated CPU devices equals the single-device run.

JAX fixes the device count at start-up, so the runs happen in a subprocess started
with ``--xla_force_host_platform_device_count=8`` (tests/_sharded_runs.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cbo_jax import sharding


@pytest.fixture(scope="module")
def sharded_results():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_sharded_runs.py"))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eight_devices(sharded_results):
    assert sharded_results["devices"] == 8
    assert sharded_results["cbo_sharded_spec"] == "PartitionSpec('agents', None)" or "agents" in sharded_results[
        "cbo_sharded_spec"]


@pytest.mark.parametrize("name", ["cbo_padded_x", "cbo_padded_consensus", "cbo_runs_x", "clustered_padded_x",
                                  "clustered_padded_consensus", "cb2o_padded_consensus", "fed_fedcbo_params",
                                  "fed_fedavg_params", "fed_ifca_params", "fed_local_params", "fed_fedcbo_acc",
                                  "fed_fedavg_acc", "fed_ifca_acc", "fed_local_acc", "exchange_random",
                                  "exchange_skewed", "agg_sharded_loss", "agg_sharded_m", "fed_fedcbo_exchange_params",
                                  "fed_fedcbo_exchange_acc"])
def test_sharded_equals_unsharded(sharded_results, name):
    assert sharded_results[name] < 1e-4, sharded_results


def test_federated_state_is_split_over_agents(sharded_results):
    assert "agents" in sharded_results["fed_fedcbo_sharded"]


def test_fedcbo_exchange_never_gathers_the_population(sharded_results):
    assert sharded_results["exchange_random"] == 0.0 and sharded_results["exchange_skewed"] == 0.0
    assert sharded_results["agg_sharded_all_gathers"] == 0


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
