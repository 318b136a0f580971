"""Cost of one FedCBO round on CPU: local training and aggregation, against a matmul ceiling.

Setting (FedCBO paper §2.4, rotated MNIST, its local settings): N agents
(default 240) with n = 200 training images each, MLP 784-200-10 (P = 159,010
parameters), M downloads per agent (default 40), local SGD with tau epochs (default
10), batch 128, lr 0.1, momentum 0.9; eps-greedy / uniform selection does not matter
for the cost, so the downloads ``idx`` are M distinct other agents drawn uniformly.

Data: by default synthetic ``uint8`` images (N, 200, 28, 28) with random labels. The
cost of both phases does not depend on pixel values or labels (fixed shapes, no
data-dependent control flow), so synthetic data is used for timing. ``--data real``
uses rotated MNIST (K = 4 rotations) built with ``rotated_mnist`` from
``mnist.load_mnist('auto')``: the IDX files in ``$CBO_JAX_DATA_DIR`` when that is set
(N=240 x 200 images needs 12,000 images per cluster; the bundled 10,000-image subset
is too small for that and gives an error).

Timed, each jitted and compiled ahead of time (compile time reported separately). All
timed functions are run once to warm up, then round-robin for ``--repeats`` cycles
(every function once per cycle), so that all variants see the same, varying load of
this shared machine; the minimum wall time is reported, every run is in the JSON:

(a) ``local``: ``local_train`` of all N agents for one round (tau epochs).
(b) ``aggregation``: ``aggregate(model, cfg, params, idx, data)`` plus the update
    ``theta - step * (theta - m)`` (what ``fedcbo``'s round does after local training,
    without selection / likelihood bookkeeping).

FLOPs (multiply and add counted separately, biases / ReLU / softmax neglected):
  aggregation = N (M + 1) * 2 n (784*200 + 200*10)     forward pass of each of the M
                                                       downloads and the own model on
                                                       the agent's n samples
              + N * 2 M P                              weighted mean m_j (eq. 19)
  local       = N * tau * n * (4*784*200 + 6*200*10)
                forward (2 flops/MAC) + weight gradients (2) of both layers, plus the
                hidden-activation gradient of layer 2, for the n real rows (the table's
                rows; the round report below uses 6P per sample). ``local_train``
                computes the last batch at its true size; the ``padded_last_batch``
                variant computes ceil(n/B)*B rows, of which only n count.
Matmul ceiling: best GFLOP/s of a jitted float32 ``jnp.dot`` measured in the same
process before and after every cycle (the per-agent GEMM of the aggregation,
(n x 784) @ (784 x M*200), and a square 2048^3; min time of several runs); the max
over shapes and measurements is the ceiling. ``fraction_of_matmul_peak`` = GFLOP/s of
the fastest run / ceiling (conservative); ``same-cycle`` = the best over cycles of a
run's GFLOP/s divided by the ceiling measured around that same cycle.

Prototypes and alternatives (on by default; ``--no-compare`` skips them), measured next
to the package code:

* ``aggregate_proposed`` (a prototype): same results as ``aggregate`` up to float32
  rounding, but the consensus points are one dense GEMM ``W @ clean`` with ``W`` the
  (N, N) matrix holding each agent's normalised weights at its downloads' columns.
* ``by_model`` (package code, ``FedCBOConfig(eval_by="model")``; ``--groups``, default 4
  and 8 at the benchmark setting, 4 elsewhere): each model evaluated on the stacked data of
  the agents that downloaded it (``consensus_by_model``). Equal to ``aggregate`` up to float32
  rounding (checked in the JSON).
* ``by_model_unroll1`` (at the first group size): the same with one group per loop
  iteration (``unroll=1``), bitwise equal (checked in the JSON), to attribute the gain of
  the unrolled loop (four independent forward passes per iteration).
* ``aggregate_fused`` (``--prototypes proposed,fused``): the package's step as one fused
  pass (weights and contraction in the same ``lax.map``), the code before the two-pass
  step; bitwise equal to ``aggregate``, to attribute the two-pass gain.
* ``local agent_chunk=k`` (``--agent-chunks``, default 1): the package's ``local_train``
  with ``LocalSGDConfig(agent_chunk=k)``, agents trained k at a time instead of all
  vmapped at once.
* ``local_train_padded``: ``local_train`` as it was before issue 18, its last mini-batch
  padded to B rows (200 samples, B = 128: 128 + 128 rows, 56 of them masked) instead of
  computed at its true size (128 + 72); the same random streams and batches, equal up
  to float rounding, to attribute the gain.
* ``test_eval per_agent``: the per-agent test evaluation (each agent on its own copy of
  its test set), next to the package's grouped one.

(c) ``round``: the package's whole FedCBO round (``fedcbo(...).round``: participation,
    local training, selection, aggregation, the likelihood update), and
(d) ``test_eval``: the per-round evaluation the paper reports, every agent's accuracy on
    its cluster's test set (``test_size`` images per cluster, 10,000 as in the paper;
    the package's ``metrics.test_accuracy`` kernel: agents grouped by test set, chunk 8).

The headline phases use the package's options that run fastest on the device
(``--agent-chunk``: 1 on a CPU, all agents vmapped elsewhere; ``--eval-by``: ``model`` with
groups of 4 on a CPU, ``agent`` at the setting's ``eval_chunk`` elsewhere); the JSON
records which.

The round report (issue 18) counts useful FLOPs only: 6P per real training sample per
local epoch, 2P per evaluated sample (padded rows do not count), 2MP per agent for the
consensus; the round = ``round`` + ``test_eval``, and ``other`` = ``round`` - local -
aggregation. Keys: ``local_seconds``, ``aggregation_seconds``, ``test_eval_seconds``,
``other_seconds``, ``fraction_of_matmul_peak`` (aggregation),
``local_fraction_of_matmul_peak``, ``round_fraction_of_matmul_peak``; targets 0.75, 0.6
and 0.7 (``pass``).

Settings (``--setting``): ``benchmark`` (below), ``table1-small`` (``fedcbo-table1 --scale
small``: N=120, M=20, tau=5, chunk 8) and ``demo`` (``cbo-jax demo``: N=40, M=8, tau=2,
batch 64, 1,000 test images per cluster, evaluated every 5th round).

Modes:
  default   N=240, M=40, tau=10, repeats 3, eval_chunk sweep {1, 4, 16}.
            About 8 min on the 2-core machine (474 s measured, partly under load).
  --quick   N=48, M=8, tau=1, repeats 2, eval_chunk sweep {16}; < 60 s.

Output: a table; the last line of stdout is one JSON object with "seconds_local",
"seconds_aggregation", "aggregation_gflops", "matmul_peak_gflops",
"fraction_of_matmul_peak" (the headline aggregation, named in "head_aggregation": on a
CPU the package's ``consensus_by_model``), the settings,
and the sweep / prototype numbers. ``--json PATH`` also writes it to a file.

    python benchmarks/fedcbo_round.py --quick
    python benchmarks/fedcbo_round.py
    python benchmarks/fedcbo_round.py --data real     # with CBO_JAX_DATA_DIR set
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cbo_jax import population as pop
from cbo_jax.consensus import consensus_weights
from cbo_jax.federated import selection
from cbo_jax.federated.aggregation import consensus_by_model, consensus_downloads, local_downloads
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo, group_loss, loss_energy
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import LocalSGDConfig, agent_keys, agent_loss, local_train, make_optimizer
from cbo_jax.federated.metrics import _agent_eval_impl, _grouped_eval_impl
from cbo_jax.models import batch_loss, init_population, mlp_mnist
from cbo_jax.runtime.provenance import describe, environment

N_SAMPLES = 200
IN, HID, OUT = 784, 200, 10
P_MLP = IN * HID + HID + HID * OUT + OUT  # 159,010
CLUSTERS = 4

# The settings users run (issue 18, item 4). ``test_size``: test images per cluster that a
# round's evaluation reads; ``eval_every``: rounds between evaluations (the demo evaluates
# every 5th round, so a test evaluation is amortised over 5 rounds in ``amortised_round``).
SETTINGS = {
    "benchmark": dict(agents=240, M=40, tau=10, batch_size=128, lr=0.1, eval_chunk=4, test_size=10_000,
                      eval_every=1),
    "table1-small": dict(agents=120, M=20, tau=5, batch_size=128, lr=0.1, eval_chunk=8, test_size=10_000,
                         eval_every=1),
    "demo": dict(agents=40, M=8, tau=2, batch_size=64, lr=0.05, eval_chunk=8, test_size=1_000, eval_every=5),
}


# ----------------------------------------------------------------------------- prototypes


def aggregate(model, cfg: FedCBOConfig, params, idx, data: AgentData):
    """The package's FedCBO aggregation, eq. (19), as FedCBO's round calls it:
    ``(loss (N, M), own_loss (N,), m)``."""
    res = consensus_downloads(loss_energy(model, cfg), params, idx, params, (data.x, data.y, data.counts),
                              alpha=cfg.alpha, chunk=cfg.eval_chunk)
    return res.loss, res.own_loss, res.consensus


def aggregate_by_model(model, cfg: FedCBOConfig, params, idx, data: AgentData, unroll: int = 4):
    """The package's FedCBO aggregation with ``eval_by="model"``: each model evaluated on the
    stacked data of ``eval_chunk`` agents that downloaded it (``consensus_by_model``, its
    default ``unroll`` of 4 groups per loop iteration)."""
    res = consensus_by_model(group_loss(model, cfg), params, idx, (data.x, data.y, data.counts),
                             alpha=cfg.alpha, group=cfg.eval_chunk, unroll=unroll)
    return res.loss, res.own_loss, res.consensus


def aggregate_by_model_rolled(model, cfg: FedCBOConfig, params, idx, data: AgentData):
    """``aggregate_by_model`` with one group per loop iteration (``unroll=1``, the code before
    the unrolled loop): bitwise equal, to attribute the unrolling's gain."""
    return aggregate_by_model(model, cfg, params, idx, data, unroll=1)


