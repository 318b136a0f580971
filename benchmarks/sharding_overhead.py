"""Cost of sharding the agent axis over 8 simulated CPU devices vs 1 device.  Issue 7.

Same total work in both columns: the same population (N agents) and steps, once on
one device and once split over an 8-device mesh (``simulate(..., mesh=agent_mesh())``,
N a multiple of 8, so no padding). The 8 "devices" are XLA host devices
(``--xla_force_host_platform_device_count=8``) that share this machine's cores, so a
ratio near 1 means the partitioning and the cross-device all-reduce of the consensus
cost little; it cannot show a speedup on 2 cores. Timed round-robin (each variant once
per cycle, ``--repeats`` cycles, best kept), compile excluded.

Systems: standard CBO (Rastrigin d=20, anisotropic, N=1e4 by default) and the
clustered system of benchmarks/clustered_scaling.py (K=4, d=10).

    python benchmarks/sharding_overhead.py [--n 10000] [--steps 200] [--repeats 5]

Last line: JSON with "overhead_ratio" (sharded time / single-device time, CBO) and the
clustered system's ratio.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax import objectives, schedules, sharding  # noqa: E402
from cbo_jax.dynamics.clustered import ClusteredConfig, clustered, particles  # noqa: E402
from cbo_jax.runtime.provenance import environment  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="agents (multiple of 8; default 1e4)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rng", default="partitionable", choices=["fast", "partitionable", "per-particle"],
                    help="noise layout for both columns (default partitionable: the one that shards)")
    args = ap.parse_args(argv)
    if args.n % 8:
        raise SystemExit("--n must be a multiple of 8 (equal work, no padding)")
    mesh = sharding.agent_mesh()
    alpha = schedules.Multiplicative(30.0, 1.05, 1e5)
    cbo_dyn = cj.cbo(objectives.Rastrigin(), cj.CBOConfig(sigma1=10.1, alpha=alpha, rng=args.rng))
    x_cbo = np.random.default_rng(0).uniform(-3, 3, (args.n, 20)).astype(np.float32)
    centers = np.random.default_rng(1).uniform(-2, 2, (4, 10))
    cl_dyn = clustered([objectives.Rastrigin(shift=c) for c in centers],
                       ClusteredConfig(sigma1=10.1, noise="anisotropic", alpha=alpha, rng=args.rng))
    p = particles(np.random.default_rng(2).uniform(-3, 3, (args.n, 10)).astype(np.float32), np.arange(args.n) % 4)
    variants = {
        ("cbo", "1 device"): lambda: cj.simulate(cbo_dyn, x_cbo, jax.random.key(0), args.steps, chunk_size=args.steps),
        ("cbo", "8 devices"): lambda: cj.simulate(cbo_dyn, x_cbo, jax.random.key(0), args.steps,
                                                  chunk_size=args.steps, mesh=mesh),
        ("clustered", "1 device"): lambda: cj.simulate(cl_dyn, p, jax.random.key(0), args.steps, chunk_size=args.steps),
        ("clustered", "8 devices"): lambda: cj.simulate(cl_dyn, p, jax.random.key(0), args.steps,
                                                        chunk_size=args.steps, mesh=mesh),
    }
    for f in variants.values():  # compile
        jax.block_until_ready(f().state)
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, f in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f().state)
            times[k].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    ratio = {s: best[(s, "8 devices")] / best[(s, "1 device")] for s in ("cbo", "clustered")}
    print(f"N={args.n}, {args.steps} steps, rng={args.rng}, {jax.device_count()} host devices, "
          f"{os.cpu_count()} cores", file=sys.stderr)
    print("| system | 1 device (ms/step) | 8 devices (ms/step) | overhead ratio |")
    print("|---|---:|---:|---:|")
    for s in ("cbo", "clustered"):
        print(f"| {s} | {1e3 * best[(s, '1 device')] / args.steps:.3f} | "
              f"{1e3 * best[(s, '8 devices')] / args.steps:.3f} | {ratio[s]:.2f} |")
    out = {"overhead_ratio": ratio["cbo"], "clustered_overhead_ratio": ratio["clustered"], "N": args.n,
           "steps": args.steps, "rng": args.rng, "devices": jax.device_count(), "cores": os.cpu_count(),
           "seconds": {f"{s}/{d}": v for (s, d), v in times.items()}, "environment": environment()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
