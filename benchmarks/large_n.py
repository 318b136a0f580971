"""Large N on one CPU: CBO with up to 1e8 particles in d = 10, float32, memory measured.  Issues 14, 59.

System: CBO on Rastrigin (CBXpy's un-normalised form) in d = 10, anisotropic consensus
noise σ1 = 10.1, λ1 = 1, dt = 0.01, α0 = 30 multiplied by 1.05 per step up to 1e5 (CBXpy's
Rastrigin settings), x0 ~ U[-3, 3]^d, float32, the default noise layout (``"counter"``).

Each size runs in its own child process, so its peak resident memory (``VmHWM`` from
``/proc/self/status``, the high-water mark of the whole process: JAX runtime, the initial
population and the simulation) is its own. The child fills ``x0`` on the device block by
block, in place (one draw of 1e9 uniforms would hold its bits beside it), hands it to
``cbo_jax.simulate`` with ``donate=True`` (the state is made in its buffers: no second copy of
the population), runs a 10-step warm-up (compiling the 10-step scan) and continues from its
state for the timed ``--steps`` steps in chunks of 10 (the same compiled scan; compilation
excluded). Particles per step and second = N · steps / seconds.

A step of more than 2**17 particles runs in blocks chosen from N (``particle_chunk`` unset:
:func:`cbo_jax.dynamics.core.auto_block_rows`), so besides the particles it holds one block's
temporaries; ``--chunk C`` sets the rows per block instead. ``--probe 3e8`` adds sizes run for
``--probe-steps`` steps only (memory rows; they do not count for ``largest_n``).

    python benchmarks/large_n.py                              # N = 1e5, 1e6, 1e7; 100 steps each
    python benchmarks/large_n.py --sizes 1e8 --steps 20       # the 1e8 row (about 4 GB of particles)
    python benchmarks/large_n.py --sizes 1e9 --steps 20 --accelerator   # a GPU: 40 GB of particles

Last line: ``{"largest_n": ..., "dim": 10, "dtype": "float32", "steps": ..., "peak_rss_gb": ...,
"particle_steps_per_s": ...}`` for the largest N that ran all ``--steps`` steps (issue 59's bar:
largest_n >= 1e8 with peak_rss_gb <= 7 on the project's 24 GB CPU).
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
    import functools

    import jax
    import jax.numpy as jnp

    import cbo_jax as cj
    from cbo_jax import objectives, schedules
    from cbo_jax.dynamics import core

    base = _mem_gb()["VmRSS"]
    rows = min(n, 1_000_000)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def fill(x, key):  # U[-3, 3] block by block, in place
        def body(c, x):
            start = jnp.minimum(c * rows, n - rows)
            block = jax.random.uniform(jax.random.fold_in(key, c), (rows, D), jnp.float32, -3.0, 3.0)
            return jax.lax.dynamic_update_slice_in_dim(x, block, start, axis=0)
        return jax.lax.fori_loop(0, -(-n // rows), body, x)

    x0 = fill(jnp.zeros((n, D), jnp.float32), jax.random.key(seed))
    x0.block_until_ready()
    cfg = cj.CBOConfig(lambda1=LAMBDA, sigma1=SIGMA, dt=DT, noise="anisotropic",
                       alpha=schedules.Multiplicative(ALPHA0, FACTOR, ALPHA_MAX), particle_chunk=chunk)
    dyn = cj.cbo(objectives.Rastrigin(), cfg)
    block = core.Engine(objectives.Rastrigin(), cfg, core.Kernel("cbo", move=None)).block_rows(n)
    t0 = time.perf_counter()
    warm_res = cj.simulate(dyn, x0, jax.random.key(seed + 1), WARMUP, chunk_size=CHUNK_STEPS, donate=True)
    warm = time.perf_counter() - t0
    del x0
    res = cj.simulate(dyn, None, None, steps, chunk_size=CHUNK_STEPS, progress=True, desc=f"N={n:.0e}",
                      initial_state=warm_res.state, donate=True)
    del warm_res
    mem = _mem_gb()
    best = float(res.state.best_energy)
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    device = {} if not stats or "peak_bytes_in_use" not in stats else {
        "peak_device_gb": round(stats["peak_bytes_in_use"] / 1e9, 3), "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind}
    return {**device,
        "n": n, "dim": D, "dtype": "float32", "steps": res.steps, "particle_chunk": chunk, "block_rows": block,
        "seconds": round(res.seconds, 2), "warmup_seconds_incl_compile": round(warm, 2),
        "particle_steps_per_s": n * res.steps / res.seconds,
        "peak_rss_gb": round(mem["VmHWM"], 3), "baseline_rss_gb": round(base, 3),
        "x_gb": round(n * D * 4 / 1e9, 3), "best_energy": best,
    }


def run_child(n: int, steps: int, chunk: int | None, seed: int, accelerator: bool = False) -> dict | None:
    cmd = [sys.executable, __file__, "--child", str(n), "--steps", str(steps), "--seed", str(seed),
           "--chunk", str(chunk or 0)]
    env = dict(os.environ) if accelerator else dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        print(f"N={n:.0e} chunk={chunk}: child failed with code {proc.returncode} (out of memory?)", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated N (default 1e5,1e6,1e7)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per size (default 100)")
    ap.add_argument("--chunk", type=float, default=0,
                    help="particle_chunk (rows per block) for sizes above it (default 0: chosen from N)")
    ap.add_argument("--unchunked", action="store_true", help="also run every size with --chunk's setting left out")
    ap.add_argument("--probe", default="", help="extra sizes for memory rows only (comma-separated)")
    ap.add_argument("--probe-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write all rows to this file")
    ap.add_argument("--accelerator", action="store_true",
                    help="run on JAX's default backend (a GPU: rows add peak_device_gb) instead of the CPU")
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
        return chunk if chunk and n > chunk else None

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
        row = run_child(n, steps, c, args.seed, args.accelerator)
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
                      "peak_rss_gb": top["peak_rss_gb"], "peak_device_gb": top.get("peak_device_gb"),
                      "particle_steps_per_s": round(top["particle_steps_per_s"]),
                      "particle_chunk": top["particle_chunk"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