def aggregate_proposed(model, cfg: FedCBOConfig, params, idx, data: AgentData):
    """Drop-in alternative to ``fedcbo.aggregate`` (same outputs, less memory traffic).

    Returns ``(loss (N, M), own_loss (N,), m)`` exactly like ``aggregate``.
    """
    b = cfg.local.batch_size
    n = idx.shape[0]

    def loss_of(p, x, y, c):
        return agent_loss(model, p, x, y, c, batch_size=b, reduction=cfg.loss_reduction)

    # Once per round on (N, P), not once per agent on (M, P).
    finite = pop.tree_isfinite_rows(params)
    clean = jax.tree_util.tree_map(
        lambda leaf: jnp.where(jnp.reshape(finite, finite.shape + (1,) * (leaf.ndim - 1)), leaf, 0), params
    )

    def one_agent(args):
        idx_j, x_j, y_j, c_j, theta_j = args
        downloads = pop.gather(clean, idx_j)
        loss = jax.vmap(lambda p: loss_of(p, x_j, y_j, c_j))(downloads)
        loss = jnp.where(finite[idx_j], loss, jnp.inf)
        return loss, loss_of(theta_j, x_j, y_j, c_j), consensus_weights(loss, cfg.alpha)

    loss, own, w = jax.lax.map(one_agent, (idx, data.x, data.y, data.counts, params), batch_size=cfg.eval_chunk)
    # m_j = sum_i w_ji theta_i as one (N, N) @ (N, P) GEMM per leaf.
    dense_w = jnp.zeros((n, n), w.dtype).at[jnp.arange(n)[:, None], idx].add(w)
    return loss, own, pop.weighted_mean(clean, dense_w)


