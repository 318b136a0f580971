"""CBO throughput: cbo_jax (float32 / float64) against CBXpy (float64 NumPy).  Issue 2.

Problem: standard CBO on CBXpy's un-normalised Rastrigin in d=20, one run (M=1),
anisotropic noise, sigma=10.1, lambda=1, dt=0.01, alpha0=30 multiplied by 1.05 per
step and capped at 1e5, x0 ~ U[-3, 3]^d (the same x0 for both libraries).
Metric: particle-steps per second = N * steps / seconds.

cbo_jax timing excludes compilation: every configuration is first run once with the
same N and the same scan-chunk lengths (``simulate`` compiles one ``lax.scan`` per
chunk length and reuses it, keyed on the identity of ``dyn.step``; the same ``dyn``
object is reused), then timed ``--repeats`` times, best kept. A JAX monitoring
listener counts backend compilations during the timed runs; it must stay 0.
Timed call: ``cj.simulate(dyn, x0, key, steps, chunk_size=500)`` + block_until_ready
(the host-side input checks and the per-step history it records are included).

CBXpy: ``cbx.dynamics.CBO(Rastrigin(), f_dim='3D', x=x0[None], dt=0.01, sigma=10.1,
lamda=1.0, alpha=30., noise='anisotropic', max_it=steps, verbosity=0,
track_args={'names': []})`` and ``optimize(sched=multiply(name='alpha', factor=1.05,
maximum=1e5))`` (the same scheduler as its default one). Only ``optimize`` is timed.
Two settings favour CBXpy and are deliberate (a conservative speedup):
``f_dim='3D'`` hands the whole (M, N, d) array to the vectorised Rastrigin (CBXpy's
default ``'1D'`` evaluates it row by row via ``np.apply_along_axis``: ~13x slower at
N=1e4 here),
and history tracking is switched off (by default it stores the N energies every step).
CBXpy keeps its default post-processing (``nan_to_num`` + clip to 1e8 each step) and
its per-step ``x_old`` copy / update norm; cbo_jax runs without ``max_abs`` clipping.

Allocator: by default (``--malloc tuned``) the process fixes glibc's ``mmap`` and trim
thresholds at start-up (benchmarks/_malloc.py). CBXpy's NumPy temporaries then stop
page-faulting, and CBXpy runs at its faster, steady speed (up to 1.6x faster than under the
system's dynamic thresholds; benchmarks/RESULTS_cbx.md). ``--malloc system`` keeps glibc's
defaults. The JSON records which one ran (``malloc``).

Columns: cbo_jax float32 (rng="fast", the default), cbo_jax float64 (rng="fast"),
cbo_jax float32 with rng="partitionable" (for reference), CBXpy float64, speedups.

Modes:
  default   N in {1e3, 1e4, 1e5}, 1000 steps, 3 repeats (cbo_jax); CBXpy repeats: 3
            when N*steps <= 1e7, else 1. Takes ~10-15 min on a 2-core CPU.
  --quick   N in {1e3, 1e4}, 200 steps, 2 repeats (cbo_jax), 1 (CBXpy); about 20-45 s
            in total on the 2-core machine (measured 18 s lightly loaded, 43 s at load
            average 5-6; must stay < 60 s).
  --interleaved PAIRS
            also run PAIRS back-to-back (CBXpy, cbo_jax float32) pairs at N=1e4 and
            report the median per-pair ratio as "speedup_vs_cbxpy": on a shared
            machine the load drifts between the table's columns, not within a pair.
            Before each timed run of a pair, that library runs its own work untimed
            for --warmup-ms (default 100; benchmarks/_warm.py: single-threaded CBXpy
            leaves the second core idle, and an idle core starts slow).
  --profile also run the one-step breakdown of benchmarks/profile_cbo_step.py
            (N=1e4, d=20, float32) and include it in the output / JSON.

The table is printed first; the very last line of stdout is one JSON object with
"particle_steps_per_s" (cbo_jax, N=1e4, float32) and "speedup_vs_cbxpy" (same N),
plus per-N numbers, device and versions. ``--json PATH`` writes the same object.

    python benchmarks/cbo_throughput.py            # full
    python benchmarks/cbo_throughput.py --quick    # < 60 s
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time

import jax

# 64-bit mode is process-wide and changes how float32 programs run too, so the float64
# column is measured in a separate worker process (``--f64-worker``); the float32
# columns run in a process without it.
F64_WORKER = "--f64-worker" in sys.argv
if F64_WORKER:
    jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax.runtime.provenance import describe, environment  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _malloc  # noqa: E402
import _progress  # noqa: E402
import _warm  # noqa: E402
from profile_cbo_step import ALPHA0, ALPHA_FACTOR, ALPHA_MAX, DT, LAMBDA, SIGMA, bench_config  # noqa: E402

CHUNK = 500
HEADLINE_N = 10_000

# cbo_jax configurations: (column key, dtype, rng)
JAX_CONFIGS = [
    ("cbo_jax_float32", "float32", "fast"),
    ("cbo_jax_float64", "float64", "fast"),
    ("cbo_jax_float32_partitionable", "float32", "partitionable"),
]


class _CompileCounter:
    """Counts XLA backend compilations (JAX monitoring events)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event.endswith("backend_compile_duration"):
            self.count += 1


