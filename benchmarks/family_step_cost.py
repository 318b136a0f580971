"""Where a CBX-family step spends its time on the CPU: the normal draws against the rest.

Rastrigin, d = 20, N = 10,000, float32, 60 steps per timed run (best of 3): CBO,
CBOMemory and PSO with anisotropic noise and with ``noise="none"``, and the cost of one
``(N, d)`` draw of normals and of uniforms for each of JAX's key implementations. Issue 15
(the speed of the memory dynamics and PSO against CBXpy and evosax, benchmarks/RESULTS_cbx.md).

    python benchmarks/family_step_cost.py

Last line: one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.provenance import environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import best_seconds  # noqa: E402

N, D, T = 10_000, 20, 60


def steps() -> dict:
    f = cj.objectives.Rastrigin()
    x0 = jnp.asarray(np.random.default_rng(0).uniform(-3, 3, (N, D)), jnp.float32)
    kw = dict(lambda1=1.0, sigma1=1.0, dt=0.01, alpha=30.0)
    out = {}
    for name, build in [("cbo", cj.cbo), ("cbo_memory", cj.cbo_memory), ("pso", cj.pso)]:
        for noise in ("anisotropic", "none"):
            dyn = build(f, **kw, noise=noise)
            sec = best_seconds(lambda: cj.simulate(dyn, x0, jax.random.key(1), T))
            out[f"{name}/{noise}"] = {"ms_per_step": 1e3 * sec / T, "particle_steps_per_s": N * T / sec}
            print(f"{name:12s} noise={noise:12s} {1e3 * sec / T:6.2f} ms/step", flush=True)
    return out


def draws() -> dict:
    out = {}
    for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
        for kind in ("normal", "uniform"):
            draw = jax.random.normal if kind == "normal" else jax.random.uniform

            @jax.jit
            def run(k, draw=draw):
                def body(k, _):
                    k, a = jax.random.split(k)
                    return k, jnp.sum(draw(a, (D, N)))
                return jax.lax.scan(body, k, None, length=T)[1]

            ms = 1e3 * best_seconds(run, jax.random.key(0, impl=impl)) / T
            out[f"{impl}/{kind}"] = {"ms_per_draw": ms}
            print(f"{impl:14s} {kind:8s} {ms:6.2f} ms per ({N}, {D}) draw", flush=True)
    return out


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    res = {"N": N, "d": D, "steps": T, "steps_timed": steps(), "draws": draws(),
           "load_average": list(os.getloadavg()), "jax_version": jax.__version__,
           "environment": environment()}
    print(json.dumps(res))