def aggregate_fused(model, cfg: FedCBOConfig, params, idx, data: AgentData):
    """The package's aggregation as one fused pass (weights and contraction in the same
    ``lax.map``, the code before the two-pass step): a download map without
    ``cheap_refetch`` is called once. Bitwise equal to ``aggregate``."""
    res = consensus_downloads(loss_energy(model, cfg), params, idx, params, (data.x, data.y, data.counts),
                              alpha=cfg.alpha, chunk=cfg.eval_chunk, downloads=lambda *a: local_downloads(*a))
    return res.loss, res.own_loss, res.consensus


PROTOTYPES = {"proposed": aggregate_proposed, "fused": aggregate_fused}


def _train_one_padded(model, cfg: LocalSGDConfig, opt, params, opt_state, x, y, count, key):
    """``cbo_jax.federated.local._train_one`` as it was before issue 18: the last mini-batch
    padded to B rows (masked), e.g. 200 samples -> batches of 128 and 128 (56 masked)."""
    n_max = x.shape[0]
    b = cfg.batch_size
    num_batches = -(-n_max // b)
    slots = jnp.arange(num_batches * b)

    def grad_step(carry, batch):
        params, opt_state = carry
        idx, mask = batch
        loss, grads = jax.value_and_grad(lambda p: batch_loss(model, p, x[idx], y[idx], mask))(params)
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        has_data = jnp.any(mask)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, o: jnp.where(has_data, a, o), new, old)  # noqa: E731
        return (keep(new_params, params), keep(new_opt, opt_state)), (loss, has_data)

    def epoch(carry, key):
        u = jnp.where(jnp.arange(n_max) < count, jax.random.uniform(key, (n_max,)), 2.0)
        perm = jnp.argsort(u)
        perm = jnp.concatenate([perm, jnp.zeros(num_batches * b - n_max, perm.dtype)])
        mask = slots < count
        carry, (losses, has) = jax.lax.scan(grad_step, carry, (perm.reshape(num_batches, b), mask.reshape(num_batches, b)))
        return carry, jnp.sum(losses * has) / jnp.maximum(jnp.sum(has), 1)

    (params, opt_state), losses = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, cfg.epochs))
    return params, opt_state, losses[-1]


