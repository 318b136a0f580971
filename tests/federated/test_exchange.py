"""FedCBO's row exchange (``cbo_jax.federated.exchange``) on 4 simulated CPU devices, in the
default selection: before, only the slow step's 8-device subprocess (tests/_sharded_runs.py)
ran ``fetch_rows`` across devices, so a broken owner, slot or round count went unseen by the
README's test command.

JAX fixes the device count at start-up: the runs happen in one subprocess started with
``--xla_force_host_platform_device_count=4``; it prints one JSON line of results.
"""

import json
import os
import subprocess
import sys

import pytest

from cbo_jax.federated.exchange import _largest_divisor_at_most, default_capacity

_SCRIPT = r"""
import json, os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
from functools import partial
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec
from cbo_jax.federated.exchange import exchange_downloads, fetch_rows

D = 4
mesh = Mesh(np.array(jax.devices()[:D]), ("agents",))
spec = PartitionSpec("agents")
rng = np.random.default_rng(0)
out = {"devices": jax.device_count()}
N = 12  # 3 agents per device
table = {"w": rng.normal(size=(N, 2, 3)).astype(np.float32), "id": np.arange(N, dtype=np.int32) * 10}
cases = {
    "spread": rng.integers(0, N, (N, 3)),
    "skewed": rng.integers(0, 3, (N, 5)),      # every request to device 0: several exchange rounds
    "last_device": rng.integers(9, N, (N, 2)),  # every request to the last device
    "own_rows": np.arange(N)[:, None].repeat(2, 1),
}
for capacity in (1, 2, 8):
    fetch = jax.jit(jax.shard_map(partial(fetch_rows, axis_name="agents", num_devices=D, capacity=capacity),
                                  mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False))
    for name, req in cases.items():
        got = fetch(table, jnp.asarray(req, jnp.int32))
        out[f"fetch_{name}_cap{capacity}"] = {
            "w": bool(np.array_equal(np.asarray(got["w"]), table["w"][req])),
            "id": np.asarray(got["id"]).tolist() == table["id"][req].tolist(),
        }

# The download map: fn sees the requested rows (non-finite rows zeroed, flagged False) and the
# agent's own per-agent data; chunk 2 of 3 local agents walks them one at a time.
params = rng.normal(size=(N, 3)).astype(np.float32)
params[5] = np.nan
idx = rng.integers(0, N, (N, 4))
idx[[0, 7], [0, 2]] = 5  # the non-finite row is downloaded, by agents on two devices
own = rng.normal(size=(N,)).astype(np.float32)

def fn(rows, finite, x):
    return jnp.sum(rows, axis=0) * x + jnp.sum(finite), rows[:, 0]

expect_rows = np.nan_to_num(params[idx], nan=0.0)
expect_finite = np.isfinite(params[idx]).all(-1)
expect = (expect_rows.sum(1) * own[:, None] + expect_finite.sum(1)[:, None], expect_rows[:, :, 0])
for chunk, capacity in ((2, None), (3, 1), (8, None)):
    got = jax.jit(lambda p, i, x: exchange_downloads(mesh, capacity)(fn, p, i, (x,), chunk))(params, idx, own)
    out[f"downloads_chunk{chunk}_cap{capacity}"] = [float(np.max(np.abs(np.asarray(g) - e))) for g, e in zip(got, expect)]
try:
    exchange_downloads(mesh)(fn, params[:10], idx[:10], (own[:10],), 2)
    out["uneven_refused"] = False
except ValueError as err:
    out["uneven_refused"] = "10 agents cannot be split evenly over 4 devices" in str(err)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exchanged():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fetch_rows_returns_exactly_the_requested_rows_for_any_capacity(exchanged):
    """``fetch_rows`` equals ``global[idx]`` leaf by leaf (a float and an integer leaf), for
    requests spread over the owners, all to the first or the last device (rounds beyond the
    first) and each agent's own row, with 1, 2 and 8 rows per buffer."""
    assert exchanged["devices"] == 4
    fetched = {k: v for k, v in exchanged.items() if k.startswith("fetch_")}
    assert len(fetched) == 12
    assert all(v == {"w": True, "id": True} for v in fetched.values()), fetched


def test_exchange_downloads_equal_the_local_gather(exchanged):
    """Through ``exchange_downloads`` the download function sees the requested rows with
    non-finite rows zeroed and flagged, and each agent's own data, chunk by chunk."""
    runs = {k: v for k, v in exchanged.items() if k.startswith("downloads_")}
    assert len(runs) == 3
    assert all(max(v) <= 1e-6 for v in runs.values()), runs  # float32 sums of 4 rows in another order
    assert exchanged["uneven_refused"] is True


def test_default_capacity_and_chunk_divisor():
    """Twice the even share of ``R`` requests over ``D`` devices, rounded up, between 1 and R;
    a chunk is the largest divisor of the local agent count not above the one asked for."""
    assert default_capacity(12, 4) == 6
    assert default_capacity(13, 4) == 7  # ceil(26 / 4)
    assert default_capacity(3, 8) == 1
    assert default_capacity(5, 1) == 5  # at most R
    assert default_capacity(10, 4, slack=1.0) == 3
    assert [_largest_divisor_at_most(12, k) for k in (1, 5, 6, 7, 12, 40)] == [1, 4, 6, 6, 12, 12]
    assert _largest_divisor_at_most(7, 3) == 1
