"""Every CBX-family dynamic against CBXpy's (and PSO against evosax's): speed and step agreement.  Issue 15.

Problem (the same for both libraries): CBXpy's un-normalised Rastrigin in d = 20,
x0 ~ U[-3, 3]^20 (the same x0), one run, λ = 1, σ = 1, dt = 0.01, α0 = 30 multiplied by
1.05 per step up to 1e5, anisotropic noise (CBS: covariance noise in sampling mode, α = 1;
HyperSurfaceCBO: isotropic noise on the unit sphere, x0 projected onto it), N = 10,000
particles, except PolarCBO at N = 2,000 (CBXpy forms (N, N, d) float64 arrays). The
constrained dynamics use the unit-sphere constraint ``|x|² - 1``; MirrorCBO the
projection onto the ball of radius 3; PSO CBXpy's arithmetic (``formulation="cbxpy"``,
the same work per step).

Timing: for each dynamic, ``--pairs`` back-to-back pairs (one CBXpy run of ``steps``
steps, then one cbo_jax float32 run of the same steps, compiled beforehand, the same
scan-chunk lengths), and the median of the per-pair ratios of particle-steps per second
is ``speedup_vs_cbxpy`` (on a shared machine the load drifts between pairs, not within
one). The pairs are taken in rounds, one pair of every dynamic per round, so a burst of
another tenant's load lands on one pair of each dynamic rather than on all pairs of one. Before each timed run, the library about to be timed runs its own work untimed for
``--warmup-ms`` (default 100): single-threaded CBXpy leaves the second core idle, and on
this machine an idle core runs the next 50–150 ms up to 1.9x slower (benchmarks/_warm.py).
CBXpy runs its own ``step()`` + scheduler update in a plain loop (no termination
checks, printing or history: a conservative speedup); cbo_jax runs
``cj.simulate(dyn, x0, key, steps)`` + ``block_until_ready`` (input checks and its per-step
history included). A JAX monitoring listener counts compilations during the timed runs;
it must stay 0.

Allocator: by default (``--malloc tuned``) the process fixes glibc's ``mmap`` and trim
thresholds at start-up (benchmarks/_malloc.py). CBXpy's NumPy temporaries then stop
page-faulting, and CBXpy runs at its faster, steady speed (up to 1.6x faster than under the
system's dynamic thresholds; benchmarks/RESULTS_cbx.md). ``--malloc system`` keeps glibc's
defaults. The JSON records which one ran (``malloc``).

evosax (``evosax.algorithms.PSO``, ask/tell jitted in one ``lax.scan``, its default
coefficients) runs the same problem and N, interleaved with cbo_jax's ``pso`` (the
default ``formulation="paper"``); ``speedup_vs_evosax`` is the median ratio.
``speedup_vs_evosax_without_noise`` times the same ``pso`` with ``noise="none"`` in the same
pairs: evosax's PSO draws two uniforms per particle and step, the SDE formulation ``2·d``
normals, so this ratio separates the engine from the cost of the draws.

``max_step_diff_vs_cbxpy``: in a separate float64 process, the same initial particles
and the same normal draws fed to both libraries (``tests/_cbx_compare.py``), the
largest absolute difference of the particles over 100 steps at N = 20, d = 3 (d = 6 for
the Stiefel case), the maximum over every compared noise model, kernel, mirror map and
option of that dynamic (``--quick``: one case per dynamic).

    python benchmarks/cbx_family.py --quick     # 3 pairs, short runs, one f64 case per dynamic
    python benchmarks/cbx_family.py             # 5 pairs, longer runs, every f64 case

The last line of stdout is one JSON object ``{"dynamics": {"<name>": {"max_step_diff_vs_cbxpy":
..., "speedup_vs_cbxpy": ..., ...}, ...}, ...}``; ``pso`` also has ``speedup_vs_evosax``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import subprocess
import sys
import time

F64_WORKER = "--f64-worker" in sys.argv
if F64_WORKER:
    import jax

    jax.config.update("jax_enable_x64", True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax.runtime.provenance import describe, environment  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _malloc  # noqa: E402
import _warm  # noqa: E402

D = 20
N_DEFAULT = 10_000
N_POLAR = 2_000
LAM, SIGMA, DT, ALPHA0, FACTOR, AMAX = 1.0, 1.0, 0.01, 30.0, 1.05, 1e5
CHUNK = 500

# name: (steps quick, steps full, N)
SIZES = {
    "cbo": (60, 200, N_DEFAULT), "cbo_memory": (60, 200, N_DEFAULT), "pso": (60, 200, N_DEFAULT),
    "cbs": (20, 60, N_DEFAULT), "polar_cbo": (3, 8, N_POLAR), "adam_cbo": (60, 200, N_DEFAULT),
    "mirror_cbo": (60, 200, N_DEFAULT), "drift_constrained_cbo": (20, 60, N_DEFAULT),
    "hypersurface_cbo": (60, 200, N_DEFAULT), "reg_combination_cbo": (60, 200, N_DEFAULT),
}
QUICK_CASES = {
    "cbo": "cbo-anisotropic", "cbo_memory": "cbo_memory-anisotropic", "pso": "pso-anisotropic",
    "cbs": "cbs-sampling", "polar_cbo": "polar_cbo-gaussian", "adam_cbo": "adam_cbo-anisotropic",
    "mirror_cbo": "mirror_cbo-ProjectionBall", "drift_constrained_cbo": "drift_constrained_cbo-indep-noise",
    "hypersurface_cbo": "hypersurface_cbo-sphere-isotropic", "reg_combination_cbo": "reg_combination_cbo-sphere",
}


class _CompileCounter:
    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event.endswith("backend_compile_duration"):
            self.count += 1


def _x0(n, name, seed=0):
    x = np.random.default_rng(seed).uniform(-3.0, 3.0, (n, D))
    if name == "hypersurface_cbo":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


def jax_dynamics(name: str, dtype: str = "float32"):
    f = cj.objectives.Rastrigin()
    alpha = cj.schedules.Multiplicative(ALPHA0, FACTOR, AMAX)
    common = dict(lambda1=LAM, sigma1=SIGMA, dt=DT, alpha=alpha, noise="anisotropic", dtype=dtype)
    sphere = [cj.constraints.sphere(1.0)]
    if name == "cbo":
        return cj.cbo(f, **common)
    if name == "cbo_memory":
        return cj.cbo_memory(f, **common)
    if name == "pso":
        return cj.pso(f, formulation="cbxpy", **common)
    if name == "pso_paper":
        return cj.pso(f, **common)
    if name == "pso_paper_no_noise":
        return cj.pso(f, **{**common, "noise": "none"})
    if name == "cbs":
        return cj.cbs(f, lambda1=LAM, dt=DT, alpha=1.0, mode="sampling", dtype=dtype)
    if name == "polar_cbo":
        return cj.polar_cbo(f, kappa=1.0, **common)
    if name == "adam_cbo":
        return cj.adam_cbo(f, **common)
    if name == "mirror_cbo":
        return cj.mirror_cbo(f, mirror_map={"name": "ProjectionBall", "radius": 3.0}, **common)
    if name == "drift_constrained_cbo":
        return cj.drift_constrained_cbo(f, constraints=sphere, **common)
    if name == "hypersurface_cbo":
        return cj.hypersurface_cbo(f, **{**common, "noise": "isotropic"})
    if name == "reg_combination_cbo":
        return cj.reg_combination_cbo(f, constraints=sphere, **common)
    raise KeyError(name)


def cbxpy_dynamics(name: str, x0: np.ndarray, seed: int):
    import cbx.dynamics as cd
    from cbx.objectives import Rastrigin
    from cbx.scheduler import multiply, scheduler

    kw = dict(f_dim="3D", x=x0[None].copy(), dt=DT, sigma=SIGMA, lamda=LAM, alpha=ALPHA0, noise="anisotropic",
              verbosity=0, track_args={"names": []}, seed=seed, max_it=10**9)
    sched = scheduler([multiply(name="alpha", factor=FACTOR, maximum=AMAX)])
    sphere = [{"name": "sphere", "r": 1.0}]
    f = Rastrigin()
    if name == "cbo":
        return cd.CBO(f, **kw), sched
    if name == "cbo_memory":
        return cd.CBOMemory(f, **kw), sched
    if name == "pso":
        return cd.PSO(f, **kw), sched
    if name == "cbs":
        return cd.CBS(f, mode="sampling", **{**kw, "noise": "covariance", "alpha": 1.0}), scheduler([])
    if name == "polar_cbo":
        return cd.PolarCBO(f, kernel="Gaussian", kappa=1.0, **kw), sched
    if name == "adam_cbo":
        return cd.AdamCBO(f, **kw), sched
    if name == "mirror_cbo":
        return cd.MirrorCBO(f, mirrormap={"name": "ProjectionBall", "radius": 3.0}, **kw), sched
    if name == "drift_constrained_cbo":
        return cd.DriftConstrainedCBO(f, constraints=sphere, **kw), sched
    if name == "hypersurface_cbo":
        return cd.HyperSurfaceCBO(f, **{**kw, "noise": "isotropic"}), sched
    if name == "reg_combination_cbo":
        return cd.RegCombinationCBO(f, constraints=sphere, **kw), sched
    raise KeyError(name)


def _chunk_lengths(steps):
    lengths = {min(CHUNK, steps)}
    if steps > CHUNK and steps % CHUNK:
        lengths.add(steps % CHUNK)
    return sorted(lengths)


def time_cbo_jax(dyn, x0, steps, seed):
    t0 = time.perf_counter()
    res = cj.simulate(dyn, x0, jax.random.key(seed), steps, chunk_size=CHUNK)
    jax.block_until_ready(res.state)
    return x0.shape[0] * steps / (time.perf_counter() - t0), res


def warm_cbo_jax(dyn, x0, steps):
    for length in _chunk_lengths(steps):
        jax.block_until_ready(cj.simulate(dyn, x0, jax.random.key(0), length, chunk_size=CHUNK).state)


def warm_cbxpy(name, x0, seconds):
    """A throwaway CBXpy instance of the same dynamic steps for ``seconds`` (benchmarks/_warm.py)."""
    if seconds <= 0:
        return
    _warm.warm_steps(seconds, *cbxpy_dynamics(name, x0, seed=10_000))


def time_cbxpy(name, x0, steps, seed):
    dyn, sched = cbxpy_dynamics(name, x0, seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        dyn.step()
        sched.update(dyn)
    return x0.shape[0] * steps / (time.perf_counter() - t0), dyn


def evosax_runner(n, steps):
    """evosax's PSO on the same problem: ask, evaluate, tell, jitted as one lax.scan of ``steps``."""
    from evosax.algorithms import PSO

    f = cj.objectives.Rastrigin()
    strategy = PSO(population_size=n, solution=jnp.zeros(D, jnp.float32))
    params = strategy.default_params

    @jax.jit
    def run(key, x0):
        state = strategy.init(key, x0, f(x0), params)

        def body(carry, _):
            state, key = carry
            key, k_ask, k_tell = jax.random.split(key, 3)
            x, state = strategy.ask(k_ask, state, params)
            state, _ = strategy.tell(k_tell, x, f(x), state, params)
            return (state, key), None

        (state, _), _ = jax.lax.scan(body, (state, key), None, length=steps)
        return state

    return run