def local_train_padded(model, cfg: LocalSGDConfig, params, opt_state, x, y, counts, key):
    """``local_train`` before issue 18 (padded last mini-batch; same random streams)."""
    opt = make_optimizer(cfg)
    if opt_state is None or cfg.reset_optimizer:
        opt_state = jax.vmap(opt.init)(params)
    keys = agent_keys(key, counts.shape[0])
    train = jax.vmap(lambda p, s, xi, yi, c, k: _train_one_padded(model, cfg, opt, p, s, xi, yi, c, k))
    return train(params, opt_state, x, y, counts, keys)


def local_train_package(model, cfg: LocalSGDConfig, params, opt_state, x, y, counts, key):
    """The package's ``local_train`` with the benchmark's argument layout."""
    return local_train(model, cfg, params, opt_state, AgentData(x, y, counts), key)


# ----------------------------------------------------------------------------- helpers


def load_avg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def make_data(kind: str, n_agents: int, seed: int) -> AgentData:
    if kind == "synthetic":
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 256, (n_agents, N_SAMPLES, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, (n_agents, N_SAMPLES)).astype(np.int32)
        counts = np.full((n_agents,), N_SAMPLES, np.int32)
        return AgentData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(counts))
    from cbo_jax.federated import mnist
    from cbo_jax.federated.data import rotated_mnist

    src = mnist.load_mnist("auto")
    fed = rotated_mnist(src, n_agents, 4, samples_per_agent=N_SAMPLES, seed=seed)
    return fed.train


def compile_fn(fn, *args):
    t0 = time.perf_counter()
    c = jax.jit(fn).lower(*args).compile()
    return c, time.perf_counter() - t0


def _once(f, a, b) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, b))
    return time.perf_counter() - t0


def agg_flops(n_agents: int, m: int) -> float:
    return n_agents * (m + 1) * 2.0 * N_SAMPLES * (IN * HID + HID * OUT) + n_agents * 2.0 * m * P_MLP


def local_flops(n_agents: int, tau: int, batch: int, n_max: int = N_SAMPLES, padded: bool = True) -> float:
    rows = math.ceil(n_max / batch) * batch if padded else n_max
    return n_agents * tau * rows * (4.0 * IN * HID + 6.0 * HID * OUT)


def useful_flops(n_agents: int, m: int, tau: int, test_size: int) -> dict:
    """Issue 18's convention: useful work only, P parameters per model; 6P per real training
    sample per local epoch, 2P per evaluated sample (padded rows do not count), the
    consensus contraction 2MP per agent, the test evaluation every agent on its cluster's
    test set once."""
    return {"local": 6.0 * P_MLP * N_SAMPLES * tau * n_agents,
            "aggregation": 2.0 * P_MLP * N_SAMPLES * (m + 1) * n_agents + 2.0 * m * P_MLP * n_agents,
            "test_eval": 2.0 * P_MLP * test_size * n_agents}


def max_abs_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


