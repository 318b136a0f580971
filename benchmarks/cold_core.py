"""How a short cbo_jax run is slowed by the idle time before it (the "cold core" effect).

The interleaved benchmarks (cbx_family.py, cbo_throughput.py --interleaved) time a
single-threaded NumPy peer, then a cbo_jax run on both cores. This script measures what
the idle second core costs the cbo_jax run that follows, and what an untimed warm-up
(benchmarks/_warm.py) buys back.

Part 1, idle: sleep S seconds, then time 10 consecutive short runs (``--steps`` steps of
the same compiled ``cbo`` step, N = 10⁴, d = 20, float32), in ms each. On a machine
without the effect every row is flat.

Part 2, the benchmark's situation: 0.6 s of single-threaded busy work (as CBXpy's run
leaves the machine), then one timed run: with no warm-up, after 100 ms of unrelated JAX
work (a 1000 × 1000 matmul), and after 100 ms of the same cbo_jax run. Rates in
M particle-steps/s, ``--rounds`` rounds, the three modes interleaved.

    python benchmarks/cold_core.py --json benchmarks/cold_core.json

The last line of stdout is one JSON object with both parts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax.provenance import environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _warm  # noqa: E402

N, D = 10_000, 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="steps per run in part 1 (default 10)")
    ap.add_argument("--steps2", type=int, default=60, help="steps per run in part 2 (default 60, as cbx_family --quick)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of part 2 (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON object to PATH")
    args = ap.parse_args(argv)

    x0 = np.random.default_rng(0).uniform(-3.0, 3.0, (N, D)).astype(np.float32)
    dyn = cj.cbo(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=1.0, dt=0.01, alpha=30.0, noise="anisotropic")

    def run(steps, seed=0):
        return cj.simulate(dyn, x0, jax.random.key(seed), steps, chunk_size=steps).state

    for steps in (args.steps, args.steps2):
        jax.block_until_ready(run(steps))

    idle = {}
    for s in (0.0, 0.05, 0.2, 0.6, 2.0):
        rows = []
        for _ in range(2):
            time.sleep(s)
            ms = []
            for i in range(10):
                t0 = time.perf_counter()
                jax.block_until_ready(run(args.steps, i))
                ms.append((time.perf_counter() - t0) * 1e3)
            rows.append(ms)
            print(f"idle {s:4.2f} s, then 10 runs (ms): " + " ".join(f"{t:5.1f}" for t in ms), flush=True)
        idle[str(s)] = rows

    a = jnp.ones((1000, 1000), jnp.float32)
    matmul = jax.jit(lambda m: m @ m)
    jax.block_until_ready(matmul(a))
    modes = {"none": None, "other_jax_work": lambda: matmul(a), "same_run": lambda: run(args.steps2)}
    rates = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode, work in modes.items():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.6:  # single-threaded, like the NumPy peer's run
                pass
            if work is not None:
                _warm.warm_jax(0.1, work)
            t0 = time.perf_counter()
            jax.block_until_ready(run(args.steps2, 100 + r))
            rates[mode].append(N * args.steps2 / (time.perf_counter() - t0) / 1e6)
    for mode, v in rates.items():
        print(f"after 0.6 s single-threaded, warm-up {mode:15s}: median {np.median(v):5.2f} M/s  "
              + " ".join(f"{x:.2f}" for x in v))
    out = {
        "idle_then_runs_ms": idle,
        "steps_part1": args.steps,
        "after_single_threaded_busy": {m: {"rates_M_per_s": v, "median": float(np.median(v))} for m, v in rates.items()},
        "steps_part2": args.steps2,
        "N": N, "d": D,
        "jax_version": jax.__version__,
        "load_average": os.getloadavg(),
        "date": datetime.date.today().isoformat(),
        "environment": environment(),
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