def _chunk_lengths(steps: int, chunk: int) -> list[int]:
    lengths = {min(chunk, steps)}
    if steps > chunk and steps % chunk:
        lengths.add(steps % chunk)
    return sorted(lengths)


def expected_alpha(steps: int) -> float:
    a = ALPHA0
    for _ in range(steps):
        a = min(a * ALPHA_FACTOR, ALPHA_MAX)
    return a


def time_cbo_jax(dyn, x0: np.ndarray, steps: int, repeats: int, counter: _CompileCounter) -> dict:
    key = jax.random.key(1)
    # Warm-up: compile every scan-chunk length the timed call will use (same shapes).
    t0 = time.perf_counter()
    for length in _chunk_lengths(steps, CHUNK):
        jax.block_until_ready(cj.simulate(dyn, x0, key, length, chunk_size=CHUNK).state)
    warm_s = time.perf_counter() - t0
    compiles_before = counter.count
    times, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = cj.simulate(dyn, x0, key, steps, chunk_size=CHUNK)
        jax.block_until_ready(res.state)
        times.append(time.perf_counter() - t0)
    best = min(times)
    n = x0.shape[0]
    return {
        "seconds_best": best,
        "seconds_all": times,
        "particle_steps_per_s": n * steps / best,
        "warmup_seconds_incl_compile": warm_s,
        "recompiles_during_timing": counter.count - compiles_before,
        "best_energy": float(res.state.best_energy),
        "final_alpha": float(res.state.alpha),
        "steps_done": int(res.steps),
    }


def cbxpy_cbo(x0: np.ndarray, steps: int, seed: int):
    """CBXpy's CBO on the benchmark problem, and its alpha scheduler."""
    from cbx.dynamics import CBO
    from cbx.objectives import Rastrigin
    from cbx.scheduler import multiply

    dyn = CBO(
        Rastrigin(),
        f_dim="3D",
        x=x0[None].copy(),
        dt=DT,
        sigma=SIGMA,
        lamda=LAMBDA,
        alpha=ALPHA0,
        noise="anisotropic",
        max_it=steps,
        verbosity=0,
        track_args={"names": []},
        seed=seed,
    )
    return dyn, multiply(name="alpha", factor=ALPHA_FACTOR, maximum=ALPHA_MAX)


def time_cbxpy(x0: np.ndarray, steps: int, repeats: int, warmup_s: float = 0.0) -> dict:
    times, dyn = [], None
    for r in range(repeats):
        if warmup_s > 0:  # a throwaway instance steps first (benchmarks/_warm.py)
            _warm.warm_steps(warmup_s, *cbxpy_cbo(x0, steps, seed=10_000 + r))
        dyn, sched = cbxpy_cbo(x0, steps, seed=r)
        t0 = time.perf_counter()
        dyn.optimize(sched=sched)
        times.append(time.perf_counter() - t0)
    best = min(times)
    n = x0.shape[0]
    return {
        "seconds_best": best,
        "seconds_all": times,
        "particle_steps_per_s": n * steps / best,
        "best_energy": float(np.min(dyn.best_energy)),
        "final_alpha": float(np.asarray(dyn.alpha).ravel()[0]),
        "steps_done": int(dyn.it),
    }


