"""Success rates of cbo_jax and CBXpy on CBXpy's benchmark settings.  Issue 15.

CBXpy's reference check: Rastrigin (un-normalised) in d = 20,
N = 40 particles, 100 independent runs, x0 ~ U[-3, 3]^20, anisotropic noise σ = 10.1,
λ = 1, dt = 0.01, α0 = 30 multiplied by 1.05 per step up to 1e5, 5000 steps; a run
succeeds when its final consensus point is within 0.25 of the minimiser in the ∞-norm.
The same settings on Ackley (d = 20). The planar test functions (Himmelblau, McCormick,
...; d = 2) run with the same scheme, N = 40, 100 runs, 2000 steps, σ = 1, x0 uniform on
the function's usual box, success = within 0.25 of the nearest known global minimiser.
Both libraries run CBO; CBOMemory, PSO (CBXpy's own and cbo_jax's paper formulation)
and PolarCBO run the Rastrigin and Ackley settings too.

Each library uses its own random numbers (cbo_jax: key 0; CBXpy: NumPy seed 0); x0 is
the same array. Counts out of the runs are printed and, last, one JSON line.

    python benchmarks/cbx_success.py               # 100 runs
    python benchmarks/cbx_success.py --runs 20     # quicker
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.provenance import environment

HIGH_D = {"rastrigin": ("Rastrigin", 20), "ackley": ("Ackley", 20)}
PLANAR = {  # name: (CBXpy class, box)
    "himmelblau": ("Himmelblau", (-5, 5)), "three-hump-camel": ("three_hump_camel", (-5, 5)),
    "mccormick": ("McCormick", (-3, 4)), "easom": ("Easom", (-10, 10)), "bukin6": ("Bukin6", (-15, 5)),
    "cross-in-tray": ("cross_in_tray", (-10, 10)), "drop-wave": ("drop_wave", (-5, 5)),
    "holder-table": ("Holder_table", (-10, 10)), "snowflake": ("snowflake", (-3, 3)),
    "eggholder": ("eggholder", (-512, 512)), "michalewicz": ("Michalewicz", (0, np.pi)),
    "rosenbrock": ("Rosenbrock", (-2, 2)), "rastrigin": ("Rastrigin", (-3, 3)), "ackley": ("Ackley", (-3, 3)),
}


def _successes(points, minimisers, tol=0.25):
    pts = np.asarray(points, np.float64).reshape(len(points), -1)
    dist = np.max(np.abs(pts[:, None, :] - np.asarray(minimisers)[None]), axis=-1).min(axis=1)
    return int(np.sum(dist < tol))


def run_jax(name, obj, x0, steps, sigma, key=0):
    alpha = cj.schedules.Multiplicative(30.0, 1.05, 1e5)
    kw = dict(lambda1=1.0, sigma1=sigma, dt=0.01, alpha=alpha, noise="anisotropic", max_abs=1e8)
    build = {"cbo": cj.cbo, "cbo_memory": cj.cbo_memory, "pso": cj.pso, "polar_cbo": cj.polar_cbo}[name]
    res = cj.simulate(build(obj, **kw), x0.astype(np.float32), key, steps, num_runs=x0.shape[0])
    return np.asarray(res.state.consensus) if name != "polar_cbo" else np.asarray(res.state.best_x)


def run_cbxpy(name, cls_name, x0, steps, sigma, seed=0):
    import cbx.dynamics as cd
    import cbx.objectives as co
    from cbx.scheduler import multiply, scheduler

    np.random.seed(seed)
    f = getattr(co, cls_name)()
    kw = dict(f_dim="3D", x=x0.copy(), dt=0.01, sigma=sigma, lamda=1.0, alpha=30.0, noise="anisotropic",
              max_it=steps, verbosity=0, track_args={"names": []}, seed=seed)
    cls = {"cbo": cd.CBO, "cbo_memory": cd.CBOMemory, "pso": cd.PSO, "polar_cbo": cd.PolarCBO}[name]
    dyn = cls(f, **kw)
    sched = scheduler([multiply(name="alpha", factor=1.05, maximum=1e5)])
    for _ in range(steps):
        dyn.step()
        sched.update(dyn)
    if name == "polar_cbo":
        return np.asarray(dyn.best_particle)
    return np.asarray(dyn.consensus).reshape(x0.shape[0], -1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=5000, help="steps for the d = 20 settings (default 5000)")
    ap.add_argument("--planar-steps", type=int, default=2000)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    rows, t_start = [], time.perf_counter()
    rng = np.random.default_rng(0)
    settings = []
    for name, (cls, d) in HIGH_D.items():
        for dyn in ("cbo", "cbo_memory", "pso", "polar_cbo"):
            settings.append((name, cls, d, (-3, 3), args.steps, 10.1, dyn))
    for name, (cls, box) in PLANAR.items():
        settings.append((name, cls, 2, box, args.planar_steps, 1.0, "cbo"))
    for name, cls, d, box, steps, sigma, dyn in settings:
        obj = cj.objectives.get_objective(name)
        x0 = rng.uniform(box[0], box[1], (args.runs, 40, d))
        mins = obj.minimisers(d)
        t0 = time.perf_counter()
        ours = _successes(run_jax(dyn, obj, x0, steps, sigma), mins)
        t1 = time.perf_counter()
        theirs = _successes(run_cbxpy(dyn, cls, x0, steps, sigma), mins)
        t2 = time.perf_counter()
        row = {"objective": name, "d": d, "dynamic": dyn, "steps": steps, "sigma": sigma, "runs": args.runs,
               "cbo_jax": ours, "cbxpy": theirs, "cbo_jax_seconds": t1 - t0, "cbxpy_seconds": t2 - t1}
        rows.append(row)
        print(f"{name:18s} d={d:<3d} {dyn:11s} cbo_jax {ours:4d}/{args.runs}  CBXpy {theirs:4d}/{args.runs}  "
              f"({t1 - t0:.0f} s, {t2 - t1:.0f} s)", flush=True)
    out = {"rows": rows, "runs": args.runs, "wall_seconds": time.perf_counter() - t_start,
           "jax_version": jax.__version__, "environment": environment()}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
