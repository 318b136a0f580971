"""Large N on one CPU: CBO with 1e7 particles in d = 10, float32, memory measured.  Issue 14.

System: CBO on Rastrigin (CBXpy's un-normalised form) in d = 10, anisotropic consensus
noise σ1 = 10.1, λ1 = 1, dt = 0.01, α0 = 30 multiplied by 1.05 per step up to 1e5 (CBXpy's
Rastrigin settings), x0 ~ U[-3, 3]^d, float32.

Each size runs in its own child process, so its peak resident memory (``VmHWM`` from
``/proc/self/status``, the high-water mark of the whole process: JAX runtime, the initial
population and the simulation) is its own. The child fills ``x0`` chunk by chunk (a
one-shot ``rng.uniform`` of 1e8 numbers alone would peak at 1.3 GB), hands it to JAX and
frees the NumPy copy, runs a 10-step warm-up through ``cbo_jax.simulate`` (compiling the
10-step scan) and then the timed ``--steps`` steps in chunks of 10 (the same compiled
scan; compilation excluded). Particles per step and second = N · steps / seconds.

With ``--chunk C`` (default 1e6) a size above C uses ``CBOConfig(particle_chunk=C)``: the
streaming consensus and a step that moves, draws noise for and evaluates the particles
chunk by chunk on buffers updated in place, so a step needs about the memory of the
particles themselves. ``--unchunked`` also runs every size without it, for the memory
comparison. ``--probe 3e7,5e7`` adds sizes run for ``--probe-steps`` steps only (memory
rows; they do not count for ``largest_n``).

    python benchmarks/large_n.py                      # N = 1e5, 1e6, 1e7; 100 steps each
    python benchmarks/large_n.py --unchunked --probe 5e7 --probe-steps 3

Last line: ``{"largest_n": ..., "dim": 10, "dtype": "float32", "steps": ..., "peak_rss_gb": ...,
"particle_steps_per_s": ...}`` for the largest N that ran all ``--steps`` steps (pass:
largest_n >= 1e7 with peak_rss_gb < 24 on the project's 24 GB CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

D = 10
SIGMA, LAMBDA, DT, ALPHA0, FACTOR, ALPHA_MAX = 10.1, 1.0, 0.01, 30.0, 1.05, 1e5
WARMUP, CHUNK_STEPS = 10, 10


def _mem_gb() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1e6  # kB -> GB
    return out


def child(n: int, steps: int, chunk: int | None, seed: int) -> dict:
    import jax
    import numpy as np

    import cbo_jax as cj
    from cbo_jax import objectives, schedules

    base = _mem_gb()["VmRSS"]
    rng = np.random.default_rng(seed)
    x_host = np.empty((n, D), np.float32)
    step = 1_000_000
    for i in range(0, n, step):
        x_host[i:i + step] = rng.uniform(-3.0, 3.0, (min(step, n - i), D))
    x0 = jax.device_put(x_host)
    x0.block_until_ready()
    del x_host
    cfg = cj.CBOConfig(lambda1=LAMBDA, sigma1=SIGMA, dt=DT, noise="anisotropic",
                       alpha=schedules.Multiplicative(ALPHA0, FACTOR, ALPHA_MAX), particle_chunk=chunk)
    dyn = cj.cbo(objectives.Rastrigin(), cfg)
    t0 = time.perf_counter()
    cj.simulate(dyn, x0, jax.random.key(seed), WARMUP, chunk_size=CHUNK_STEPS)
    warm = time.perf_counter() - t0
    res = cj.simulate(dyn, x0, jax.random.key(seed + 1), steps, chunk_size=CHUNK_STEPS, progress=True,
                      desc=f"N={n:.0e}")
    mem = _mem_gb()
    best = float(res.state.best_energy)
    return {
        "n": n, "dim": D, "dtype": "float32", "steps": res.steps, "particle_chunk": chunk,
        "seconds": round(res.seconds, 2), "warmup_seconds_incl_compile": round(warm, 2),
        "particle_steps_per_s": n * res.steps / res.seconds,
        "peak_rss_gb": round(mem["VmHWM"], 3), "baseline_rss_gb": round(base, 3),
        "x_gb": round(n * D * 4 / 1e9, 3), "best_energy": best,
    }


def run_child(n: int, steps: int, chunk: int | None, seed: int) -> dict | None:
    cmd = [sys.executable, __file__, "--child", str(n), "--steps", str(steps), "--seed", str(seed),
           "--chunk", str(chunk or 0)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if proc.returncode != 0:
        print(f"N={n:.0e} chunk={chunk}: child failed with code {proc.returncode} (out of memory?)", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated N (default 1e5,1e6,1e7)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per size (default 100)")
    ap.add_argument("--chunk", type=float, default=1e6,
                    help="particle_chunk for sizes above it (default 1e6; 0: never chunk)")
    ap.add_argument("--unchunked", action="store_true", help="also run every size without particle_chunk")
    ap.add_argument("--probe", default="", help="extra sizes for memory rows only (comma-separated)")
    ap.add_argument("--probe-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write all rows to this file")
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        chunk = int(args.chunk) or None
        print(json.dumps(child(int(args.child), args.steps, chunk, args.seed)))
        return 0
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    probes = [int(float(s)) for s in args.probe.split(",") if s]
    chunk = int(args.chunk)

    def chunk_for(n):
        return chunk if chunk and n > chunk and n % chunk == 0 else None

    print(f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}, {datetime.datetime.now().isoformat(timespec='minutes')}", flush=True)
    rows = []
    plan = [(n, args.steps, chunk_for(n)) for n in sizes]
    if args.unchunked:
        plan += [(n, args.steps, None) for n in sizes if chunk_for(n) is not None]
    plan += [(n, args.probe_steps, chunk_for(n)) for n in probes]
    if args.unchunked:
        plan += [(n, args.probe_steps, None) for n in probes if chunk_for(n) is not None]
    for n, steps, c in plan:
        print(f"N={n:.0e}, {steps} steps, particle_chunk={c} ...", flush=True)
        row = run_child(n, steps, c, args.seed)
        if row is None:
            continue
        rows.append(row)
        print(f"  {row['particle_steps_per_s'] / 1e6:.2f} M particle-steps/s, peak RSS {row['peak_rss_gb']:.2f} GB "
              f"(particles alone {row['x_gb']:.2f} GB), best energy {row['best_energy']:.3g}", flush=True)
    print("\n| N | particle_chunk | steps | M particle-steps/s | peak RSS (GB) | x alone (GB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']:.0e} | {r['particle_chunk'] or '-'} | {r['steps']} | {r['particle_steps_per_s'] / 1e6:.2f} | "
              f"{r['peak_rss_gb']:.2f} | {r['x_gb']:.2f} |")
    if args.json:
        from cbo_jax.runtime.provenance import environment  # here: the parent process measures nothing itself

        with open(args.json, "w") as f:
            json.dump({"rows": rows, "load": os.getloadavg()[0], "environment": environment()}, f, indent=1)
    full = [r for r in rows if r["steps"] >= args.steps and r["particle_chunk"] == chunk_for(r["n"])]
    if not full:
        print(json.dumps({"largest_n": 0, "dim": D, "dtype": "float32", "steps": 0, "peak_rss_gb": None,
                          "particle_steps_per_s": None}))
        return 1
    top = max(full, key=lambda r: r["n"])
    print(json.dumps({"largest_n": top["n"], "dim": D, "dtype": "float32", "steps": top["steps"],
                      "peak_rss_gb": top["peak_rss_gb"], "particle_steps_per_s": round(top["particle_steps_per_s"]),
                      "particle_chunk": top["particle_chunk"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