def time_interleaved(dyn, x0: np.ndarray, steps: int, pairs: int, counter: _CompileCounter,
                     warmup_s: float = 0.0) -> dict:
    """Alternate one CBXpy run and one cbo_jax run, ``pairs`` times, on the same x0.

    On a shared machine the load changes between the two columns of the main table;
    the ratio of two runs taken back to back sees (nearly) the same load. The median
    of the per-pair ratios is the robust speedup; min and max show the spread.
    """
    jax_warm = time_cbo_jax(dyn, x0, steps, 1, counter)  # compiles + one timed run
    n = x0.shape[0]
    jax_rates, cbx_rates = [], []
    for p in range(pairs):
        cbx = time_cbxpy(x0, steps, 1, warmup_s)
        cbx_rates.append(cbx["particle_steps_per_s"])
        key = jax.random.key(100 + p)
        _warm.warm_jax(warmup_s, lambda: cj.simulate(dyn, x0, jax.random.key(0), steps, chunk_size=CHUNK).state)
        t0 = time.perf_counter()
        res = cj.simulate(dyn, x0, key, steps, chunk_size=CHUNK)
        jax.block_until_ready(res.state)
        jax_rates.append(n * steps / (time.perf_counter() - t0))
        print(f"[interleaved {p + 1}/{pairs}] cbo_jax {jax_rates[-1] / 1e6:.3f} M/s, "
              f"CBXpy {cbx_rates[-1] / 1e6:.3f} M/s, ratio {jax_rates[-1] / cbx_rates[-1]:.2f}x", file=sys.stderr)
    ratios = [a / b for a, b in zip(jax_rates, cbx_rates)]
    return {
        "N": n,
        "pairs": pairs,
        "cbo_jax_particle_steps_per_s": jax_rates,
        "cbxpy_particle_steps_per_s": cbx_rates,
        "ratios": ratios,
        "median_ratio": float(np.median(ratios)),
        "min_ratio": float(np.min(ratios)),
        "max_ratio": float(np.max(ratios)),
        "median_cbo_jax_particle_steps_per_s": float(np.median(jax_rates)),
        "recompiles_during_timing": jax_warm["recompiles_during_timing"],
    }


def _fmt_rate(r):
    return "-" if r is None else f"{r / 1e6:8.3f}"


def _fmt_x(a, b):
    return "-" if (a is None or b is None) else f"{a / b:6.2f}x"


def format_table(results: list[dict], steps: int, dim: int) -> str:
    head = (
        f"CBO on Rastrigin d={dim}, {steps} steps, M=1; million particle-steps/s (best of repeats, compile excluded)\n"
        f"{'N':>8s} | {'jax f32':>8s} {'jax f64':>8s} {'f32 part':>8s} | {'CBXpy':>8s} | "
        f"{'f32/CBX':>7s} {'f64/CBX':>7s} {'part/CBX':>8s}"
    )
    lines = [head, "-" * len(head.splitlines()[1])]
    for r in results:
        f32 = r.get("cbo_jax_float32", {}).get("particle_steps_per_s")
        f64 = r.get("cbo_jax_float64", {}).get("particle_steps_per_s")
        part = r.get("cbo_jax_float32_partitionable", {}).get("particle_steps_per_s")
        cbx = r.get("cbxpy_float64", {}).get("particle_steps_per_s")
        lines.append(
            f"{r['N']:8d} | {_fmt_rate(f32)} {_fmt_rate(f64)} {_fmt_rate(part)} | {_fmt_rate(cbx)} | "
            f"{_fmt_x(f32, cbx):>7s} {_fmt_x(f64, cbx):>7s} {_fmt_x(part, cbx):>8s}"
        )
    lines.append("")
    lines.append("seconds (best / all), warm-up incl. compile, best energy, final alpha:")
    for r in results:
        for col in ["cbo_jax_float32", "cbo_jax_float64", "cbo_jax_float32_partitionable", "cbxpy_float64"]:
            m = r.get(col)
            if not m:
                continue
            extra = ""
            if "warmup_seconds_incl_compile" in m:
                extra = f" warm-up {m['warmup_seconds_incl_compile']:6.2f}s, recompiles {m['recompiles_during_timing']}"
            alls = ", ".join(f"{t:.2f}" for t in m["seconds_all"])
            lines.append(
                f"  N={r['N']:<7d} {col:30s} {m['seconds_best']:8.2f}s [{alls}]{extra}; "
                f"E_best={m['best_energy']:.3g}, alpha={m['final_alpha']:.4g}"
            )
    return "\n".join(lines)


