"""The library's CBO step beside a plain scan of the same mathematics and the memory bandwidth bound.  Issue 59.

On the current backend, in one run, for each N (d = 20, float32, CBO on Rastrigin with the
README's CBXpy settings: anisotropic noise σ1 = 10.1, λ1 = 1, dt = 0.01, α0 = 30 times 1.05
per step up to 1e5):

* ``bandwidth``: ``y = a·x + b`` over a ``--bw-mb`` array (GB/s, read + write). A step that
  reads the particles twice (the consensus, then the move) and writes them once moves
  ``3 · 4 · d`` bytes per particle, so the bound is ``GB/s / (12 d)`` particle-steps/s.
* ``plain``: a ``lax.scan`` of the step written out in a few lines (the Gibbs mean, then
  ``x - λ dt (x - m) + σ √dt |x - m| z``; fixed α, no best-tracking, no history, JAX's
  ``"fast"`` normals).
* ``library``: ``cbo_jax.simulate`` with the defaults (``rng="counter"``, a step in blocks
  above 2^16 particles, best-tracking, the α schedule, the per-step history).

Rates are particle-steps per second, best of ``--repeats`` timed runs of ``--steps`` steps
after a compiling warm-up. ``--only library`` times the library alone (for an A/B of two
checkouts: ``PYTHONPATH=<checkout> python benchmarks/step_speed.py --only library``).

    python benchmarks/step_speed.py                         # N = 1e5, 1e6 on the CPU
    python benchmarks/step_speed.py --sizes 1e6,1e7,1e8     # a GPU

Last line: ``{"backend": ..., "device": ..., "bandwidth_gbs": ..., "rows": [{"n", "plain",
"library", "bound", "library_over_plain", "library_over_bound"}, ...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cbo_jax as cj  # noqa: E402
from profile_cbo_step import ALPHA0, ALPHA_FACTOR, ALPHA_MAX, DT, LAMBDA, SIGMA  # noqa: E402

D = 20


def _best(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth_gbs(mb: int, repeats: int) -> float:
    """GB/s of ``y = a·x + b`` over ``mb`` MB of float32 (one read, one write per element)."""
    n = mb * 2**20 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda x: 1.0001 * x + 0.5)
    sec = _best(lambda: f(x), repeats)
    return 2 * n * 4 / sec / 1e9


def _x0(n: int):
    fill = jax.jit(lambda k: jax.random.uniform(k, (n, D), jnp.float32, -3.0, 3.0))
    return fill(jax.random.key(0))


def plain(n: int, steps: int, repeats: int) -> float:
    """Particle-steps/s of a plain scan of the CBO step (fixed α)."""
    f = cj.objectives.Rastrigin()
    alpha, lam, sig, dt = 30.0, LAMBDA, SIGMA, DT

    @functools.partial(jax.jit, donate_argnums=(0,))
    def run(x, key):
        def step(x, k):
            e = f(x)
            w = jnp.exp(-alpha * (e - jnp.min(e)))
            m = (w @ x) / jnp.sum(w)
            u = x - m
            z = jax.random.normal(k, x.shape, x.dtype)
            return x - (lam * dt) * u + (sig * np.sqrt(dt)) * jnp.abs(u) * z, None

        return jax.lax.scan(step, x, jax.random.split(key, steps))[0]

    x = [_x0(n)]

    def go():
        x[0] = run(x[0], jax.random.key(1))
        return x[0]

    return n * steps / _best(go, repeats)


def library(n: int, steps: int, repeats: int) -> float:
    """Particle-steps/s of ``cbo_jax.simulate`` with the default config and the README's numbers."""
    dyn = cj.cbo(cj.objectives.Rastrigin(), lambda1=LAMBDA, sigma1=SIGMA, dt=DT,
                 alpha=cj.schedules.Multiplicative(ALPHA0, ALPHA_FACTOR, ALPHA_MAX))
    x0 = np.asarray(_x0(n))
    return n * steps / _best(lambda: cj.simulate(dyn, x0, 1, steps).state.x, repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6", help="comma-separated N (default 1e5,1e6)")
    ap.add_argument("--steps", type=int, default=50, help="steps per timed run (default 50)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the best counts (default 3)")
    ap.add_argument("--bw-mb", type=int, default=512, help="MB of the bandwidth array (default 512)")
    ap.add_argument("--only", choices=("all", "library"), default="all", help="time the library alone")
    ap.add_argument("--json", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    out = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "dim": D,
           "steps": args.steps, "rows": []}
    bw = None if args.only == "library" else bandwidth_gbs(args.bw_mb, args.repeats)
    out["bandwidth_gbs"] = bw
    if bw is not None:
        print(f"bandwidth {bw:.1f} GB/s: bound {bw * 1e9 / (12 * D) / 1e6:.0f} M particle-steps/s", flush=True)
    for n in sizes:
        row = {"n": n, "library": library(n, args.steps, args.repeats)}
        if args.only == "all":
            row["plain"] = plain(n, args.steps, args.repeats)
            row["bound"] = bw * 1e9 / (12 * D)
            row["library_over_plain"] = row["library"] / row["plain"]
            row["library_over_bound"] = row["library"] / row["bound"]
        out["rows"].append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        from cbo_jax.runtime.provenance import environment

        with open(args.json, "w") as f:
            json.dump({**out, "environment": environment()}, f, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