def _cbx_compare():
    """The step-by-step comparison with CBXpy, a test helper (``tests/_cbx_compare.py``; in
    ``cbo_jax`` before issue 58)."""
    try:
        from cbo_jax import _cbx_compare as C  # type: ignore[attr-defined]
    except ImportError:
        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
        found = sorted(glob.glob(os.path.join(tests, "**", "_cbx_compare.py"), recursive=True))
        if not found:
            raise
        sys.path.insert(0, os.path.dirname(found[0]))
        import _cbx_compare as C
    return C


def f64_worker(cases):
    C = _cbx_compare()

    out = {}
    for case in cases:
        r = C.compare(C.get_case(case))
        out[case] = {"max_diff": r["max_diff"], "diff_step1": r["diff_step1"], "draws": r["draws"]}
        print(f"[f64] {case}: max |Δx| over 100 steps {r['max_diff']:.2e}", file=sys.stderr, flush=True)
    print(json.dumps(out))


def step_diffs(quick: bool) -> dict:
    C = _cbx_compare()

    cases = list(QUICK_CASES.values()) if quick else [c.name for c in C.CASES]
    cmd = [sys.executable, os.path.abspath(__file__), "--f64-worker", *cases]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr[-4000:])
    per_case = json.loads(out.stdout.strip().splitlines()[-1])
    by_dyn = {}
    for c in C.CASES:
        if c.name in per_case:
            by_dyn.setdefault(c.dynamic, {})[c.name] = per_case[c.name]
    return by_dyn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 pairs, short runs, one float64 case per dynamic")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved pairs per dynamic (default 3 quick, 5 full)")
    ap.add_argument("--only", type=str, default=None, help="comma-separated dynamics (default: all)")
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 step-agreement run")
    ap.add_argument("--no-evosax", action="store_true", help="skip evosax")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON object to PATH")
    _warm.add_argument(ap)
    _malloc.add_argument(ap)
    ap.add_argument("--f64-worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.f64_worker is not None:
        return f64_worker(args.f64_worker)

    malloc = _malloc.apply(args.malloc)
    warm_s = args.warmup_ms / 1e3
    t_start = time.perf_counter()
    pairs = args.pairs or (3 if args.quick else 5)
    names = list(SIZES) if args.only is None else args.only.split(",")
    load_before = os.getloadavg()
    counter = _CompileCounter()
    # Set-up: every dynamic compiled (and evosax's PSO) before any timing.
    setups = {}
    for name in names:
        steps_q, steps_f, n = SIZES[name]
        steps = steps_q if args.quick else steps_f
        x0 = _x0(n, name)
        x0_32 = x0.astype(np.float32)
        dyn = jax_dynamics(name)
        t0 = time.perf_counter()
        warm_cbo_jax(dyn, x0_32, steps)
        setups[name] = {"n": n, "steps": steps, "x0": x0, "x0_32": x0_32, "dyn": dyn,
                        "warm": time.perf_counter() - t0}
    evo = None
    if "pso" in names and not args.no_evosax:
        steps_q, steps_f, n = SIZES["pso"]
        steps = steps_q if args.quick else steps_f
        x0_32 = _x0(n, "pso").astype(np.float32)
        ours = jax_dynamics("pso_paper")
        # The same step without its Brownian terms: evosax's PSO draws 2 uniforms per particle,
        # the SDE formulation 2·d normals, so this row separates the engine from the draws.
        quiet = jax_dynamics("pso_paper_no_noise")
        warm_cbo_jax(ours, x0_32, steps)
        warm_cbo_jax(quiet, x0_32, steps)
        run = evosax_runner(n, steps)
        jax.block_until_ready(run(jax.random.key(0), jnp.asarray(x0_32)))
        evo = {"n": n, "steps": steps, "x0_32": x0_32, "ours": ours, "quiet": quiet, "run": run}

    # Timing in rounds: each round times one pair of every dynamic, so a burst of another
    # tenant's load lands on one pair of each dynamic, and the median over rounds drops it.
    before = counter.count
    rates = {name: {"jax": [], "cbx": []} for name in names}
    last = {}
    evo_rates = {"ours": [], "quiet": [], "evosax": []}
    for p in range(pairs):
        for name, su in setups.items():
            n, steps, x0, x0_32, dyn = su["n"], su["steps"], su["x0"], su["x0_32"], su["dyn"]
            warm_cbxpy(name, x0, warm_s)
            rate_c, cdyn = time_cbxpy(name, x0, steps, seed=p)
            _warm.warm_jax(warm_s, lambda: cj.simulate(dyn, x0_32, jax.random.key(0), steps, chunk_size=CHUNK).state)
            rate_j, res = time_cbo_jax(dyn, x0_32, steps, seed=100 + p)
            rates[name]["cbx"].append(rate_c)
            rates[name]["jax"].append(rate_j)
            last[name] = (res, cdyn)
            print(f"[round {p + 1}/{pairs}, {name}] cbo_jax {rate_j / 1e6:.3f} M/s, CBXpy {rate_c / 1e6:.3f} M/s, "
                  f"ratio {rate_j / rate_c:.2f}x", file=sys.stderr, flush=True)
        if evo is not None:
            n, steps, x0_32, run = evo["n"], evo["steps"], evo["x0_32"], evo["run"]
            _warm.warm_jax(warm_s, lambda: run(jax.random.key(0), jnp.asarray(x0_32)))
            t0 = time.perf_counter()
            st = run(jax.random.key(p + 1), jnp.asarray(x0_32))
            jax.block_until_ready(st)
            evo_rates["evosax"].append(n * steps / (time.perf_counter() - t0))
            for which, seed in (("ours", 200 + p), ("quiet", 300 + p)):
                dyn = evo[which]
                _warm.warm_jax(warm_s, lambda: cj.simulate(dyn, x0_32, jax.random.key(0), steps, chunk_size=CHUNK).state)
                evo_rates[which].append(time_cbo_jax(dyn, x0_32, steps, seed=seed)[0])
            evo["state"] = st
            er, jr, qr = evo_rates["evosax"], evo_rates["ours"], evo_rates["quiet"]
            print(f"[round {p + 1}/{pairs}, pso vs evosax] cbo_jax {jr[-1] / 1e6:.3f} M/s "
                  f"(without noise {qr[-1] / 1e6:.3f}), evosax {er[-1] / 1e6:.3f} M/s, ratio {jr[-1] / er[-1]:.2f}x",
                  file=sys.stderr, flush=True)
    recompiles = counter.count - before

    results = {}
    for name, su in setups.items():
        jax_rates, cbx_rates = rates[name]["jax"], rates[name]["cbx"]
        ratios = [a / b for a, b in zip(jax_rates, cbx_rates)]
        res, cdyn = last[name]
        results[name] = {
            "N": su["n"], "d": D, "steps": su["steps"], "pairs": pairs,
            "speedup_vs_cbxpy": float(np.median(ratios)),
            "speedup_min": float(np.min(ratios)), "speedup_max": float(np.max(ratios)),
            "cbo_jax_particle_steps_per_s": float(np.median(jax_rates)),
            "cbxpy_particle_steps_per_s": float(np.median(cbx_rates)),
            "warmup_seconds_incl_compile": su["warm"],
            "recompiles_during_timing": recompiles,
            "cbo_jax_best_energy": float(res.state.best_energy),
            "cbxpy_best_energy": float(np.min(cdyn.best_energy)),
        }
    if evo is not None:
        er, jr, qr = evo_rates["evosax"], evo_rates["ours"], evo_rates["quiet"]
        ratios = [a / b for a, b in zip(jr, er)]
        results["pso"].update({
            "speedup_vs_evosax": float(np.median(ratios)),
            "speedup_vs_evosax_min": float(np.min(ratios)), "speedup_vs_evosax_max": float(np.max(ratios)),
            "speedup_vs_evosax_without_noise": float(np.median([a / b for a, b in zip(qr, er)])),
            "cbo_jax_paper_particle_steps_per_s": float(np.median(jr)),
            "cbo_jax_paper_no_noise_particle_steps_per_s": float(np.median(qr)),
            "evosax_particle_steps_per_s": float(np.median(er)),
            "evosax_best_fitness": float(evo["state"].best_fitness),
            "evosax_recompiles_during_timing": recompiles,
        })
    if not args.no_f64:
        diffs = step_diffs(args.quick)
        for name in names:
            cases = diffs.get(name, {})
            results[name]["max_step_diff_vs_cbxpy"] = max((v["max_diff"] for v in cases.values()), default=None)
            results[name]["cases_compared"] = {k: v["max_diff"] for k, v in cases.items()}

    print(f"\nCBX family on Rastrigin d={D}: median of {pairs} interleaved pairs (float32 cbo_jax vs float64 CBXpy)")
    head = f"{'dynamic':24s} {'N':>6s} {'steps':>5s} {'cbo_jax M/s':>11s} {'CBXpy M/s':>10s} {'speedup':>8s} " \
           f"{'min-max':>12s} {'max|Δx| f64':>11s}"
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        diff = r.get("max_step_diff_vs_cbxpy")
        print(f"{name:24s} {r['N']:6d} {r['steps']:5d} {r['cbo_jax_particle_steps_per_s'] / 1e6:11.3f} "
              f"{r['cbxpy_particle_steps_per_s'] / 1e6:10.3f} {r['speedup_vs_cbxpy']:7.2f}x "
              f"{r['speedup_min']:5.1f}-{r['speedup_max']:<5.1f} {'-' if diff is None else f'{diff:.1e}':>11s}")
    if "speedup_vs_evosax" in results.get("pso", {}):
        r = results["pso"]
        print(f"pso (paper formulation) vs evosax PSO: {r['speedup_vs_evosax']:.2f}x "
              f"({r['cbo_jax_paper_particle_steps_per_s'] / 1e6:.2f} vs {r['evosax_particle_steps_per_s'] / 1e6:.2f} M/s); "
              f"without its noise terms {r['speedup_vs_evosax_without_noise']:.2f}x")
    ok_speed = all(r["speedup_vs_cbxpy"] >= 5 for r in results.values())
    ok_diff = all((r.get("max_step_diff_vs_cbxpy") or 0) <= 1e-10 for r in results.values())
    ok_evosax = results.get("pso", {}).get("speedup_vs_evosax", 1.0) >= 1
    env = environment()
    out = {
        "dynamics": results,
        "pass": {"speedup_vs_cbxpy_ge_5": ok_speed, "max_step_diff_le_1e-10": ok_diff, "pso_vs_evosax_ge_1": ok_evosax},
        "quick": bool(args.quick),
        "problem": f"Rastrigin d={D}, x0 ~ U[-3,3]^d, lambda={LAM}, sigma={SIGMA}, dt={DT}, alpha0={ALPHA0} x{FACTOR} "
                   f"up to {AMAX}",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "device": describe(env),
        "environment": env,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "jax_version": jax.__version__,
        "cbx_version": importlib.metadata.version("cbx"),
        "evosax_version": importlib.metadata.version("evosax") if "pso" in names and not args.no_evosax else None,
        "numpy_version": np.__version__,
        "malloc": malloc,
        "warmup_ms": args.warmup_ms,
        "date": datetime.date.today().isoformat(),
        "wall_seconds_total": time.perf_counter() - t_start,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(f"\ntotal wall time {out['wall_seconds_total']:.1f} s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
