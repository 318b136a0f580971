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

# A sharded run continued from its state (as from a restored checkpoint, which arrives on one
# device): 60 + 40 steps with mesh= equal the 100 steps, and the continuation runs sharded.
half = cj.simulate(dyn_fast, x0, jax.random.key(2), 60, num_runs=3, mesh=mesh)
one_device = jax.device_put(half.state, jax.devices()[0])
rest = cj.simulate(dyn_fast, None, None, 40, num_runs=3, mesh=mesh, initial_state=one_device)
out["cbo_resumed_sharded_x"] = diff(b.state.x, rest.state.x)
out["cbo_resumed_sharded_spec"] = str(rest.state.x.sharding.spec)

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

# Federated: every pinned run (tests/_federated_variants.py) on the 8 devices, N=13 agents
# (12 in the attack runs) padded to 16 with inactive agents, every per-agent array split
# over the devices. Compared with the pinned runs of the pre-redesign code, sharded and
# unsharded: the final state (every array) and every metric of every round.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _federated_variants as fv  # noqa: E402
from cbo_jax.federated import padding as fpad  # noqa: E402
from cbo_jax.federated import run as fed_run  # noqa: E402
from cbo_jax.federated.data import AgentData  # noqa: E402
from cbo_jax.federated.exchange import exchange_downloads, fetch_rows  # noqa: E402

pinned = np.load(fv.PINNED)


def worst(c):
    return max(c["diffs"].values(), default=0.0)


runs = {}
import time  # noqa: E402
t_fed = time.perf_counter()
for name in fv.variants():
    s, h = fv.run_variant(name, mesh)
    runs[name] = (s, h)
    c8, c1 = fv.compare(name, "mesh8", s, h, pinned), fv.compare(name, "single", s, h, pinned)
    out[f"fed_{name}_vs_pinned_mesh8"] = worst(c8)
    out[f"fed_{name}_vs_single"] = worst(c1)
    out[f"fed_{name}_missing"] = sorted(set(c8["missing"]) - fv.DROPPED)
    out[f"fed_{name}_pinned_arrays"] = len(c8["diffs"])

print(f"federated variants: {time.perf_counter() - t_fed:.1f} s", file=sys.stderr)
# FedCBO's downloads through the all_to_all exchange: the same run, no population gather.
alg, data, rms, ms, seed = fv.variants()["fedcbo_egreedy_iso"]()
from cbo_jax.federated.algorithms import fedcbo  # noqa: E402

exch = fedcbo(fv.MODEL, alg.config, data.num_agents, downloads=exchange_downloads(mesh))
res = fed_run(exch, data, fv.ROUNDS, jax.random.key(seed), round_metrics=rms, metrics=ms, progress=False, mesh=mesh)
out["fed_exchange_vs_single"] = worst(fv.compare("fedcbo_egreedy_iso", "single", fv.state_arrays(res.state),
                                                 fv.history_arrays(res.history), pinned))

# Padding agents given data (full counts, garbage inputs; AttackData pads its last group
# with AgentData.pad) and garbage models change nothing.
clean_pad_state, clean_agent_pad = fpad.Layout.pad_state, AgentData.pad
seen = []


def poisoned_state(self, state):
    state = clean_pad_state(self, state)
    if self.padded:
        fields = getattr(type(state), "agent_fields", ())
        state = state._replace(**{f: jax.tree_util.tree_map(
            lambda a: a.at[self.n:].set(3.0) if jnp.issubdtype(a.dtype, jnp.floating) else a, getattr(state, f))
            for f in fields})
        seen.append(self.size)
    return state


def poisoned_agents(self, size):
    d = clean_agent_pad(self, size)
    n = self.num_agents
    return d._replace(x=d.x.at[n:].set(5.0), y=d.y.at[n:].set(1), counts=d.counts.at[n:].set(d.x.shape[1]))


from cbo_jax.federated import runner as frunner  # noqa: E402

