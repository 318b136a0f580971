"""The memory of a compiled simulation, for every dynamics, against its own per-particle state.  Issue 59.

For each dynamics at N particles (default 1e6) in d = 20, float32, the program that
:func:`cbo_jax.simulate` runs (``_run_chunk``: a ``lax.scan`` of ``--steps`` steps, the state
donated) is compiled, not run, and XLA's memory analysis read: arguments + outputs +
temporaries - the outputs that alias donated arguments. That is divided by the bytes of the
dynamic's per-particle state (every field of the state with an agent axis: the particles,
their energies, and the velocities, memories or moments the dynamic keeps). A step that
updates its state in place and holds one block's temporaries is a little above 1.

    python benchmarks/step_memory.py                 # N = 1e6, d = 20, 10 steps
    python benchmarks/step_memory.py --n 1e5 --json benchmarks/step_memory.json

Last line: ``{"dynamics": {"cbo": {"peak_over_state": r, ...}, ...}, "backend": ..., "n": ..., "dim": ...}``
(issue 59's bar: every r <= 1.5).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax.dynamics.clustered import ClusteredConfig, Particles

F = cj.objectives.Rastrigin()


def _dynamics() -> dict:
    """Every dynamics with its defaults (and what it needs besides)."""
    sphere = cj.constraints.sphere(1.0)
    quad = [cj.objectives.Quadratic(shift=c) for c in (-1.0, 1.0)]
    return {
        "cbo": cj.cbo(F),
        "cbo_memory": cj.cbo_memory(F),
        "pso": cj.pso(F),
        "cbs": cj.cbs(F),
        "polar_cbo": cj.polar_cbo(F),
        "adam_cbo": cj.adam_cbo(F),
        "mirror_cbo": cj.mirror_cbo(F),
        "drift_constrained_cbo": cj.drift_constrained_cbo(F, constraints=sphere),
        "hypersurface_cbo": cj.hypersurface_cbo(F),
        "reg_combination_cbo": cj.reg_combination_cbo(F, constraints=sphere, eps=0.1),
        "clustered": cj.clustered(quad, ClusteredConfig()),
        "cb2o": cj.cb2o(quad[0], quad[1]),
    }


def measure(name: str, dyn, n: int, d: int, steps: int) -> dict:
    sim = importlib.import_module("cbo_jax.simulate")
    x0 = jax.ShapeDtypeStruct((n, d), jnp.float32)
    if name in ("clustered", "cb2o"):
        x0 = Particles(x=x0, label=jax.ShapeDtypeStruct((n,), jnp.int32),
                       malicious=jax.ShapeDtypeStruct((n,), jnp.bool_), pid=jax.ShapeDtypeStruct((n,), jnp.int32))
    state = jax.eval_shape(dyn.init, x0, jax.random.key(0))
    per = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(state)
              if n in getattr(leaf, "shape", ()))
    record = dyn.record or sim._record_cbo
    run = functools.partial(sim._run_chunk, step=dyn.step, record=record, observe=None, length=steps, batched=0,
                            with_consensus=False)
    m = jax.jit(run, donate_argnums=(0,)).lower(state).compile().memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return {"peak_over_state": round(total / per, 3), "temporaries_over_state": round(m.temp_size_in_bytes / per, 3),
            "state_mb": round(per / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=float, default=1e6, help="particles N (default 1e6)")
    ap.add_argument("--dim", type=int, default=20, help="dimension d (default 20)")
    ap.add_argument("--steps", type=int, default=10, help="steps of the compiled scan (default 10)")
    ap.add_argument("--only", default="", help="comma-separated names (default: every dynamics)")
    ap.add_argument("--json", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    n = int(args.n)
    out = {}
    for name, dyn in _dynamics().items():
        if args.only and name not in args.only.split(","):
            continue
        out[name] = measure(name, dyn, n, args.dim, args.steps)
        print(f"{name:24s} peak / state {out[name]['peak_over_state']:.3f}  (state {out[name]['state_mb']} MB)",
              flush=True)
    result = {"dynamics": out, "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
              "n": n, "dim": args.dim, "steps": args.steps}
    if args.json:
        from cbo_jax.runtime.provenance import environment

        with open(args.json, "w") as f:
            json.dump({**result, "environment": environment()}, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