# ----------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small setting, < 60 s")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="benchmark",
                    help="benchmark (N=240, M=40, tau=10; the default), table1-small or demo")
    ap.add_argument("--agents", "-N", type=int, default=None, help="N (default 240; 48 with --quick)")
    ap.add_argument("--downloads", "-M", type=int, default=None, help="M (default 40; 8 with --quick)")
    ap.add_argument("--epochs", "--tau", type=int, default=None, help="local epochs tau (default 10; 1 with --quick)")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--eval-chunk", type=int, default=None, help="eval_chunk of the headline aggregation (default: the setting's)")
    ap.add_argument("--test-size", type=int, default=None, help="test images per cluster in the round's evaluation")
    ap.add_argument("--sweep-chunks", default=None, help="comma-separated eval_chunk values for the sweep (default 1,4,16; quick: 16)")
    ap.add_argument("--no-compare", dest="compare", action="store_false", help="skip the prototypes")
    ap.add_argument("--prototypes", default="proposed", help="comma-separated aggregation prototypes for the sweep: proposed, fused")
    ap.add_argument("--eval-by", choices=("auto", "agent", "model"), default="auto",
                    help="FedCBOConfig.eval_by of the headline aggregation and round ('auto': model on a CPU, "
                         "agent elsewhere)")
    ap.add_argument("--groups", default=None,
                    help="comma-separated group sizes (eval_chunk with eval_by='model') timed for the model-by-model "
                         "aggregation; the first is the headline's (default 4,8 at the benchmark setting, else 4)")
    ap.add_argument("--agent-chunk", default="auto",
                    help="LocalSGDConfig.agent_chunk of the headline local training and round: an integer, "
                         "'none' (all agents vmapped) or 'auto' (1 on a CPU, none elsewhere)")
    ap.add_argument("--agent-chunks", default="1",
                    help="comma-separated agent_chunk values timed beside the default vmapped local training")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs, min reported (default 3; 2 with --quick)")
    ap.add_argument("--data", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    args = ap.parse_args(argv)

    q = args.quick
    st = SETTINGS[args.setting]
    n_agents = args.agents or (48 if q else st["agents"])
    m = args.downloads or (8 if q else st["M"])
    tau = args.epochs or (1 if q else st["tau"])
    repeats = args.repeats or (2 if q else 3)
    args.batch_size = args.batch_size or st["batch_size"]
    args.lr = args.lr or st["lr"]
    args.eval_chunk = args.eval_chunk or st["eval_chunk"]
    test_size = args.test_size or (1000 if q else st["test_size"])
    default_sweep = "16" if q else ("1,4,16" if args.setting == "benchmark" else str(args.eval_chunk))
    sweep = [int(v) for v in (args.sweep_chunks or default_sweep).split(",") if v]
    local_cfg = LocalSGDConfig(epochs=tau, batch_size=args.batch_size, lr=args.lr, momentum=args.momentum)
    if args.agent_chunk == "auto":
        head_chunk = 1 if jax.default_backend() == "cpu" else None
    else:
        head_chunk = None if args.agent_chunk.lower() == "none" else int(args.agent_chunk)
    agent_chunks = sorted({int(v) for v in args.agent_chunks.split(",") if v} | ({head_chunk} - {None}))
    head_local_cfg = dataclasses.replace(local_cfg, agent_chunk=head_chunk)
    eval_by = args.eval_by if args.eval_by != "auto" else ("model" if jax.default_backend() == "cpu" else "agent")
    groups = [int(v) for v in (args.groups or ("4,8" if args.setting == "benchmark" and not q else "4")).split(",") if v]
    head_agg = ("by_model", groups[0]) if eval_by == "model" else ("aggregate", args.eval_chunk)
    head_local_name = "local_train" if head_chunk is None else f"agent_chunk={head_chunk}"

    t_start = time.perf_counter()
    load_start = load_avg()
    env = environment()
    print(f"# FedCBO round cost  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"# {describe(env)}, jax {jax.__version__}, load avg {load_start}")
    print(f"# N={n_agents} M={m} n={N_SAMPLES} tau={tau} B={args.batch_size} lr={args.lr} momentum={args.momentum} "
          f"data={args.data} repeats={repeats} (min reported) setting={args.setting} test images/cluster={test_size}")

    model = mlp_mnist()
    data = make_data(args.data, n_agents, args.seed)
    params = init_population(model, jax.random.key(args.seed), n_agents)
    idx = selection.draw_uniform(jax.random.key(args.seed + 1), n_agents, m)
    key = jax.random.key(args.seed + 2)
    assert sum(leaf[0].size for leaf in jax.tree_util.tree_leaves(params)) == P_MLP

    ceil_shapes = [(N_SAMPLES, IN, m * HID), (2048, 2048, 2048) if not q else (1024, 1024, 1024)]
    protos = [v for v in args.prototypes.split(",") if v] if args.compare else []

    # Every timed function is compiled first, then all of them (and the matmul ceiling)
    # are run round-robin, ``repeats`` cycles after one warm-up cycle, so that each
    # variant samples the same (varying) load on this shared machine.
    jobs = []

    def add_local(name, fn, cfg=local_cfg):
        c, comp_s = compile_fn(lambda p, x, y, cnt, k: fn(model, cfg, p, None, x, y, cnt, k),
                               params, data.x, data.y, data.counts, key)
        jobs.append({"phase": "local", "variant": name, "eval_chunk": "-", "compiled": c,
                     "args": (params, data.x, data.y, data.counts, key), "gflop": local_flops(n_agents, tau, args.batch_size, padded=False) / 1e9,
                     "compile_seconds": comp_s, "xla_temp_gb": c.memory_analysis().temp_size_in_bytes / 1e9})

    def add_agg(name, fn, chunk):
        cfg = FedCBOConfig(M=m, eval_chunk=chunk, local=local_cfg)

        def step(p, i, d):
            loss, own, mm = fn(model, cfg, p, i, d)
            new = jax.tree_util.tree_map(lambda t, c_: t - cfg.step * (t - c_), p, mm)
            return new, loss, own

        c, comp_s = compile_fn(step, params, idx, data)
        jobs.append({"phase": "aggregation", "variant": name, "eval_chunk": chunk, "compiled": c,
                     "args": (params, idx, data), "gflop": agg_flops(n_agents, m) / 1e9,
                     "compile_seconds": comp_s, "xla_temp_gb": c.memory_analysis().temp_size_in_bytes / 1e9})

    def add_test_eval():
        rng = np.random.default_rng(args.seed + 3)
        tx = jnp.asarray(rng.integers(0, 256, (CLUSTERS, test_size, 28, 28), dtype=np.uint8))
        ty = jnp.asarray(rng.integers(0, 10, (CLUSTERS, test_size)).astype(np.int32))
        test_of_np = np.arange(n_agents) % CLUSTERS
        groups = tuple(tuple(int(j) for j in np.flatnonzero(test_of_np == k)) for k in range(CLUSTERS))
        test_of = jnp.asarray(test_of_np, jnp.int32)
        variants = {"test_accuracy": lambda p, x, y: _grouped_eval_impl(model, 8, groups, p, x, y, None)}
        if args.compare:
            variants["per_agent"] = lambda p, x, y: _agent_eval_impl(model, 8, p, x, y, None, test_of)
        for name, fn in variants.items():
            c, comp_s = compile_fn(fn, params, tx, ty)
            jobs.append({"phase": "test_eval", "variant": name, "eval_chunk": 8, "compiled": c,
                         "args": (params, tx, ty), "gflop": flops["test_eval"] / 1e9,
                         "compile_seconds": comp_s, "xla_temp_gb": c.memory_analysis().temp_size_in_bytes / 1e9})

    def add_round():
        cfg = FedCBOConfig(M=m, eval_chunk=head_agg[1], eval_by=eval_by, local=head_local_cfg)
        alg = fedcbo(model, cfg, n_agents)
        state = alg.init(jax.random.key(args.seed))
        c, comp_s = compile_fn(alg.round, state, data)
        jobs.append({"phase": "round", "variant": "fedcbo.round", "eval_chunk": head_agg[1], "compiled": c,
                     "args": (state, data), "gflop": (flops["local"] + flops["aggregation"]) / 1e9,
                     "compile_seconds": comp_s, "xla_temp_gb": c.memory_analysis().temp_size_in_bytes / 1e9})

    flops = useful_flops(n_agents, m, tau, test_size)
    add_round()
    add_test_eval()
    add_local("local_train", local_train_package)
    for k in agent_chunks:
        add_local(f"agent_chunk={k}", local_train_package, dataclasses.replace(local_cfg, agent_chunk=k))
    if args.compare:
        add_local("padded_last_batch", local_train_padded)
    add_agg("aggregate", aggregate, args.eval_chunk)
    for g in groups:
        add_agg("by_model", aggregate_by_model, g)
    if args.compare:
        add_agg("by_model_unroll1", aggregate_by_model_rolled, groups[0])
    for chunk in sweep:
        if chunk != args.eval_chunk:
            add_agg("aggregate", aggregate, chunk)
        for name in protos:
            add_agg(name, PROTOTYPES[name], chunk)
    print(f"# compiled {len(jobs)} functions in {sum(j['compile_seconds'] for j in jobs):.1f} s", flush=True)

    ceil_fns = []
    for mm_, kk, nn in ceil_shapes:
        a = jax.random.normal(jax.random.key(0), (mm_, kk), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (kk, nn), jnp.float32)
        f = jax.jit(jnp.dot).lower(a, b).compile()
        ceil_fns.append((f"{mm_}x{kk}x{nn}", f, a, b, 2.0 * mm_ * kk * nn))

    def ceiling_now(target_s: float = 0.6) -> dict:
        res = {}
        for name, f, a, b, fl in ceil_fns:
            one = _once(f, a, b)
            reps = int(min(max(3, target_s / max(one, 1e-6)), 40))
            res[name] = fl / min([one] + [_once(f, a, b) for _ in range(reps)]) / 1e9
        return res

    for j in jobs:  # warm-up cycle
        j["out"] = j["compiled"](*j["args"])
        jax.block_until_ready(j["out"])
        j["walls"], j["cpus"] = [], []
    ceilings = []
    for cycle in range(repeats):
        ceilings.append(ceiling_now())
        for j in jobs:
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(j["compiled"](*j["args"]))
            j["walls"].append(time.perf_counter() - t0)
            j["cpus"].append(time.process_time() - c0)
        ceilings.append(ceiling_now())
        print(f"  cycle {cycle + 1}/{repeats}: load {load_avg()}, ceiling "
              + ", ".join(f"{k} {v:.0f}" for k, v in ceilings[-1].items()) + " GFLOP/s; "
              + ", ".join(f"{j['variant']}@{j['eval_chunk']} {j['walls'][-1]:.2f}s" for j in jobs), flush=True)
    peak = max(v for c in ceilings for v in c.values())
    # The same ratio within one cycle (ceiling around that cycle): robust to load changes between cycles.
    cyc_peak = [max(list(ceilings[2 * r].values()) + list(ceilings[2 * r + 1].values())) for r in range(repeats)]
    load_end = load_avg()

    checks = {}
    by = {(j["phase"], j["variant"], j["eval_chunk"]): j for j in jobs}
    if args.compare:
        checks["local_padded_max_abs_diff_params"] = max_abs_diff(
            by[("local", "local_train", "-")]["out"].params, by[("local", "padded_last_batch", "-")]["out"][0])
        for k in agent_chunks:
            checks[f"local_agent_chunk{k}_max_abs_diff_params"] = max_abs_diff(
                by[("local", "local_train", "-")]["out"].params, by[("local", f"agent_chunk={k}", "-")]["out"].params)
        ta, pa = by[("test_eval", "test_accuracy", 8)]["out"], by[("test_eval", "per_agent", 8)]["out"]
        checks["test_eval_grouped_max_abs_diff_acc"] = max_abs_diff(ta[0], pa[0])
        checks["test_eval_grouped_max_abs_diff_loss"] = max_abs_diff(ta[1], pa[1])
        ref = by[("aggregation", "aggregate", args.eval_chunk)]["out"]
        other = by[("aggregation", "by_model", groups[0])]["out"]
        checks["by_model_max_abs_diff_new_params"] = max_abs_diff(ref[0], other[0])
        checks["by_model_max_abs_diff_losses"] = max_abs_diff(ref[1:], other[1:])
        checks["by_model_unroll1_max_abs_diff_all"] = max_abs_diff(
            other, by[("aggregation", "by_model_unroll1", groups[0])]["out"])
        for name in protos:
            other = by[("aggregation", name, sweep[0])]["out"]
            checks[f"{name}_max_abs_diff_new_params"] = max_abs_diff(ref[0], other[0])
            checks[f"{name}_max_abs_diff_losses"] = max_abs_diff(ref[1:], other[1:])

    rows = []
    for j in jobs:
        i = int(np.argmin(j["walls"]))
        s_, cpu = j["walls"][i], j["cpus"][i]
        rows.append({
            "phase": j["phase"], "variant": j["variant"], "eval_chunk": j["eval_chunk"], "seconds": s_, "cpu_seconds": cpu,
            "gflop": j["gflop"], "gflops": j["gflop"] / s_, "fraction_of_matmul_peak": j["gflop"] / s_ / peak,
            "fraction_same_cycle": max(j["gflop"] / w / cp for w, cp in zip(j["walls"], cyc_peak)),
            "seconds_all": j["walls"], "compile_seconds": j["compile_seconds"], "xla_temp_gb": j["xla_temp_gb"],
        })

    print()
    hdr = (f"{'phase':<12} {'variant':<19} {'chunk':>5} {'seconds':>9} {'cpu_s':>8} {'cores':>5} {'GFLOP':>8} "
           f"{'GFLOP/s':>8} {'of peak':>7} {'same-cyc':>8} {'compile_s':>9} {'temp_GB':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['phase']:<12} {r['variant']:<19} {r['eval_chunk']!s:>5} {r['seconds']:9.3f} {r['cpu_seconds']:8.2f} "
              f"{r['cpu_seconds'] / r['seconds']:5.2f} {r['gflop']:8.1f} {r['gflops']:8.1f} {r['fraction_of_matmul_peak']:7.2f} "
              f"{r['fraction_same_cycle']:8.2f} {r['compile_seconds']:9.2f} {r['xla_temp_gb']:7.3f}")
    print(f"matmul ceiling {peak:.1f} GFLOP/s (max over {[c[0] for c in ceil_fns]}, measured before and after every cycle; "
          f"per cycle {', '.join(f'{v:.0f}' for v in cyc_peak)})")
    print("'of peak' = GFLOP/s of the fastest run / ceiling; 'same-cyc' = best over cycles of GFLOP/s / that cycle's ceiling")
    print(f"load avg start {load_start} / end {load_end}; total {time.perf_counter() - t_start:.0f} s")
    for k, v in checks.items():
        print(f"check {k} = {v:.3g}")

    head = next(r for r in rows if r["phase"] == "aggregation" and (r["variant"], r["eval_chunk"]) == head_agg)
    loc = next(r for r in rows if r["variant"] == head_local_name)
    loc2 = next((r for r in rows if r["variant"] == "padded_last_batch"), None)
    best = min((r for r in rows if r["phase"] == "aggregation"), key=lambda r: r["seconds"])
    rnd = next(r for r in rows if r["phase"] == "round")
    tev = next(r for r in rows if r["phase"] == "test_eval" and r["variant"] == "test_accuracy")
    # Seconds of one round's phases (fastest runs): local training and aggregation timed on
    # their own; "other" = the package's whole round minus those two (participation,
    # selection, the likelihood update, the model update, state bookkeeping).
    other_s = max(rnd["seconds"] - loc["seconds"] - head["seconds"], 0.0)
    if rnd["seconds"] < loc["seconds"] + head["seconds"]:  # the shares below then add up to more than 100 %
        print(f"note: the whole round ({rnd['seconds']:.3f} s) took less than its local training and aggregation "
              f"timed alone ({loc['seconds']:.3f} + {head['seconds']:.3f} s; a noisy machine, or a round that "
              f"overlaps them): 'other' is shown as 0")
    round_s = rnd["seconds"] + tev["seconds"]
    round_useful = sum(flops.values())
    amortised_s = rnd["seconds"] + tev["seconds"] / st["eval_every"]
    phases = {
        "local": {"seconds": loc["seconds"], "useful_gflop": flops["local"] / 1e9,
                  "fraction_of_matmul_peak": flops["local"] / loc["seconds"] / 1e9 / peak},
        "aggregation": {"seconds": head["seconds"], "useful_gflop": flops["aggregation"] / 1e9,
                        "fraction_of_matmul_peak": flops["aggregation"] / head["seconds"] / 1e9 / peak},
        "test_eval": {"seconds": tev["seconds"], "useful_gflop": flops["test_eval"] / 1e9,
                      "fraction_of_matmul_peak": flops["test_eval"] / tev["seconds"] / 1e9 / peak},
        "other": {"seconds": other_s, "useful_gflop": 0.0, "fraction_of_matmul_peak": 0.0},
    }
    print()
    print(f"one round at setting '{args.setting}' (useful FLOPs; ceiling {peak:.1f} GFLOP/s):")
    for k, v in phases.items():
        print(f"  {k:<12} {v['seconds']:8.3f} s  {v['useful_gflop']:8.1f} GFLOP  {v['fraction_of_matmul_peak']:5.2f} of peak  "
              f"{v['seconds'] / round_s:5.1%} of the round")
    print(f"  {'round':<12} {round_s:8.3f} s  {round_useful / 1e9:8.1f} GFLOP  {round_useful / round_s / 1e9 / peak:5.2f} of peak "
          f"(package round {rnd['seconds']:.3f} s + test evaluation {tev['seconds']:.3f} s)")
    result = {
        "benchmark": "fedcbo_round",
        "setting": args.setting,
        "local_seconds": loc["seconds"],
        "aggregation_seconds": head["seconds"],
        "test_eval_seconds": tev["seconds"],
        "other_seconds": other_s,
        "round_seconds": round_s,
        "round_seconds_amortised": amortised_s,
        "local_fraction_of_matmul_peak": phases["local"]["fraction_of_matmul_peak"],
        "test_eval_fraction_of_matmul_peak": phases["test_eval"]["fraction_of_matmul_peak"],
        "round_fraction_of_matmul_peak": round_useful / round_s / 1e9 / peak,
        "phases": phases,
        "pass": {"aggregation_ge_0.75": head["fraction_of_matmul_peak"] >= 0.75,
                 "local_ge_0.6": phases["local"]["fraction_of_matmul_peak"] >= 0.6,
                 "round_ge_0.7": round_useful / round_s / 1e9 / peak >= 0.7},
        "seconds_local": loc["seconds"],
        "seconds_aggregation": head["seconds"],
        "aggregation_gflops": head["gflops"],
        "matmul_peak_gflops": peak,
        "fraction_of_matmul_peak": head["fraction_of_matmul_peak"],
        "fraction_of_matmul_peak_same_cycle": head["fraction_same_cycle"],
        "local_gflops": loc["gflops"],
        "seconds_local_padded_last_batch": loc2["seconds"] if loc2 else None,
        "head_aggregation": {"variant": head_agg[0], "eval_chunk": head_agg[1]},  # the one the headline keys report
        "best_aggregation": {k: best[k] for k in ("variant", "eval_chunk", "seconds", "gflops", "fraction_of_matmul_peak", "fraction_same_cycle")},
        "settings": {
            "N": n_agents, "M": m, "n": N_SAMPLES, "tau": tau, "batch_size": args.batch_size, "lr": args.lr,
            "momentum": args.momentum, "eval_chunk": args.eval_chunk, "eval_by": eval_by, "groups": groups, "agent_chunk": head_chunk, "data": args.data, "repeats": repeats,
            "quick": q, "test_size": test_size, "eval_every": st["eval_every"], "model": "mlp-784-200-10", "params_per_model": P_MLP, "sweep_chunks": sweep, "prototypes": protos,
            "aggregation_gflop": agg_flops(n_agents, m) / 1e9, "local_gflop_padded": local_flops(n_agents, tau, args.batch_size) / 1e9,
        },
        "matmul_ceilings": ceilings,
        "rows": rows,
        "checks": checks,
        "load_avg_start": load_start,
        "load_avg_end": load_end,
        "device": describe(env),
        "jax": jax.__version__,
        "environment": env,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(line + "\n")
    print(line)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
