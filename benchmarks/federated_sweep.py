"""A FedCBO hyperparameter sweep as one vmapped program against a loop of runs.  Issue 62.

System: FedCBO (ε-greedy selection) on a clustered synthetic task: ``N`` agents in two clusters
whose labels are opposite functions of the same inputs (a model fit to one cluster is wrong on
the other), an MLP with one hidden layer, ``M`` downloads, one local epoch per round. The grid
is the outer product of α (eq. (19)) and the local learning rate λ2 γ; ``--quick``: α = 1, 10,
30, 100 × lr = 0.02, 0.05, 0.1, 0.2 (16 points), N = 20, 5 rounds. Without ``--quick``, also
ε0 = 0.2, 0.5, 0.8 (48 points), N = 40, 10 rounds.

Two ways to run the same grid, each point from the same data and key:

* **sweep**: ``fl.run(fedcbo(model, cfg, N), data, T, key, params=grid)``, one program;
* **loop**: what a sweep was before: a loop of ``fl.run(fedcbo(model, cfg_p, N), ...)``, one
  per point, each config's numbers constants of its own compiled rounds.

``speedup_vs_loop`` is the loop's time over the sweep's, both cold as a user meets them (each
loop point compiles its rounds; the sweep compiles once); ``speedup_warm`` the same with every
program compiled already (a second pass of both), which on a CPU measures what vmapping the
points costs or saves once compilation is paid. ``max_abs_diff`` is the largest difference of
the final parameters of every agent between the sweep and the loop (float32; pass <= 1e-5).

    python benchmarks/federated_sweep.py --quick     # 16 points, N = 20, 5 rounds
    python benchmarks/federated_sweep.py             # 48 points, N = 40, 10 rounds

Last line: one JSON object with "points", "max_abs_diff" and "speedup_vs_loop".
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import time

import jax
import numpy as np

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.runtime.provenance import environment


def clustered_task(n: int, n_max: int = 40, seed: int = 0) -> fl.FederatedData:
    """Two clusters of agents, labels ``x0 > 0`` in one and ``x0 <= 0`` in the other."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 4)).astype(np.float32)
    cluster = (np.arange(n) >= n // 2).astype(np.int32)
    y = (x[:, :, 0] + 0.5 * x[:, :, 1] > 0).astype(np.int32)
    y[cluster == 1] = 1 - y[cluster == 1]
    counts = rng.integers(n_max // 2, n_max + 1, n).astype(np.int32)
    tx = rng.normal(size=(2, 200, 4)).astype(np.float32)
    ty = np.stack([tx[0, :, 0] + 0.5 * tx[0, :, 1] > 0, tx[1, :, 0] + 0.5 * tx[1, :, 1] <= 0]).astype(np.int32)
    return fl.FederatedData(x, y, counts, cluster, tx, ty)


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 points (α × lr), N = 20, 5 rounds")
    ap.add_argument("--agents", "-N", type=int, default=None, help="default 20 with --quick, else 40")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 with --quick, else 10")
    ap.add_argument("--json", default=None, help="also write the summary to this file")
    args = ap.parse_args(argv)
    n = args.agents or (20 if args.quick else 40)
    rounds = args.rounds or (5 if args.quick else 10)
    params = {"alpha": [1.0, 10.0, 30.0, 100.0], "local.lr": [0.02, 0.05, 0.1, 0.2]}
    if not args.quick:
        params["eps0"] = [0.2, 0.5, 0.8]
    data = clustered_task(n)
    model = models.from_flax(models.MLP(hidden=(8,), num_classes=2), data.x[0, :1], name="mlp-8")
    cfg = fl.FedCBOConfig(M=4, eps_min=0.1, local=fl.LocalSGDConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9))
    key = jax.random.key(0)
    names = list(params)
    combos = list(itertools.product(*params.values()))
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{datetime.datetime.now().isoformat(timespec='minutes')}, jax {jax.__version__}", flush=True)
    print(f"FedCBO sweep of {' x '.join(f'{k} ({len(v)})' for k, v in params.items())} = {len(combos)} points, "
          f"N={n}, M={cfg.M}, {rounds} rounds", flush=True)

    sweep_alg = fl.fedcbo(model, cfg, n)

    def sweep():
        res = fl.run(sweep_alg, data, rounds, key, params=params, every=rounds, progress=False)
        leaves = _leaves(res.state.params)
        return [[leaf[np.unravel_index(p, res.summary["sweep"]["shape"])] for leaf in leaves]
                for p in range(len(combos))]

    def point_config(combo):
        c = cfg
        for name, value in zip(names, combo):
            if name == "local.lr":
                c = dataclasses.replace(c, local=dataclasses.replace(c.local, lr=value))
            else:
                c = dataclasses.replace(c, **{name: value})
        return c

    loop_algs = [fl.fedcbo(model, point_config(c), n) for c in combos]

    def loop():
        return [_leaves(fl.run(alg, data, rounds, key, every=rounds, progress=False).state.params) for alg in loop_algs]

    times = {}
    for name, fn in (("sweep_cold", sweep), ("loop_cold", loop), ("sweep_warm", sweep), ("loop_warm", loop)):
        t = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t
        print(f"{name:>10}: {times[name]:8.2f} s", flush=True)
        if name == "sweep_cold":
            swept = out
        elif name == "loop_cold":
            looped = out
    diff = max(float(np.max(np.abs(a - b))) for s, lo in zip(swept, looped) for a, b in zip(s, lo))
    summary = {"points": len(combos), "max_abs_diff": diff,
               "speedup_vs_loop": round(times["loop_cold"] / times["sweep_cold"], 2),
               "speedup_warm": round(times["loop_warm"] / times["sweep_warm"], 2),
               "seconds": {k: round(v, 2) for k, v in times.items()}, "agents": n, "rounds": rounds,
               "grid": {k: list(v) for k, v in params.items()}, "environment": environment()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("points", "max_abs_diff", "speedup_vs_loop", "speedup_warm")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
