"""A parameter sweep as one vmapped program against a Python loop over ``simulate``.  Issue 14.

System: CBO on Rastrigin (CBXpy's un-normalised form), anisotropic consensus noise,
λ1 = 1, α0 multiplied by 1.05 per step up to 1e5, x0 ~ U[-3, 3]^d, float64. The grid is
the outer product of σ1 × α0 × dt, each point with ``--seeds`` independent runs; every
point starts from the same x0 and run keys. ``--quick``: σ1 = 0.2 .. 1.4 (8 values, the
concentrating regime σ1² < 2λ1 of anisotropic CBO), α0 = 10, 30, 100, 300, dt = 0.01,
0.02: 64 points, N = 40, d = 2, 100 steps. Without ``--quick``: σ1 = 0.2 .. 1.4 (16) ×
α0 = 10 .. 1000 (8) × dt (2) = 256 points, d = 10, 200 steps.

Why the regime matters for ``max_abs_diff``: XLA:CPU's row reductions (the objective's
sum over d, the log-sum-exp over N) are not bitwise invariant to the batch shape, so the
vmapped program and a single point's program differ by about 4e-16 after one step. Where
the dynamics are chaotic (σ1 above √(2λ1), or α growing large while the particles are
still spread, when the consensus flips between near-tied particles) that difference grows
to O(1) and the runs agree only in distribution. ``--sigma-max`` widens the σ1 range to
show it.

Three ways to run the same grid, all timed warm (each is run once first, so compilation
is excluded for all of them):

* **vmapped**: ``cj.simulate(dyn, x0, key, T, num_runs=M, params=grid)``, one jitted
  program for grid × seeds;
* **loop**: a Python loop over the grid points, ``cj.simulate(dyn, x0, key, T,
  num_runs=M, params=point)`` (the same compiled step for every point);
* **config loop** (``--config-loop``): a Python loop over dynamics built the ordinary
  way, ``cj.cbo(f, CBOConfig(sigma1=..., alpha=..., dt=...))`` per point (each compiled
  once in the warm-up pass, which therefore takes one compilation per point).

``max_abs_diff`` is the largest difference of the final particles between the vmapped
run and either loop (float64; pass <= 1e-10); ``speedup_vs_loop`` the loop's time over
the vmapped program's, measured in the same process (pass >= 3).

    python benchmarks/param_sweep.py --quick      # 64 points x 4 seeds, N = 40, d = 2, 100 steps
    python benchmarks/param_sweep.py              # 256 points x 4 seeds, d = 10, 200 steps

Last line: one JSON object with "points", "max_abs_diff" and "speedup_vs_loop".
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax import objectives, schedules  # noqa: E402
from cbo_jax import params as P  # noqa: E402
from cbo_jax.runtime.provenance import environment  # noqa: E402

FACTOR, ALPHA_MAX = 1.05, 1e5


def config(sigma1: float, alpha0: float, dt: float) -> cj.CBOConfig:
    return cj.CBOConfig(lambda1=1.0, sigma1=sigma1, dt=dt, noise="anisotropic", dtype="float64",
                        alpha=schedules.Multiplicative(alpha0, FACTOR, ALPHA_MAX))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 points (8 x 4 x 2), d = 2, 100 steps")
    ap.add_argument("--particles", "-N", type=int, default=40)
    ap.add_argument("--dim", type=int, default=None, help="default 2 with --quick, else 10")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None, help="default 100 with --quick, else 200")
    ap.add_argument("--sigma-max", type=float, default=1.4, help="largest σ1 of the grid (default 1.4)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each way; the best is kept (default 3)")
    ap.add_argument("--json", default=None, help="also write the summary to this file")
    ap.add_argument("--config-loop", action="store_true",
                    help="also time a loop over separately built dynamics (compiles once per point: minutes)")
    args = ap.parse_args(argv)
    if args.quick:
        sigma1s, alpha0s, dts = np.linspace(0.2, args.sigma_max, 8), [10.0, 30.0, 100.0, 300.0], [0.01, 0.02]
    else:
        sigma1s = np.linspace(0.2, args.sigma_max, 16)
        alpha0s, dts = [10.0, 20.0, 30.0, 50.0, 100.0, 200.0, 300.0, 1e3], [0.01, 0.02]
    steps = args.steps or (100 if args.quick else 200)
    args.dim = args.dim or (2 if args.quick else 10)
    n, d, m = args.particles, args.dim, args.seeds
    dyn = cj.cbo(objectives.Rastrigin(), config(sigma1s[0], alpha0s[0], dts[0]))
    grid = P.grid(dyn, sigma1=sigma1s, alpha0=alpha0s, dt=dts)
    shape = P.grid_shape(grid)
    points = int(np.prod(shape))
    x0 = np.random.default_rng(0).uniform(-3.0, 3.0, (m, n, d))
    key = jax.random.key(1)
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{datetime.datetime.now().isoformat(timespec='minutes')}, jax {jax.__version__}", flush=True)
    print(f"grid {shape} = {points} points x {m} seeds, N={n}, d={d}, {steps} steps, float64", flush=True)

    def vmapped():
        return np.asarray(cj.simulate(dyn, x0, key, steps, num_runs=m, params=grid, chunk_size=steps).state.x)

    index = list(itertools.product(*(range(s) for s in shape)))

    def loop():
        out = np.empty(shape + (m, n, d))
        for idx in index:
            out[idx] = np.asarray(cj.simulate(dyn, x0, key, steps, num_runs=m, params=P.point(grid, idx),
                                              chunk_size=steps).state.x)
        return out

    built = {idx: cj.cbo(objectives.Rastrigin(), config(sigma1s[idx[0]], alpha0s[idx[1]], dts[idx[2]]))
             for idx in index} if args.config_loop else {}

    def config_loop():
        out = np.empty(shape + (m, n, d))
        for idx in index:
            out[idx] = np.asarray(cj.simulate(built[idx], x0, key, steps, num_runs=m, chunk_size=steps).state.x)
        return out

    ways = {"vmapped": vmapped, "loop": loop}
    if args.config_loop:
        ways["config_loop"] = config_loop
    results, seconds = {}, {}
    for name, fn in ways.items():
        t0 = time.perf_counter()
        results[name] = fn()  # warm-up: compiles
        print(f"{name}: warm-up (compilation included) {time.perf_counter() - t0:.2f} s", flush=True)
    for _ in range(args.repeats):  # interleaved, so that load changes hit every way alike
        for name, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            seconds[name] = min(seconds.get(name, np.inf), time.perf_counter() - t0)
    for name in ways:
        print(f"{name}: {seconds[name]:.3f} s (best of {args.repeats}, warm)", flush=True)
    diffs = {name: float(np.max(np.abs(results[name] - results["vmapped"]))) for name in ways if name != "vmapped"}
    print(f"max |x_vmapped - x_loop| = {diffs}", flush=True)
    summary = {
        "points": points,
        "grid": list(shape),
        "seeds": m, "particles": n, "dim": d, "steps": steps, "dtype": "float64",
        "vmapped_seconds": round(seconds["vmapped"], 4),
        "loop_seconds": round(seconds["loop"], 4),
        "max_abs_diff": max(diffs.values()),
        "speedup_vs_loop": round(seconds["loop"] / seconds["vmapped"], 2),
    }
    if "config_loop" in seconds:
        summary["config_loop_seconds"] = round(seconds["config_loop"], 4)
        summary["speedup_vs_config_loop"] = round(seconds["config_loop"] / seconds["vmapped"], 2)
    summary["load"] = round(os.getloadavg()[0], 2)
    summary["environment"] = environment()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