# the runner pads through one jitted function per layout, compiled by the clean runs above:
# a fresh one traces the poisoned pad_state (restored below)
clean_jit_pad = frunner._pad_state
frunner._pad_state = jax.jit(lambda state, layout: layout.pad_state(state), static_argnums=1)
fpad.Layout.pad_state, AgentData.pad = poisoned_state, poisoned_agents
try:
    for name in ("fedcbo_egreedy_iso", "fedcbo_probsampling", "fedavg", "ifca", "local", "fedsgld", "fedcb2o_G",
                 "oracle_max", "fedprox", "ditto", "dfedavg_krum", "scaffold", "cfl"):
        s, h = fv.run_variant(name, mesh)
        ref_s, ref_h = runs[name]
        out[f"fed_{name}_poisoned"] = max([float(np.max(np.abs(np.nan_to_num(ref_s[k] - s[k])), initial=0))
                                           for k in ref_s] + [float(np.nanmax(np.abs(ref_h[k] - h[k]), initial=0))
                                                              for k in ref_h])
finally:
    fpad.Layout.pad_state, AgentData.pad = clean_pad_state, clean_agent_pad
    frunner._pad_state = clean_jit_pad
out["fed_poisoned_padding_used"] = bool(seen) and all(v == 16 for v in seen)

# The exchange: only requested rows move; equals the global gather, also when the
# requests are skewed onto one device (several rounds through small buffers).
from functools import partial  # noqa: E402

from jax.sharding import PartitionSpec  # noqa: E402

from cbo_jax import models  # noqa: E402
from cbo_jax.federated.aggregation import Energy, consensus_downloads  # noqa: E402
from cbo_jax.federated.local import agent_loss  # noqa: E402

table = {"w": jnp.asarray(rng.normal(size=(32, 3, 2)).astype(np.float32)), "b": jnp.arange(32, dtype=jnp.int32)}
spec = PartitionSpec(sharding.AGENT_AXIS)
for name, req in (("random", rng.integers(0, 32, (32, 5))), ("skewed", rng.integers(0, 4, (32, 5)))):
    req = jnp.asarray(req, jnp.int32)
    fetch = jax.jit(jax.shard_map(partial(fetch_rows, axis_name=sharding.AGENT_AXIS, num_devices=8, capacity=2),
                                  mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False))
    got = fetch(table, req)
    out[f"exchange_{name}"] = max(diff(got["w"], table["w"][req]), diff(got["b"], table["b"][req]))

# The consensus step through the exchange equals the local gather, and its compiled
# program has no all-gather (the population is never copied whole).
model = fv.MODEL
params = models.init_population(model, jax.random.key(0), 16)
idx = jnp.asarray(np.stack([rng.choice(np.delete(np.arange(16), j), 3, replace=False) for j in range(16)]), jnp.int32)
x = jnp.asarray(rng.normal(size=(16, 20, 2, 1)), jnp.float32)
y = jnp.asarray(rng.integers(0, 2, (16, 20)), jnp.int32)
c = jnp.asarray(rng.integers(5, 21, 16), jnp.int32)


def energy(models_, theta, xj, yj, cj):
    loss = jax.vmap(lambda p: agent_loss(model, p, xj, yj, cj))(models_)
    own = agent_loss(model, theta, xj, yj, cj)
    return Energy(loss, loss, own, own)


def step(params, idx, x, y, c, downloads=None):
    return consensus_downloads(energy, params, idx, params, (x, y, c), alpha=5.0, chunk=2, downloads=downloads)


ref = jax.jit(step)(params, idx, x, y, c)
sh = sharding.shard_agents((params, idx, x, y, c), mesh)
agg = jax.jit(partial(step, downloads=exchange_downloads(mesh)))
got = agg(*sh)
out["agg_sharded_loss"] = diff(got.loss, ref.loss)
out["agg_sharded_m"] = max(diff(u, v) for u, v in zip(jax.tree_util.tree_leaves(got.consensus),
                                                      jax.tree_util.tree_leaves(ref.consensus)))
out["agg_sharded_all_gathers"] = agg.lower(*sh).compile().as_text().count("all-gather")

print(json.dumps(out))
sys.stdout.flush()
