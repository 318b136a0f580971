"""Throughput of the clustered particle system (FedCBO eq. (4)), K=4, d=10.  Issue 4.

System: K = 4 shifted Rastrigin objectives (CBXpy's un-normalised form) in d = 10,
anisotropic consensus noise σ1 = 10.1, λ1 = 1, dt = 0.01, α0 = 30 multiplied by 1.05
per step up to 1e5, x0 ~ U[-3, 3]^d, labels round-robin. Every step evaluates all K
losses of every particle (the consensus points m_k run over ALL particles), forms
the K x N log-weights, contracts them with the population and moves every particle
toward its own class's m_k.

Metric: particle-steps per second = N * steps / seconds of
``cbo_jax.simulate(dyn, p, key, steps, chunk_size=steps)`` + block_until_ready,
after a warm-up call that compiles the same scan (compile time excluded).

Peer in the same run: the same step written directly in vectorised NumPy
(``numpy_step`` below: ``(K, N)`` losses, log-sum-exp weights, one ``(K, N) @ (N, d)``
product, ``default_rng().standard_normal`` noise), float32, timed on the same sizes
(fewer steps at large N). The two are timed back to back for each N, and the ratio
of the two rates is the reported speedup; the machine is shared and noisy, so only
the ratio is meaningful across runs.

    python benchmarks/clustered_scaling.py                  # N = 1e3 .. 1e6 (CPU)
    python benchmarks/clustered_scaling.py --sizes 1e3,1e4  # quick
    python benchmarks/clustered_scaling.py --sizes 1e5,1e6,1e7 --numpy-max-n 1e6   # GPU

Last line: one JSON object with "particle_steps_per_s" at the largest N.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import jax
import numpy as np

import cbo_jax as cj
from cbo_jax import objectives, schedules
from cbo_jax.dynamics.clustered import ClusteredConfig, clustered, particles
from cbo_jax.runtime.provenance import describe, environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _malloc  # noqa: E402
import _progress  # noqa: E402

K, D = 4, 10
SIGMA, LAMBDA, DT, ALPHA0, FACTOR, ALPHA_MAX = 10.1, 1.0, 0.01, 30.0, 1.05, 1e5


def steps_for(n: int) -> int:
    """About 1e6 to 2e7 particle-steps per timed call."""
    return int(min(1000, max(10, 2e7 // n if n >= 1e5 else 2e6 // n)))


def make_system(seed: int = 0):
    centers = np.random.default_rng(seed).uniform(-2.0, 2.0, (K, D))
    cfg = ClusteredConfig(lambda1=LAMBDA, sigma1=SIGMA, dt=DT, noise="anisotropic",
                          alpha=schedules.Multiplicative(ALPHA0, FACTOR, ALPHA_MAX))
    return centers, clustered([objectives.Rastrigin(shift=c) for c in centers], cfg)


def time_cbo_jax(dyn, x0: np.ndarray, steps: int, repeats: int) -> dict:
    p = particles(x0, np.arange(x0.shape[0]) % K)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    jax.block_until_ready(cj.simulate(dyn, p, key, steps, chunk_size=steps).state)
    warm = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        res = cj.simulate(dyn, p, jax.random.key(r + 1), steps, chunk_size=steps)
        jax.block_until_ready(res.state)
        times.append(time.perf_counter() - t0)
    return {"seconds_all": times, "warmup_seconds_incl_compile": warm,
            "particle_steps_per_s": x0.shape[0] * steps / min(times)}


def _rastrigin(z):
    return 10.0 * z.shape[-1] + np.sum(z * z - 10.0 * np.cos(2 * np.pi * z), axis=-1)


def numpy_step(x, label, centers, alpha, rng):
    """One step of the same clustered system in vectorised NumPy (float32)."""
    loss = np.stack([_rastrigin(x - c) for c in centers])  # (K, N)
    logw = -alpha[:, None] * (loss - loss.min(axis=1, keepdims=True))
    w = np.exp(logw)
    w /= w.sum(axis=1, keepdims=True)
    m = w @ x  # (K, d)
    u = x - m[label]
    x = x - (LAMBDA * DT) * u + (SIGMA * np.sqrt(DT)) * u * rng.standard_normal(x.shape, dtype=x.dtype)
    return x, np.minimum(alpha * FACTOR, ALPHA_MAX).astype(alpha.dtype)


def time_numpy(centers, x0: np.ndarray, steps: int, repeats: int) -> dict:
    label = np.arange(x0.shape[0]) % K
    c32 = centers.astype(np.float32)
    times = []
    for r in range(repeats):
        rng = np.random.default_rng(r)
        x, alpha = x0.astype(np.float32), np.full(K, ALPHA0, np.float32)
        t0 = time.perf_counter()
        for _ in range(steps):
            x, alpha = numpy_step(x, label, c32, alpha, rng)
        times.append(time.perf_counter() - t0)
    return {"seconds_all": times, "particle_steps_per_s": x0.shape[0] * steps / min(times), "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="comma-separated N (default 1e3,1e4,1e5,1e6)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per N (default 3, best kept)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy peer")
    ap.add_argument("--numpy-max-n", type=float, default=None, metavar="N",
                    help="time the NumPy peer only at sizes <= N (default: every size)")
    ap.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    _malloc.add_argument(ap, peer="the NumPy peer")
    _progress.add_argument(ap)
    args = ap.parse_args(argv)
    malloc = _malloc.apply(args.malloc)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    if min(sizes) < K or args.repeats < 1:
        raise SystemExit(f"every N must be >= K={K} and --repeats >= 1")
    centers, dyn = make_system()
    rows = []
    t_start = time.perf_counter()
    for n in sizes:
        x0 = np.random.default_rng(n).uniform(-3.0, 3.0, (n, D)).astype(np.float32)
        steps = steps_for(n)
        row = {"N": n, "steps": steps, "cbo_jax": time_cbo_jax(dyn, x0, steps, args.repeats)}
        msg = f"N={n:>9,d}: cbo_jax {row['cbo_jax']['particle_steps_per_s'] / 1e6:8.3f} M particle-steps/s"
        if not args.no_numpy and (args.numpy_max_n is None or n <= args.numpy_max_n):
            np_steps = max(5, steps // 4)
            row["numpy"] = time_numpy(centers, x0, np_steps, max(1, args.repeats - 1))
            row["speedup_vs_numpy"] = row["cbo_jax"]["particle_steps_per_s"] / row["numpy"]["particle_steps_per_s"]
            msg += (f" | NumPy {row['numpy']['particle_steps_per_s'] / 1e6:7.3f} M/s"
                    f" | {row['speedup_vs_numpy']:.2f}x")
        print(msg, file=sys.stderr, flush=True)
        rows.append(row)
        _progress.append(args.progress, row)

    print(f"\nclustered system K={K}, d={D}, {jax.devices()[0].device_kind} ({jax.default_backend()}), float32")
    print("| N | steps | cbo_jax (M particle-steps/s) | NumPy float32 (M/s) | speedup |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        npv = f"{r['numpy']['particle_steps_per_s'] / 1e6:.3f}" if "numpy" in r else "-"
        sp = f"{r['speedup_vs_numpy']:.2f}x" if "speedup_vs_numpy" in r else "-"
        print(f"| {r['N']:,} | {r['steps']} | {r['cbo_jax']['particle_steps_per_s'] / 1e6:.3f} | {npv} | {sp} |")
    last = rows[-1]
    env = environment()
    out = {
        "particle_steps_per_s": last["cbo_jax"]["particle_steps_per_s"],
        "N": last["N"],
        "speedup_vs_numpy": last.get("speedup_vs_numpy"),
        "K": K, "d": D,
        "device": describe(env),
        "environment": env,
        "jax_version": jax.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "malloc": malloc,
        "rows": rows,
        "wall_seconds_total": time.perf_counter() - t_start,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
