"""CBXpy's reference success check for CBO on Rastrigin (CBXpy, PyPI ``cbx``).

Rastrigin in d = 20 (CBXpy's un-normalised form), N = 40 particles, 100 independent
runs, x0 ~ U[-3, 3]^20, anisotropic noise σ = 10.1, λ = 1, dt = 0.01, α0 = 30
multiplied by 1.05 per step up to 1e5, 5000 steps. A run succeeds when its final
consensus point satisfies ||m - 0||_∞ < 0.25. CBXpy reports 100/100.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from cbo_jax import _checks, objectives, schedules
from cbo_jax.dynamics.cbo import CBOConfig, cbo
from cbo_jax.config import option
from cbo_jax.experiments.base import Experiment, SeedOption, positive_int
from cbo_jax.simulate import simulate

SETTINGS = dict(dim=20, particles=40, runs=100, steps=5000, sigma=10.1, lam=1.0, dt=0.01, alpha0=30.0,
                factor=1.05, alpha_max=1e5, low=-3.0, high=3.0, tol=0.25)


@dataclasses.dataclass(frozen=True)
class Options:
    """The options of ``rastrigin-success``.

    Attributes:
      runs: independent runs (default 100)
      steps: steps per run (default 5000)
      seed: the runs' seed (:class:`~cbo_jax.experiments.base.SeedOption`)
      peer: also run CBXpy (pip package cbx) on the same settings
    """

    runs: int = option(SETTINGS["runs"], type=positive_int)
    steps: int = option(SETTINGS["steps"], type=positive_int)
    seed: SeedOption = SeedOption()
    peer: bool = False


def _successes(points: np.ndarray, tol: float) -> int:
    return int(np.sum(np.max(np.abs(points.reshape(points.shape[0], -1)), axis=-1) < tol))


def run_cbo_jax(runs: int, steps: int, seed: int, progress: bool = True) -> dict:
    s = SETTINGS
    cfg = CBOConfig(lambda1=s["lam"], sigma1=s["sigma"], dt=s["dt"], noise="anisotropic",
                    alpha=schedules.Multiplicative(s["alpha0"], s["factor"], s["alpha_max"]), max_abs=1e8)
    key_init, key_run = jax.random.split(_checks.as_key("seed", seed))
    x0 = jax.random.uniform(key_init, (runs, s["particles"], s["dim"]), minval=s["low"], maxval=s["high"])
    res = simulate(cbo(objectives.Rastrigin(), cfg), x0, key_run, steps, num_runs=runs, progress=progress,
                   desc="cbo_jax rastrigin")
    consensus = np.asarray(res.state.consensus)
    best = np.asarray(res.state.best_x)
    return {
        "successes": _successes(consensus, s["tol"]),
        "successes_best_particle": _successes(best, s["tol"]),
        "mean_inf_error": float(np.mean(np.max(np.abs(consensus), axis=-1))),
        "seconds": res.seconds,
    }


def run_cbxpy(runs: int, steps: int, seed: int) -> dict:
    try:
        from cbx.dynamics import CBO
        from cbx.objectives import Rastrigin
        from cbx.scheduler import multiply
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise SystemExit("--peer needs CBXpy: pip install 'cbo-jax[bench]' (package cbx)") from err
    s = SETTINGS
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(s["low"], s["high"], size=(runs, s["particles"], s["dim"]))
    np.random.seed(seed)
    dyn = CBO(Rastrigin(), x=x0, dt=s["dt"], sigma=s["sigma"], lamda=s["lam"], alpha=s["alpha0"],
              noise="anisotropic", max_it=steps, verbosity=0, seed=seed, f_dim="3D")
    t0 = time.perf_counter()
    dyn.optimize(sched=multiply(name="alpha", factor=s["factor"], maximum=s["alpha_max"]))
    seconds = time.perf_counter() - t0
    return {
        "successes": _successes(np.asarray(dyn.consensus), s["tol"]),
        "successes_best_particle": _successes(np.asarray(dyn.best_particle), s["tol"]),
        "seconds": seconds,
    }


def run(args: argparse.Namespace) -> dict:
    out = {"experiment": "rastrigin-success", "runs": args.runs, "published_cbxpy_successes": 100}
    out.update(run_cbo_jax(args.runs, args.steps, args.seed, progress=not args.no_progress))
    if args.peer:
        peer = run_cbxpy(args.runs, args.steps, args.seed)
        out["cbxpy_successes"] = peer["successes"]
        out["cbxpy_successes_best_particle"] = peer["successes_best_particle"]
        out["cbxpy_seconds"] = peer["seconds"]
    return out


EXPERIMENT = Experiment(
    name="rastrigin-success",
    summary="CBO on Rastrigin d=20, N=40, 100 runs, 5000 steps: runs ending within 0.25 (sup norm) of 0",
    published="CBXpy: 100/100 successes",
    options=Options,
    run=run,
)
