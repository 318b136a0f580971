"""A `reg_combination_cbo` step with the unit-sphere constraint in its two forms.

The same dynamic, once with the constraint given as a plain function
``g(x) = |x|² - 1`` (its gradient and Hessian by automatic differentiation, one d × d
solve per particle) and once as ``cbo_jax.constraints.sphere()`` (closed-form gradient,
Hessian ``2 I``, no solve). Problem as in benchmarks/cbx_family.py: CBXpy's Rastrigin,
d = 20, N = 10,000, float32, x0 ~ U[-3, 3]^20, λ = 1, σ = 1, dt = 0.01, α0 = 30 × 1.05
per step up to 1e5, anisotropic noise, ε = 0.01, ν = 1.

Timing: both dynamics are compiled first; then ``--repeats`` rounds, each timing one
run of ``--steps`` steps of each form back to back (the order alternating between
rounds). The result is the ratio of the best times, and the median and range of the
per-round ratios: on a shared machine read the ratio, not the milliseconds. The two
final populations are compared as a check that both forms compute the same step.

    python benchmarks/constraint_forms.py [--steps 20] [--repeats 7]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.provenance import environment

N, D = 10_000, 20
LAM, SIGMA, DT, ALPHA0, FACTOR, AMAX = 1.0, 1.0, 0.01, 30.0, 1.05, 1e5


def unit_sphere(x):
    """``|x|² - 1`` as a plain function: no closed forms attached."""
    return jnp.sum(x * x) - 1.0


def build(constraint):
    alpha = cj.schedules.Multiplicative(ALPHA0, FACTOR, AMAX)
    return cj.reg_combination_cbo(cj.objectives.Rastrigin(), constraints=constraint, lambda1=LAM, sigma1=SIGMA,
                                  dt=DT, alpha=alpha, noise="anisotropic", dtype="float32")


def main(steps: int, repeats: int) -> dict:
    x0 = jnp.asarray(np.random.default_rng(0).uniform(-3.0, 3.0, (N, D)), jnp.float32)
    forms = {"plain_function": build(unit_sphere), "constraints.sphere": build(cj.constraints.sphere())}

    def run(dyn):
        return jax.block_until_ready(cj.simulate(dyn, x0, jax.random.key(1), steps))

    finals = {}
    for name, dyn in forms.items():  # compile and warm
        finals[name] = np.asarray(run(dyn).state.x)

    times = {name: [] for name in forms}
    order = list(forms)
    for r in range(repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            run(forms[name])
            times[name].append(time.perf_counter() - t0)
        print(f"round {r}: " + ", ".join(f"{n} {1e3 * times[n][-1] / steps:.2f} ms/step" for n in order), flush=True)

    best = {n: min(t) for n, t in times.items()}
    per_round = [a / b for a, b in zip(times["plain_function"], times["constraints.sphere"])]
    ratio = best["plain_function"] / best["constraints.sphere"]
    diff = float(np.max(np.abs(finals["plain_function"] - finals["constraints.sphere"])))
    print(f"best: plain function {1e3 * best['plain_function'] / steps:.2f} ms/step, "
          f"constraints.sphere() {1e3 * best['constraints.sphere'] / steps:.2f} ms/step, ratio {ratio:.1f}x "
          f"(per-round median {np.median(per_round):.1f}x, {min(per_round):.1f}-{max(per_round):.1f}); "
          f"max |x_plain - x_sphere| after {steps} steps: {diff:.2e}", flush=True)
    return {
        "N": N, "d": D, "dtype": "float32", "steps": steps, "repeats": repeats,
        "ms_per_step_best": {n: 1e3 * b / steps for n, b in best.items()},
        "ms_per_step_all": {n: [1e3 * s / steps for s in t] for n, t in times.items()},
        "ratio_best": ratio, "ratio_per_round_median": float(np.median(per_round)),
        "ratio_per_round_range": [min(per_round), max(per_round)],
        "max_abs_diff_final_x": diff,
        "load_average": list(os.getloadavg()), "jax_version": jax.__version__, "environment": environment(),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    print(json.dumps(main(a.steps, a.repeats)))
