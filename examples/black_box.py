"""Objectives that are not written in JAX: a NumPy function, a program, and an ask/tell loop.

In float64, CBO on Rastrigin in d = 10 with N = 200 particles for 100 steps, three ways:

1. the objective written in NumPy, wrapped with ``cj.objectives.from_numpy`` (one host call
   per step), against the same objective in JAX: the same trajectory up to rounding;
2. a loop of ``ask`` / evaluate / ``tell`` (``cj.ask_tell``) against ``cj.simulate``: the same
   computation; and the same check, 10 steps, for every dynamics of the CBX family and the
   clustered and CB²O systems;
3. an objective that is a program: each step writes the particles to a file, runs a Python
   script in a subprocess and reads its energies back (20 steps of 50 particles).

    python examples/black_box.py

Last line: ``{"numpy_vs_jax_max_abs_diff": e1, "ask_tell_vs_simulate_max_abs_diff": e2,
"subprocess_best_energy": b, "dynamics_covered": k, ...}`` (e1 <= 1e-10, e2 <= 1e-12 when
written: about 2e-13 and 8e-14; k: the dynamics whose ask/tell loop matched simulate).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # float64 everywhere, the host objective's thread included

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import cbo_jax as cj  # noqa: E402

N, D, STEPS = 200, 10, 100
FAMILY = {  # every dynamics of the CBX family, with what it needs besides the objective
    "cbo": {}, "cbo_memory": {}, "pso": {}, "cbs": {}, "polar_cbo": {}, "adam_cbo": {}, "mirror_cbo": {},
    "drift_constrained_cbo": {"constraints": cj.constraints.sphere(1.0)}, "hypersurface_cbo": {},
    "reg_combination_cbo": {"constraints": cj.constraints.sphere(1.0), "eps": 0.1},
}


def numpy_rastrigin(x: np.ndarray) -> np.ndarray:
    """CBXpy's Rastrigin, (n, d) -> (n,), in NumPy."""
    return 10 * x.shape[1] + np.sum(x**2 - 10 * np.cos(2 * np.pi * x), axis=1)


def ask_tell_loop(at, x0, key, steps, f):
    ask, tell = jax.jit(at.ask), jax.jit(at.tell)
    state = at.start(x0, key)
    for _ in range(steps + 1):  # the first tell starts the run (the energies of x0)
        x, state = ask(state)
        state = tell(state, f(x))
    return state


def program_objective(workdir: Path):
    """An objective that runs a program: particles to a .npy file, energies back from another."""
    script = workdir / "score.py"
    script.write_text("import sys, numpy as np\n"
                      "x = np.load(sys.argv[1])\n"
                      "np.save(sys.argv[2], np.sum((x - 0.5) ** 2, axis=1))\n")

    def run(x):
        np.save(workdir / "x.npy", x)
        subprocess.run([sys.executable, str(script), str(workdir / "x.npy"), str(workdir / "e.npy")], check=True)
        return np.load(workdir / "e.npy")

    return cj.objectives.from_numpy(run, name="score.py")


def main() -> dict:
    f = cj.objectives.Rastrigin()
    x0 = np.random.default_rng(0).uniform(-3, 3, (N, D))
    ref = cj.simulate(cj.cbo(f, dtype="float64"), x0, 1, STEPS)

    host = cj.objectives.from_numpy(numpy_rastrigin)
    res = cj.simulate(cj.cbo(host, dtype="float64"), x0, 1, STEPS)
    e1 = float(np.max(np.abs(np.asarray(res.state.x) - np.asarray(ref.state.x))))
    print(f"NumPy objective: max |x - x_jax| = {e1:.2e} after {STEPS} steps, {host.calls} host calls", flush=True)

    state = ask_tell_loop(cj.ask_tell(cj.cbo, dtype="float64"), x0, 1, STEPS, f)
    e2 = float(np.max(np.abs(np.asarray(state.x) - np.asarray(ref.state.x))))
    print(f"ask/tell: max |x - x_simulate| = {e2:.2e}", flush=True)

    covered = []
    for name, kw in FAMILY.items():
        make = getattr(cj, name)
        small = x0[:30, :3] / (np.linalg.norm(x0[:30, :3], axis=1, keepdims=True) if name == "hypersurface_cbo" else 1)
        want = cj.simulate(make(f, dtype="float64", **kw), small, 2, 10).state
        got = ask_tell_loop(cj.ask_tell(make, dtype="float64", **kw), small, 2, 10, f)
        diff = float(np.max(np.abs(np.asarray(got.x) - np.asarray(want.x))))
        print(f"  {name:24s} ask/tell against simulate: {diff:.1e}", flush=True)
        if diff <= 1e-12:
            covered.append(name)

    # the clustered system (K = 2 classes: the losses told as (K, N)) and CB²O (L, then G: (2, N))
    from cbo_jax.dynamics.clustered import ClusteredConfig, particles

    lower = [cj.objectives.Quadratic(shift=c) for c in (-1.0, 1.0)]
    upper = cj.objectives.Quadratic(shift=0.3)
    for name, build, told, losses, cfg, p in (
            ("clustered", lambda c: cj.clustered(lower, c), lambda c: cj.ask_tell(cj.clustered, 2, c),
             lambda x: jnp.stack([g(x) for g in lower]), ClusteredConfig(sigma1=0.5, alpha=20.0, dtype="float64"),
             particles(x0[:24, :2], np.arange(24) % 2)),
            ("cb2o", lambda c: cj.cb2o(lower[0], upper, c), lambda c: cj.ask_tell(cj.cb2o, c),
             lambda x: jnp.stack([lower[0](x), upper(x)]),
             ClusteredConfig(sigma1=0.4, alpha=30.0, beta=0.5, dtype="float64"), particles(x0[:24, :2]))):
        want = cj.simulate(build(cfg), p, 2, 10).state
        got = ask_tell_loop(told(cfg), p, 2, 10, losses)
        diff = float(np.max(np.abs(np.asarray(got.x) - np.asarray(want.x))))
        print(f"  {name:24s} ask/tell against simulate: {diff:.1e}", flush=True)
        if diff <= 1e-12:
            covered.append(name)

    with tempfile.TemporaryDirectory() as tmp:
        program = program_objective(Path(tmp))
        sub = cj.minimize(program, dim=2, num_particles=50, num_steps=20, key=1)
    b = float(sub.state.best_energy)
    print(f"program objective: best energy {b:.3g} after {program.calls} runs of score.py", flush=True)
    return {"numpy_vs_jax_max_abs_diff": e1, "ask_tell_vs_simulate_max_abs_diff": e2, "subprocess_best_energy": b,
            "dynamics_covered": len(covered), "dynamics": covered, "host_calls": host.calls,
            "float64": bool(jnp.zeros(()).dtype == jnp.float64)}


if __name__ == "__main__":
    print(json.dumps(main()))
