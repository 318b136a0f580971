"""Two CPU processes on loopback (jax.distributed + Gloo) give the single-process result."""

import json
import os
import socket
import subprocess
import sys

import pytest

ARGS = ["optimize", "--objective", "sphere", "--dim", "4", "--particles", "30", "--runs", "2", "--steps", "60",
        "--sigma1", "0.5", "--alpha", "30", "--alpha-schedule", "constant", "--seed", "3", "--no-progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(extra, env_extra=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "cbo_jax.cli", *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # the default run's time budget; CI runs it in the slow step
def test_two_processes_equal_one(tmp_path):
    port = _free_port()
    procs = [_cli(["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i), *ARGS,
                   "--shard"]) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    multi = json.loads(outs[0][0].strip().splitlines()[-1])
    assert "{" not in outs[1][0]  # only process 0 reports (Gloo prints a connection line)
    single_p = _cli(ARGS)
    out, err = single_p.communicate(timeout=300)
    assert single_p.returncode == 0, err[-3000:]
    single = json.loads(out.strip().splitlines()[-1])
    for k in ("best_energy", "consensus_distance_inf_median", "best_distance_inf_median"):
        assert multi[k] == pytest.approx(single[k], rel=1e-4, abs=1e-6), (k, multi[k], single[k])


def test_bad_distributed_options(capsys):
    from cbo_jax.cli import main

    assert main(["--num-processes", "2", "optimize", "--steps", "1", "--no-progress"]) == 2
    assert "--coordinator" in capsys.readouterr().err


def test_a_missing_peer_times_out_with_a_message_naming_the_coordinator():
    port = _free_port()
    proc = _cli(["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0",
                 "--startup-timeout", "3", *ARGS])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in err and "within 3 s" in err and "waiting up to 3 s" in err


def test_environment_variables_are_checked(capsys, monkeypatch):
    from cbo_jax.cli import main

    monkeypatch.setenv("CBO_JAX_COORDINATOR", "127.0.0.1:1")
    monkeypatch.setenv("CBO_JAX_NUM_PROCESSES", "two")
    assert main(["optimize", "--steps", "1", "--no-progress"]) == 2
    assert "CBO_JAX_NUM_PROCESSES must be an integer, got 'two'" in capsys.readouterr().err


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_exchange_capacity_must_be_a_positive_integer(capacity):
    """``exchange_downloads(mesh, capacity=0)`` silently used the default capacity (``0 or
    default``), a negative one failed inside the traced round, and ``fetch_rows`` divided by a
    capacity of 0 in XLA. Both now refuse a capacity that is not an integer >= 1."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from cbo_jax.federated.exchange import exchange_downloads, fetch_rows

    mesh = Mesh(np.array(jax.devices()[:1]), ("agents",))
    with pytest.raises(ValueError, match="capacity"):
        exchange_downloads(mesh, capacity=capacity)
    with pytest.raises(ValueError, match="capacity"):
        fetch_rows(jnp.zeros((2, 3)), jnp.zeros((2,), jnp.int32), axis_name="agents", num_devices=1, capacity=capacity)


@pytest.mark.parametrize("address, num_processes, process_id", [
    ("127.0.0.1:abc", 1, 0), ("127.0.0.1:", 1, 0), (":1234", 1, 0), ("127.0.0.1:70000", 1, 0),
    ("127.0.0.1:1234", 2.0, 0), ("127.0.0.1:1234", 2, True)])
def test_distributed_initialize_refuses_a_malformed_address_or_count(address, num_processes, process_id):
    """A port that is not a number failed in gRPC ("Failed to start RPC server"), a missing
    host waited out the whole start-up timeout for a coordinator that could not exist, and
    2.0 processes reached JAX's runtime. All are refused before JAX is touched."""
    from cbo_jax import distributed

    with pytest.raises(ValueError, match="HOST:PORT|num_processes"):
        distributed.initialize(address, num_processes, process_id, timeout=1)
