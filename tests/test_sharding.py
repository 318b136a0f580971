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


FEDERATED = ("fedcbo", "fedavg", "ifca", "local", "fedcbo_exchange")


@pytest.mark.parametrize("name", ["cbo_padded_x", "cbo_padded_consensus", "cbo_runs_x", "clustered_padded_x",
                                  "clustered_padded_consensus", "cb2o_padded_consensus", "exchange_random",
                                  "exchange_skewed", "agg_sharded_loss", "agg_sharded_m", "fed_fedcbo_P"]
                         + [f"fed_{a}_{what}" for a in FEDERATED for what in ("params", "acc", "metrics")])
def test_sharded_equals_unsharded(sharded_results, name):
    # Federated runs: N=13 agents padded to 16 on 8 devices (params, test accuracy,
    # every metric of every round) against the unsharded run with the same key.
    assert sharded_results[name] < 1e-4, sharded_results


@pytest.mark.parametrize("alg", FEDERATED)
def test_federated_padding_agents_never_count(sharded_results, alg):
    # Padding agents given data and garbage models change nothing: they are never
    # selected, downloaded, averaged or counted in a metric.
    assert sharded_results[f"fed_{alg}_poisoned"] < 1e-6, sharded_results
    assert sharded_results[f"fed_{alg}_shapes_ok"]  # the user sees exactly N agents
    assert sharded_results["fed_no_resize_refused"]


ATTACKED = ("fedcb2o", "dfedavgm")


@pytest.mark.parametrize("alg", ATTACKED)
def test_attack_runs_sharded_equal_unsharded(sharded_results, alg):
    # run_attack(..., mesh=): N=12 (8 benign, 4 attackers) padded to 16 on 8 devices,
    # 3 rounds (FedCB²O: mean loss in round 0, criterion G from T_G=1): the returned
    # models, every metric of every round (Fig. 5 statistics, train loss, attack
    # metrics) and FedCB²O's P equal the unsharded run's.
    r = sharded_results
    for what in ("params", "metrics", "asr"):
        assert r[f"att_{alg}_{what}"] < 1e-4, r
    assert r[f"att_{alg}_shapes_ok"]  # the user sees exactly N agents
    assert "agents" in r[f"att_{alg}_padded_spec"]  # the padded state was split over the devices
    if alg == "fedcb2o":
        assert r["att_fedcb2o_P"] < 1e-4 and r["att_fedcb2o_G_rounds"], r


@pytest.mark.parametrize("alg", ATTACKED)
def test_attack_padding_agents_never_count(sharded_results, alg):
    # Padding agents given data (full counts) and garbage models change nothing:
    # ProbSampling and the attackers never select them, no average weighs them.
    assert sharded_results[f"att_{alg}_poisoned"] < 1e-6, sharded_results


def test_federated_state_is_split_over_agents(sharded_results):
    for alg in ("fedcbo", "local", "fedcbo_exchange"):  # the padded state, before the padding is dropped
        assert "agents" in sharded_results[f"fed_{alg}_padded_spec"]
    assert sharded_results["fed_fedcbo_sr_checked"]


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


def test_padding_helpers():
    import jax
    import jax.numpy as jnp

    from cbo_jax.federated import padding

    tree = {"f": jnp.ones((3, 2)), "b": jnp.ones(3, bool), "i": jnp.arange(3)}
    big = padding.resize_rows(tree, 5, fill=7.0)
    assert big["f"].shape == (5, 2) and float(big["f"][4, 0]) == 7.0
    assert not bool(big["b"][3]) and int(big["i"][4]) == 0
    back = padding.resize_rows(big, 3)
    assert all(np.array_equal(back[k], tree[k]) for k in tree)
    key = jax.random.key(0)
    keys = padding.agent_keys(key, 3, 5)
    assert keys.shape == (5,)
    assert np.array_equal(jax.random.key_data(keys[:3]), jax.random.key_data(jax.random.split(key, 3)))
    idx = np.asarray(padding.padding_downloads(13, 16, 4))
    assert idx.shape == (3, 4) and idx.max() < 13 and all(len(set(r)) == 4 for r in idx)


@pytest.mark.parametrize("which", ["fedsgld"])  # "fedcbo_prob_sampling" passes too (+16 s CPU)
def test_padded_round_equals_unpadded(which):
    """On one device: rounds on data padded with poisoned padding agents (data and
    models) equal the unpadded rounds for the real agents. Covers what the 8-device
    subprocess does not run (FedSGLD)."""
    import jax
    import jax.numpy as jnp

    from cbo_jax import models
    from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
    from cbo_jax.federated.algorithms.base import AgentData
    from cbo_jax.federated.algorithms.fedsgld import FedSGLDConfig, SGLDConfig, fedsgld
    from cbo_jax.federated.local import LocalSGDConfig
    from cbo_jax.federated.padding import pad_agent_data

    n, size = 5, 8
    rng = np.random.default_rng(1)
    data = AgentData(jnp.asarray(rng.normal(size=(n, 10, 2)), jnp.float32), jnp.asarray(rng.integers(0, 2, (n, 10))),
                     jnp.asarray(rng.integers(4, 11, n), jnp.int32))
    model = models.logistic_regression(2, 2, zero_init=False)
    if which == "fedsgld":
        alg = fedsgld(model, FedSGLDConfig(oracle=SGLDConfig(steps=4, burn_in=2, sampling_rate=0.5)), n)
    else:
        alg = fedcbo(model, FedCBOConfig(M=2, selection="prob_sampling", participation=0.6, noise="anisotropic",
                                         sigma1=0.1, local=LocalSGDConfig(epochs=1, batch_size=4)), n)
    padded = pad_agent_data(data, size)
    padded = padded._replace(x=padded.x.at[n:].set(5.0), y=padded.y.at[n:].set(1), counts=padded.counts.at[n:].set(10))

    @jax.jit
    def pad_and_poison(state):
        state = alg.resize(state, size)
        poison = lambda t: jax.tree_util.tree_map(lambda a: a.at[n:].set(3.0), t)  # noqa: E731
        if which == "fedsgld":
            return state._replace(x=poison(state.x), lam=poison(state.lam))
        return state._replace(params=poison(state.params))

    state = jax.jit(alg.init)(jax.random.key(2))
    state_p = pad_and_poison(state)
    step = jax.jit(alg.round)
    for _ in range(2):
        state, info = step(state, data)
        state_p, info_p = step(state_p, padded)
        assert info_p.active.shape == (size,) and not np.any(np.asarray(info_p.active[n:]))
        if info.idx.shape[1]:
            assert np.array_equal(info.idx, info_p.idx[:n]) and int(np.max(info_p.idx)) < n
        np.testing.assert_allclose(info.train_loss, info_p.train_loss[:n], rtol=1e-5, atol=1e-6)
    got = jax.jit(alg.resize, static_argnums=1)(state_p, n)
    for u, v in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(got)):
        if not jax.dtypes.issubdtype(u.dtype, jax.dtypes.prng_key):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)
