"""Run by tests/test_sharding.py in a subprocess with 8 simulated CPU devices.

Prints one JSON line with the max abs differences between sharded and unsharded runs.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax import objectives, sharding  # noqa: E402
from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, clustered, particles  # noqa: E402

assert jax.device_count() == 8, jax.devices()
mesh = sharding.agent_mesh()
out = {"devices": jax.device_count()}
rng = np.random.default_rng(0)


def diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# CBO, N=44 (padded to 48), per-particle noise: equal to the unsharded run. (Exactly equal
# for the first steps; then the all-reduce's summation order differs in the last bit,
# which a chaotic run, e.g. Rastrigin with gradient drift and α -> 1e5, amplifies: the
# comparison uses a smooth objective.)
cfg = cj.CBOConfig(lambda1=1.0, sigma1=0.5, dt=0.01, alpha=30.0, rng="per-particle", lambda2=0.1, sigma2=0.05)
dyn = cj.cbo(objectives.Quadratic(shift=0.5), cfg)
x0 = rng.uniform(-3, 3, (44, 5)).astype(np.float32)
a = cj.simulate(dyn, x0, jax.random.key(1), 200)
b = cj.simulate(dyn, x0, jax.random.key(1), 200, mesh=mesh)
out["cbo_padded_x"] = diff(a.state.x, b.state.x[:44])
out["cbo_padded_consensus"] = diff(a.state.consensus, b.state.consensus)
out["cbo_padded_best"] = diff(a.state.best_energy, b.state.best_energy)
out["cbo_padding_rows_nan"] = bool(np.all(np.isnan(np.asarray(b.state.x[44:]))))
out["cbo_sharded_spec"] = str(b.state.x.sharding.spec)

# CBO, N=48 divisible, default fast RNG, 3 vmapped runs: equal too.
dyn_fast = cj.cbo(objectives.Sphere(), cj.CBOConfig(sigma1=1.0, alpha=50.0))
x0 = rng.uniform(-3, 3, (3, 48, 4)).astype(np.float32)
a = cj.simulate(dyn_fast, x0, jax.random.key(2), 100, num_runs=3)
b = cj.simulate(dyn_fast, x0, jax.random.key(2), 100, num_runs=3, mesh=mesh)
out["cbo_runs_x"] = diff(a.state.x, b.state.x)

# Clustered system with attackers, N=61 (padded to 64), per-particle noise.
centers = rng.uniform(-2, 2, (3, 4))
attack = Malicious(drift=lambda t, x: -(x - 1.0), diffusion=lambda t, x: jnp.full(x.shape[0], 0.1, x.dtype))
cdyn = clustered([objectives.Quadratic(shift=c) for c in centers],
                 ClusteredConfig(lambda1=1.0, sigma1=0.5, lambda2=0.3, sigma2=0.1, alpha=20.0, rng="per-particle"),
                 malicious=attack)
p = particles(rng.uniform(-3, 3, (61, 4)).astype(np.float32), rng.integers(0, 3, 61), rng.random(61) < 0.2)
a = cj.simulate(cdyn, p, jax.random.key(3), 150)
b = cj.simulate(cdyn, p, jax.random.key(3), 150, mesh=mesh)
out["clustered_padded_x"] = diff(a.state.x, b.state.x[:61])
out["clustered_padded_consensus"] = diff(a.state.consensus, b.state.consensus)

# CB²O (quantile mask) with padding: NaN agents are outside Q_β and never weighted.
cb = cj.cb2o(lambda x: jnp.sum(x**2, -1), lambda x: jnp.sum((x - 0.5) ** 2, -1),
             ClusteredConfig(sigma1=0.4, alpha=30.0, beta=0.5, rng="per-particle"))
p = particles(rng.uniform(-2, 2, (30, 3)).astype(np.float32))
a = cj.simulate(cb, p, jax.random.key(4), 100)
b = cj.simulate(cb, p, jax.random.key(4), 100, mesh=mesh)
out["cb2o_padded_consensus"] = diff(a.state.consensus, b.state.consensus)

# max_abs with padding is refused.
try:
    cj.simulate(cj.cbo(objectives.Sphere(), cj.CBOConfig(max_abs=1e8)), x0[0, :44], jax.random.key(0), 5, mesh=mesh)
    out["max_abs_refused"] = False
except ValueError as err:
    out["max_abs_refused"] = "max_abs" in str(err)

# Federated algorithms with N=13 agents: padded to 16 with inactive agents, every
# leading-axis array split over the 8 devices. Equal to the unsharded run: parameters,
# test accuracy and every metric (SR, train loss, participants, ...).
from cbo_jax import models  # noqa: E402
from cbo_jax.federated import run as fed_run  # noqa: E402
from cbo_jax.federated.algorithms import (FedAvgConfig, FedCBOConfig, IFCAConfig, LocalConfig, fedavg,  # noqa: E402
                                          fedcbo, ifca, local_only)
from cbo_jax.federated.data import FederatedData  # noqa: E402
from cbo_jax.federated.local import LocalSGDConfig  # noqa: E402
from cbo_jax.federated.run import run_federated  # noqa: E402

NF = 13
x = rng.normal(size=(NF, 20, 2, 1)).astype(np.float32)
cl = (np.arange(NF) >= 7).astype(np.int32)
y = (x[:, :, 0, 0] > 0).astype(np.int32)
y[cl == 1] = 1 - y[cl == 1]
tx = rng.normal(size=(2, 50, 2, 1)).astype(np.float32)
ty = np.stack([(tx[0, :, 0, 0] > 0), (tx[1, :, 0, 0] <= 0)]).astype(np.int32)
data = FederatedData(x, y, np.full(NF, 20, np.int32), cl, tx, ty)
model = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2, 1))
loc = LocalSGDConfig(epochs=1, batch_size=8)
fcfg_run = FedCBOConfig(M=3, local=loc, noise="isotropic", sigma1=0.01, participation=0.8)
algs = {"fedcbo": fedcbo(model, fcfg_run, NF), "fedavg": fedavg(model, FedAvgConfig(local=loc, participation=0.6), NF),
        "ifca": ifca(model, IFCAConfig(k=2, local=loc), NF),
        "local": local_only(model, LocalConfig(local=loc, participation=0.5), NF),
        "fedcbo_exchange": fedcbo(model, fcfg_run, NF, mesh=mesh)}


def history_diff(ha, hb):
    def nums(h):
        return np.concatenate([np.ravel(np.asarray(v, np.float64)) for r in h for k, v in sorted(r.items())
                               if k not in ("elapsed_s", "server_model_per_cluster")])

    return diff(nums(ha), nums(hb))


def poisoned(alg, seen):
    """The same algorithm whose padding agents start from garbage models (poisoned
    data comes from the patched pad_agent_data below); records the sharding of the
    padded state when run_federated cuts the padding off."""

    def resize(state, size):
        if size < jax.tree_util.tree_leaves(state.params)[0].shape[0]:
            seen.append(str(jax.tree_util.tree_leaves(state.params)[0].sharding.spec))
        state = alg.resize(state, size)
        if size > NF and hasattr(state, "opt_state"):
            state = state._replace(params=jax.tree_util.tree_map(lambda a: a.at[NF:].set(3.0), state.params))
        return state

    return alg._replace(resize=resize)


clean_pad = fed_run.pad_agent_data


def poisoned_pad(agent_data, size):  # padding agents with data: they still must not count
    d = clean_pad(agent_data, size)
    return d._replace(x=d.x.at[NF:].set(5.0 + jnp.asarray(rng.normal(size=d.x[NF:].shape), d.x.dtype)),
                      y=d.y.at[NF:].set(1), counts=d.counts.at[NF:].set(20))


runs = {}
for name, alg in algs.items():
    a = runs["fedcbo"][0] if name == "fedcbo_exchange" else run_federated(alg, model, data, 3, jax.random.key(5),
                                                                           progress=False)
    b = run_federated(alg, model, data, 3, jax.random.key(5), progress=False, mesh=mesh)
    seen = []
    fed_run.pad_agent_data = poisoned_pad
    try:
        c = run_federated(poisoned(alg, seen), model, data, 3, jax.random.key(5), progress=False, mesh=mesh)
    finally:
        fed_run.pad_agent_data = clean_pad
    runs[name] = (a, b, c)
    leaves_a = jax.tree_util.tree_leaves(a.state.params)
    out[f"fed_{name}_params"] = max(diff(u, v) for u, v in zip(leaves_a, jax.tree_util.tree_leaves(b.state.params)))
    out[f"fed_{name}_acc"] = abs(a.summary["final_test_acc"] - b.summary["final_test_acc"])
    out[f"fed_{name}_metrics"] = history_diff(a.history, b.history)
    out[f"fed_{name}_poisoned"] = max(max(diff(u, v) for u, v in zip(jax.tree_util.tree_leaves(b.state.params),
                                                                     jax.tree_util.tree_leaves(c.state.params))),
                                      history_diff(b.history, c.history))
    out[f"fed_{name}_shapes_ok"] = all(
        u.shape == v.shape for u, v in zip(jax.tree_util.tree_leaves(a.state), jax.tree_util.tree_leaves(b.state)))
    if seen:
        out[f"fed_{name}_padded_spec"] = seen[0]
out["fed_fedcbo_P"] = diff(np.nan_to_num(runs["fedcbo"][0].state.P, neginf=-9), np.nan_to_num(runs["fedcbo"][1].state.P,
                                                                                              neginf=-9))
try:  # an algorithm that cannot pad is refused before anything runs
    run_federated(algs["local"]._replace(resize=None), model, data, 1, jax.random.key(5), progress=False, mesh=mesh)
    out["fed_no_resize_refused"] = False
except ValueError as err:
    out["fed_no_resize_refused"] = "multiple" in str(err)
out["fed_fedcbo_sr_checked"] = "sr" in runs["fedcbo"][1].history[-1] and "sr" in runs["fedcbo_exchange"][1].history[-1]

# FedCB²O (criterion G after T_G = 1, so 3 rounds cover both energies) and DFedAvgM
# (Oracle Max) through run_attack: N = 12 (8 benign, 4 attackers) padded to 16, the
# padding after the attackers. Equal to the unsharded run: parameters, P, every metric.
from cbo_jax.federated import attack_run, attacks  # noqa: E402
from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm  # noqa: E402
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o  # noqa: E402
from cbo_jax.federated.mnist import MNIST  # noqa: E402

tiny = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))
images = MNIST(rng.integers(0, 256, (200, 2, 2)).astype(np.uint8), rng.integers(0, 4, 200).astype(np.int32),
               rng.integers(0, 256, (40, 2, 2)).astype(np.uint8), rng.integers(0, 4, 40).astype(np.int32), "fake")
ads = attacks.label_flip_rotated(images, attacks.LabelFlipConfig(
    source=2, target=1, num_classes=4, benign_per_cluster=4, malicious_per_cluster=2, benign_samples=10, val_samples=5,
    malicious_samples=12), seed=3)
NA = ads.num_agents
aloc = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.9)
attack_algs = {"fedcb2o": (fedcb2o(tiny, FedCB2OConfig(M=5, T_G=1, local=aloc), ads.cluster, ads.malicious),
                           ads.attack_data()),
               "dfedavgm": (dfedavgm(tiny, DFedAvgMConfig(M=3, local=aloc), ads.cluster, name="oracle-max"),
                            ads.oracle_groups(with_attackers=True))}


def flat(v):  # every number of a metrics row (dicts and lists nested)
    if isinstance(v, dict):
        return [x for k in sorted(v) for x in flat(v[k])]
    if isinstance(v, (list, tuple)):
        return [x for e in v for x in flat(e)]
    return [float(v)]


def attack_history_diff(ha, hb):
    a = np.asarray(flat([{k: v for k, v in r.items() if k != "elapsed_s"} for r in ha]), np.float64)
    b = np.asarray(flat([{k: v for k, v in r.items() if k != "elapsed_s"} for r in hb]), np.float64)
    return diff(np.nan_to_num(a, nan=-7.0), np.nan_to_num(b, nan=-7.0)) if a.shape == b.shape else float("inf")


def poisoned_attack(alg, seen):  # padding agents start from garbage models
    def resize(state, size):
        if size < jax.tree_util.tree_leaves(state.params)[0].shape[0]:
            seen.append(str(jax.tree_util.tree_leaves(state.params)[0].sharding.spec))
        state = alg.resize(state, size)
        if size > NA:
            state = state._replace(params=jax.tree_util.tree_map(lambda a: a.at[NA:].set(3.0), state.params))
        return state

    return alg._replace(resize=resize)


clean_attack_pad = attack_run.pad_attack_data


def poisoned_attack_pad(data, size, num_real):  # padding agents with shifted data and full counts
    d = clean_attack_pad(data, size, num_real)
    groups = (d.benign, d.malicious) if isinstance(d, attacks.AttackData) else tuple(d)
    g = groups[-1]
    extra = size - num_real
    g = g._replace(x=g.x.at[-extra:].set(jnp.asarray(rng.integers(0, 256, g.x[-extra:].shape), g.x.dtype)),
                   y=g.y.at[-extra:].set(1), counts=g.counts.at[-extra:].set(g.x.shape[1]))
    return d._replace(malicious=g) if isinstance(d, attacks.AttackData) else groups[:-1] + (g,)


for name, (alg, adata_) in attack_algs.items():
    kw = dict(progress=False)
    a = attack_run.run_attack(alg, tiny, adata_, ads, 3, jax.random.key(6), **kw)
    b = attack_run.run_attack(alg, tiny, adata_, ads, 3, jax.random.key(6), mesh=mesh, **kw)
    seen = []
    attack_run.pad_attack_data = poisoned_attack_pad
    try:
        c = attack_run.run_attack(poisoned_attack(alg, seen), tiny, adata_, ads, 3, jax.random.key(6), mesh=mesh, **kw)
    finally:
        attack_run.pad_attack_data = clean_attack_pad
    out[f"att_{name}_params"] = max(diff(u, v) for u, v in zip(jax.tree_util.tree_leaves(a.state.params),
                                                               jax.tree_util.tree_leaves(b.state.params)))
    out[f"att_{name}_metrics"] = attack_history_diff(a.history, b.history)
    out[f"att_{name}_asr"] = abs(a.summary["asr"] - b.summary["asr"]) + abs(a.summary["overall_acc"]
                                                                             - b.summary["overall_acc"])
    out[f"att_{name}_poisoned"] = max(max(diff(u, v) for u, v in zip(jax.tree_util.tree_leaves(b.state.params),
                                                                     jax.tree_util.tree_leaves(c.state.params))),
                                      attack_history_diff(b.history, c.history))
    out[f"att_{name}_shapes_ok"] = all(
        u.shape == v.shape for u, v in zip(jax.tree_util.tree_leaves(a.state), jax.tree_util.tree_leaves(b.state)))
    out[f"att_{name}_padded_spec"] = seen[0] if seen else ""
    if name == "fedcb2o":
        out["att_fedcb2o_P"] = max(diff(np.nan_to_num(a.state.P, nan=-7.0, neginf=-9),
                                        np.nan_to_num(b.state.P, nan=-7.0, neginf=-9)),
                                   diff(np.nan_to_num(b.state.P, nan=-7.0, neginf=-9),
                                        np.nan_to_num(c.state.P, nan=-7.0, neginf=-9)))
        out["att_fedcb2o_G_rounds"] = len(a.history) == 3 and "asr" in a.history[-1]

# The exchange: only requested rows move; equals the global gather, also when the
# requests are skewed onto one device (several rounds through small buffers).
from functools import partial  # noqa: E402

from jax.sharding import PartitionSpec  # noqa: E402

from cbo_jax.federated.exchange import fetch_rows  # noqa: E402
from cbo_jax.federated.algorithms.fedcbo import aggregate, aggregate_sharded  # noqa: E402
from cbo_jax.federated.algorithms.base import AgentData  # noqa: E402

table = {"w": jnp.asarray(rng.normal(size=(32, 3, 2)).astype(np.float32)), "b": jnp.arange(32, dtype=jnp.int32)}
spec = PartitionSpec(sharding.AGENT_AXIS)
for name, req in (("random", rng.integers(0, 32, (32, 5))), ("skewed", rng.integers(0, 4, (32, 5)))):
    req = jnp.asarray(req, jnp.int32)
    fetch = jax.jit(jax.shard_map(partial(fetch_rows, axis_name=sharding.AGENT_AXIS, num_devices=8, capacity=2),
                                  mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False))
    got = fetch(table, req)
    out[f"exchange_{name}"] = max(diff(got["w"], table["w"][req]), diff(got["b"], table["b"][req]))

# FedCBO's aggregation through the exchange equals the unsharded aggregation, and its
# compiled program has no all-gather (the population is never copied whole).
params = models.init_population(model, jax.random.key(0), 16)
idx = jnp.asarray(np.stack([rng.choice(np.delete(np.arange(16), j), 3, replace=False) for j in range(16)]), jnp.int32)
adata = AgentData(jnp.asarray(rng.normal(size=(16, 20, 2, 1)), jnp.float32), jnp.asarray(rng.integers(0, 2, (16, 20)),
                  jnp.int32), jnp.asarray(rng.integers(5, 21, 16), jnp.int32))
fcfg = FedCBOConfig(M=3, local=loc, eval_chunk=2)
ref = aggregate(model, fcfg, params, idx, adata)
sh = sharding.shard_agents((params, idx, adata), mesh)
agg = jax.jit(partial(aggregate_sharded, model, fcfg, mesh=mesh))
res = agg(*sh)
out["agg_sharded_loss"] = diff(res[0], ref[0])
out["agg_sharded_m"] = max(diff(u, v) for u, v in zip(jax.tree_util.tree_leaves(res[2]), jax.tree_util.tree_leaves(ref[2])))
out["agg_sharded_all_gathers"] = agg.lower(*sh).compile().as_text().count("all-gather")

print(json.dumps(out))
sys.stdout.flush()