def _time_f64_in_subprocess(n: int, steps: int, repeats: int, args) -> dict:
    """Run the float64 column in a fresh process with jax_enable_x64 (see F64_WORKER)."""
    import json
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--f64-worker", "--sizes", str(n), "--steps", str(steps),
           "--repeats", str(repeats), "--dim", str(args.dim), "--seed", str(args.seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _f64_worker(args) -> int:
    import json

    n = int(float(args.sizes))
    x0 = np.random.default_rng(args.seed).uniform(-3.0, 3.0, (n, args.dim))
    dyn = cj.cbo(cj.objectives.Rastrigin(), bench_config("float64", "fast"))
    print(json.dumps(time_cbo_jax(dyn, x0, args.steps, args.repeats, _CompileCounter())))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N in {1e3,1e4}, 200 steps, 2 repeats: < 60 s")
    ap.add_argument("--sizes", type=str, default=None, help="comma-separated N (default 1000,10000,100000)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 1000; 200 with --quick)")
    ap.add_argument("--dim", type=int, default=20, help="dimension d (default 20)")
    ap.add_argument("--repeats", type=int, default=None, help="timed cbo_jax runs per config (default 3; 2 quick)")
    ap.add_argument("--cbx-repeats", type=int, default=None,
                    help="timed CBXpy runs (default: 3 if N*steps <= 1e7 else 1; 1 with --quick)")
    ap.add_argument("--no-cbxpy", action="store_true", help="skip CBXpy")
    ap.add_argument("--cbxpy-max-n", type=float, default=None, metavar="N",
                    help="time CBXpy only at sizes <= N (default: every size); on an accelerator the NumPy peer "
                         "at N = 1e7 would take longer than the rest of the table")
    ap.add_argument("--no-partitionable", action="store_true", help="skip the rng='partitionable' float32 column")
    ap.add_argument("--profile", action="store_true", help="also run the one-step profile (N=1e4, d=20, float32)")
    ap.add_argument("--json", metavar="PATH", help="write all results to PATH")
    _malloc.add_argument(ap)
    _warm.add_argument(ap)
    _progress.add_argument(ap)
    ap.add_argument("--seed", type=int, default=0, help="seed of x0 (default 0)")
    ap.add_argument("--interleaved", type=int, default=0, metavar="PAIRS",
                    help="also time PAIRS back-to-back (CBXpy, cbo_jax float32) pairs at N=1e4; "
                         "the median per-pair ratio becomes the headline speedup")
    ap.add_argument("--f64-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.f64_worker:
        return _f64_worker(args)
    if not args.no_cbxpy and importlib.util.find_spec("cbx") is None:
        if args.interleaved:
            ap.error("--interleaved times CBXpy, which is not installed (pip install cbx, or the [test] extra)")
        print("WARNING: CBXpy (PyPI 'cbx') is not installed: running without its column (as --no-cbxpy)",
              file=sys.stderr)
        args.no_cbxpy = True

    malloc = _malloc.apply(args.malloc)
    t_start = time.perf_counter()
    if args.quick:
        sizes = [1_000, 10_000]
        steps = args.steps or 200
        repeats = args.repeats or 2
    else:
        sizes = [1_000, 10_000, 100_000]
        steps = args.steps or 1000
        repeats = args.repeats or 3
    if args.sizes:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    configs = [c for c in JAX_CONFIGS if not (args.no_partitionable and c[2] == "partitionable")]

    counter = _CompileCounter()
    dyns = {key: cj.cbo(cj.objectives.Rastrigin(), bench_config(dtype, rng)) for key, dtype, rng in configs
            if dtype != "float64"}
    results = []
    for n in sizes:
        x0 = np.random.default_rng(args.seed).uniform(-3.0, 3.0, (n, args.dim))
        row = {"N": n}
        for key, dtype, rng in configs:
            if dtype == "float64":
                row[key] = _time_f64_in_subprocess(n, steps, repeats, args)
            else:
                row[key] = time_cbo_jax(dyns[key], x0, steps, repeats, counter)
            row[key].update(dtype=dtype, rng=rng)
            print(f"[N={n}] {key}: {row[key]['particle_steps_per_s'] / 1e6:.3f} M particle-steps/s", file=sys.stderr)
        if not args.no_cbxpy and (args.cbxpy_max_n is None or n <= args.cbxpy_max_n):
            reps = args.cbx_repeats or (1 if args.quick else (3 if n * steps <= 1e7 else 1))
            row["cbxpy_float64"] = time_cbxpy(x0, steps, reps)
            print(f"[N={n}] cbxpy: {row['cbxpy_float64']['particle_steps_per_s'] / 1e6:.3f} M particle-steps/s",
                  file=sys.stderr)
            for key, _, _ in configs:
                row[key]["speedup_vs_cbxpy"] = row[key]["particle_steps_per_s"] / row["cbxpy_float64"]["particle_steps_per_s"]
        results.append(row)
        _progress.append(args.progress, {**row, "steps": steps, "d": args.dim})

    print(format_table(results, steps, args.dim))
    a_exp = expected_alpha(steps)
    for r in results:
        for col, m in r.items():
            if isinstance(m, dict) and abs(m["final_alpha"] - a_exp) > 1e-3 * a_exp:
                print(f"WARNING: N={r['N']} {col}: final alpha {m['final_alpha']} != expected {a_exp}")
            if isinstance(m, dict) and m.get("recompiles_during_timing", 0):
                print(f"WARNING: N={r['N']} {col}: {m['recompiles_during_timing']} recompilations during timing")

    profile = None
    if args.profile:
        from profile_cbo_step import format_profile, profile_step

        profile = profile_step(10_000, args.dim, k=200, repeats=5)
        print()
        print(format_profile(profile))

    head = next((r for r in results if r["N"] == HEADLINE_N), results[-1])
    f32 = head["cbo_jax_float32"]
    headline_rate, headline_speedup = f32["particle_steps_per_s"], f32.get("speedup_vs_cbxpy")
    how = "best-of-repeats columns"
    interleaved = None
    if args.interleaved > 0:
        x0 = np.random.default_rng(args.seed).uniform(-3.0, 3.0, (HEADLINE_N, args.dim))
        interleaved = time_interleaved(dyns["cbo_jax_float32"], x0, steps, args.interleaved, counter,
                                       args.warmup_ms / 1e3)
        print(f"\ninterleaved N={HEADLINE_N}: median ratio {interleaved['median_ratio']:.2f}x "
              f"(min {interleaved['min_ratio']:.2f}x, max {interleaved['max_ratio']:.2f}x, "
              f"{args.interleaved} back-to-back pairs)")
        headline_rate = interleaved["median_cbo_jax_particle_steps_per_s"]
        headline_speedup = interleaved["median_ratio"]
        how = f"median of {args.interleaved} back-to-back pairs"
    env = environment()
    out = {
        "particle_steps_per_s": headline_rate,
        "speedup_vs_cbxpy": headline_speedup,
        "speedup_measured_as": how,
        "headline": f"cbo_jax float32 rng=fast, N={HEADLINE_N if interleaved else head['N']}, d={args.dim}, {steps} steps",
        "N": head["N"],
        "d": args.dim,
        "steps": steps,
        "repeats": repeats,
        "quick": bool(args.quick),
        "device": describe(env),
        "environment": env,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": importlib.metadata.version("jaxlib"),
        "cbx_version": None if args.no_cbxpy else importlib.metadata.version("cbx"),
        "numpy_version": np.__version__,
        "malloc": malloc,
        "warmup_ms": args.warmup_ms,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "expected_final_alpha": a_exp,
        "results": results,
        "wall_seconds_total": time.perf_counter() - t_start,
    }
    if profile is not None:
        out["profile"] = profile
    if interleaved is not None:
        out["interleaved"] = interleaved
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(f"\ntotal wall time {out['wall_seconds_total']:.1f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
