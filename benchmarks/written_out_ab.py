"""What writing the noise draw out in a kernel of its own buys on XLA:CPU (``cbo_jax.sde.written_out``).

Each case compiles the same dynamics twice in one process, with the boundary switched off
(``cbo_jax.sde._WRITE_OUT_ON_CPU = False``, read at trace time) and on, checks that the final
particles agree, and times the two interleaved: ``--pairs`` pairs, the median of the per-pair
ratios of wall times is the speedup. Cases (float32, Rastrigin, anisotropic noise, λ1 = 1,
dt = 0.01, α0 = 30 × 1.05 up to 1e5):

* ``family/<name>``: every CBX-family dynamic of ``benchmarks/cbx_family.py`` at its
  setting there (d = 20, N = 10⁴; 60 steps).
* ``runs/<name>``: ``cbo`` and ``pso`` with ``num_runs = 8`` of N = 2000 (the boundary
  under ``vmap``), 60 steps.
* ``small/N<N>_d<d>[_runs<R>]``: CBO at small sizes, 1000 steps (the conditional's cost).
* ``large/N1e6_d10``: CBO at N = 10⁶, d = 10, σ1 = 10.1, 20 steps.
* ``clustered/per-particle``: the clustered system of ``benchmarks/clustered_scaling.py``
  (K = 4, d = 10, N = 10⁴) with ``rng="per-particle"``, 100 steps.

    python benchmarks/written_out_ab.py            # every case, 5 pairs (about 3 min on 2 cores)
    python benchmarks/written_out_ab.py --quick    # family and runs only, 3 pairs

Last line: one JSON object ``{"cases": {name: {"speedup": ..., "bitwise_equal": ...,
"max_abs_diff": ..., ...}}, ...}``. Without a CPU backend there is nothing to compare.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import jax
import numpy as np

import cbo_jax as cj
from cbo_jax import sde
from cbo_jax.provenance import describe, environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cbx_family as cf  # noqa: E402
import clustered_scaling as cs  # noqa: E402

FAMILY = ["cbo", "cbo_memory", "pso", "cbs", "adam_cbo", "mirror_cbo", "drift_constrained_cbo",
          "hypersurface_cbo", "reg_combination_cbo"]


def _alpha():
    return cj.schedules.Multiplicative(30.0, 1.05, 1e5)


def _cbo(sigma=1.0, **kw):
    return cj.cbo(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=sigma, dt=0.01, alpha=_alpha(),
                  noise="anisotropic", **kw)


def compare(build, x0, steps, pairs, num_runs=None) -> dict:
    """Build, compile and run ``build()`` with the boundary off and on; time them interleaved."""
    def run(dyn, seed):
        res = cj.simulate(dyn, x0, jax.random.key(seed), steps, num_runs=num_runs, chunk_size=max(steps, 1))
        jax.block_until_ready(res.state)
        return res

    dyns = {}
    for on in (False, True):
        sde._WRITE_OUT_ON_CPU = on
        dyns[on] = build()
        run(dyns[on], 0)  # compiles, with the switch as it is now
    sde._WRITE_OUT_ON_CPU = True
    xs = {on: np.asarray(run(d, 1).state.x) for on, d in dyns.items()}
    times = {False: [], True: []}
    for p in range(pairs):
        for on in (False, True):
            t0 = time.perf_counter()
            run(dyns[on], 10 + p)
            times[on].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(times[False], times[True])]
    n_total = int(np.prod(xs[True].shape[:-1]))  # particles over all runs
    return {
        "speedup": float(np.median(ratios)), "speedup_min": float(np.min(ratios)), "speedup_max": float(np.max(ratios)),
        "off_particle_steps_per_s": n_total * steps / float(np.median(times[False])),
        "on_particle_steps_per_s": n_total * steps / float(np.median(times[True])),
        "bitwise_equal": bool(np.array_equal(xs[False], xs[True])),
        "max_abs_diff": float(np.max(np.abs(xs[False] - xs[True]))),
        "steps": steps, "pairs": pairs,
    }


def cases(quick: bool):
    for name in FAMILY:
        n = cf.SIZES[name][2]
        yield f"family/{name}", (lambda name=name: cf.jax_dynamics(name)), cf._x0(n, name).astype(np.float32), 60, None
    x8 = np.random.default_rng(0).uniform(-3, 3, (8, 2000, 20)).astype(np.float32)
    yield "runs/cbo", _cbo, x8, 60, 8
    yield "runs/pso", lambda: cj.pso(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=1.0, dt=0.01, alpha=_alpha(),
                                     noise="anisotropic"), x8, 60, 8
    if quick:
        return
    for n, d, r in [(40, 2, None), (40, 20, None), (40, 20, 100), (200, 20, None)]:
        x = np.random.default_rng(0).uniform(-3, 3, ((r,) if r else ()) + (n, d)).astype(np.float32)
        yield f"small/N{n}_d{d}" + (f"_runs{r}" if r else ""), _cbo, x, 1000, r
    yield "large/N1e6_d10", lambda: _cbo(sigma=10.1), np.random.default_rng(0).uniform(
        -3, 3, (1_000_000, 10)).astype(np.float32), 20, None
    xc = np.random.default_rng(0).uniform(-3, 3, (10_000, cs.D)).astype(np.float32)
    centers = np.random.default_rng(0).uniform(-2.0, 2.0, (cs.K, cs.D))

    def clustered_pp():
        cfg = cj.ClusteredConfig(lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic", rng="per-particle",
                                 alpha=_alpha())
        return cj.clustered([cj.objectives.Rastrigin(shift=c) for c in centers], cfg)

    yield "clustered/per-particle", clustered_pp, cj.particles(xc, np.arange(10_000) % cs.K), 100, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="family and runs cases only, 3 pairs")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved pairs per case (default 5; 3 quick)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON object to PATH")
    args = ap.parse_args(argv)
    if jax.default_backend() != "cpu":
        raise SystemExit("written_out only places its boundary on XLA:CPU; nothing to compare on "
                         f"{jax.default_backend()!r}")
    pairs = args.pairs or (3 if args.quick else 5)
    t_start = time.perf_counter()
    load = os.getloadavg()
    out = {}
    for name, build, x0, steps, runs in cases(args.quick):
        r = compare(build, x0, steps, pairs, num_runs=runs)
        out[name] = r
        print(f"{name:32s} {r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}), "
              f"{r['off_particle_steps_per_s'] / 1e6:.2f} -> {r['on_particle_steps_per_s'] / 1e6:.2f} M particle-steps/s, "
              f"{'bitwise equal' if r['bitwise_equal'] else 'max |dx| %.1e' % r['max_abs_diff']}", flush=True)
    env = environment()
    res = {"cases": out, "load_average_before": load, "load_average_after": os.getloadavg(),
           "jax_version": jax.__version__, "device": describe(env), "environment": env,
           "date": datetime.date.today().isoformat(),
           "wall_seconds_total": time.perf_counter() - t_start}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
