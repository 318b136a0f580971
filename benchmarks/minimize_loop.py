"""A Python loop of ``cj.minimize`` calls: how much the reuse of earlier calls' dynamics saves.

``cj.minimize`` keeps the dynamics of its last eight distinct (objective, structure of the
settings) calls and passes each call's numbers (λ1, σ1, λ2, σ2, dt, the α schedule's) as
traced parameters, so a loop over seeds, or over σ1 and α, compiles its programs once. This
script times the same loop with that reuse (A) and with it turned off (B, every call builds
new dynamics and compiles again), alternating A and B after one warm-up call, in one process:

    python benchmarks/minimize_loop.py                  # 10 calls over seeds per loop, 3 pairs
    python benchmarks/minimize_loop.py --vary numbers   # call i: sigma1 = 0.5 + 0.1 i, alpha = 10 (i + 1)
    python benchmarks/minimize_loop.py --calls 20 --pairs 5 --json out.json

The last line of stdout is one JSON object: the loop times and the median B/A ratio.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.provenance import environment


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10, help="minimize calls per loop, one seed each (default 10)")
    ap.add_argument("--pairs", type=int, default=3, help="A/B pairs (default 3)")
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--vary", choices=["seed", "numbers"], default="seed",
                    help="what changes from call to call: the seed (default), or sigma1 and alpha (seed 0)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON object to PATH")
    args = ap.parse_args(argv)
    sim = importlib.import_module("cbo_jax.minimize")  # the module; cbo_jax.minimize is also the function
    size = sim._MINIMIZE_CACHE_SIZE
    f = cj.objectives.Rastrigin()

    def loop(reuse: bool) -> float:
        sim._MINIMIZE_DYNAMICS.clear()  # each loop starts as a fresh process's would
        sim._MINIMIZE_CACHE_SIZE = size if reuse else 0
        t0 = time.perf_counter()
        for i in range(args.calls):
            kw = dict(key=i, alpha=30.0) if args.vary == "seed" else dict(key=0, sigma1=0.5 + 0.1 * i,
                                                                          alpha=10.0 * (i + 1))
            cj.minimize(f, dim=args.dim, num_steps=args.steps, **kw).state.x.block_until_ready()
        return time.perf_counter() - t0

    cj.minimize(f, dim=args.dim, key=0, num_steps=args.steps, alpha=30.0)  # warm-up: imports, the x0 draw
    a, b = [], []
    for pair in range(args.pairs):
        a.append(loop(True))
        b.append(loop(False))
        print(f"pair {pair + 1}: reuse {a[-1]:.2f} s, no reuse {b[-1]:.2f} s, ratio {b[-1] / a[-1]:.2f}", flush=True)
    sim._MINIMIZE_CACHE_SIZE = size
    out = {"calls": args.calls, "vary": args.vary, "dim": args.dim, "steps": args.steps, "particles": 100,
           "reuse_seconds": a, "no_reuse_seconds": b,
           "median_ratio_no_reuse_over_reuse": float(np.median(np.asarray(b) / np.asarray(a))),
           "load_average": os.getloadavg(), "environment": environment()}
    line = json.dumps(out)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
