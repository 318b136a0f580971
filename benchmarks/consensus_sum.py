"""How the consensus point's sum over N agents is rounded in float32, and what each form costs.

The consensus point of one population (FedCBO eq. (4): ``m_α = Σ_i ω_i θ_i / Σ_i ω_i``) is
a contraction of the weights ``(N,)`` with the rows ``(N, d)`` over the agent axis. Written
as one dot, XLA:CPU runs it as a matrix-vector product, whose rounding error grows with N
(as a running float32 sum's does). ``cbo_jax.population`` sums one combination of more
than 2**16 rows in blocks (``_rows_dot``: the rows reshaped to blocks of a divisor of N
between 256 and 8192, or a loop over blocks where N has none).

Three measurements, in one process:

1. ``contraction``: weights ``exp(-E)`` (E uniform on [0, 1), computed inside the timed
   program, as in a CBO step) and rows ``x ~ N(1, 1)`` (one sign on average, so a running
   sum's error is not cancelled), d = 10 and 20; three forms: ``dot`` (one tensordot, the form
   before), ``package`` (``_rows_dot``) and ``reduction`` (a multiply and ``jnp.sum``, tried
   first); each form's largest error relative to the float64 NumPy contraction and its best
   time of ``--repeats`` calls, the forms timed in turn.
2. ``consensus_point``: ``cj.consensus_point`` against float64 NumPy, Gibbs weights of
   ``E = ½|x - 1|²``, α = 1, d = 20, with one dot (the threshold raised to 2**40, the form
   before) and as the package sums it; also the Monte Carlo spread of the consensus itself,
   ``|m - 1|`` (what a mean-field study at that N resolves).
3. ``cbo_step``: CBO on Rastrigin, d = 10, 20 steps through ``cj.simulate``, at each N of
   ``--step-sizes`` (``particle_chunk`` 1e6 above 1e6), with one dot (threshold raised to
   2**40, the form before) and with the package's form, in alternating pairs, each compiled
   anew (``jax.clear_caches``); particle-steps per second, medians and the median ratio.

    python benchmarks/consensus_sum.py --json benchmarks/consensus_sum.json
    python benchmarks/consensus_sum.py --quick     # small sizes, seconds

Last line: JSON ``{"contraction": [...], "consensus_point": [...], "cbo_step": [...]}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_seconds  # noqa: E402

import cbo_jax as cj  # noqa: E402
from cbo_jax import population as pop  # noqa: E402
from cbo_jax.runtime import provenance  # noqa: E402

D_CONTRACTION, D_STEP = 20, 10


FORMS = {
    "dot": jax.jit(lambda e, x: jnp.tensordot(jnp.exp(-e), x, axes=(0, 0))),
    "package": jax.jit(lambda e, x: pop._rows_dot(jnp.exp(-e), x)),
    "reduction": jax.jit(lambda e, x: jnp.sum(jnp.exp(-e)[:, None] * x, axis=0)),
}


def contraction(sizes: list[int], dims: list[int], repeats: int, seed: int) -> list[dict]:
    rows = []
    for n in sizes:
        for d in dims:
            rng = np.random.default_rng(seed)
            x = rng.normal(size=(n, d)) + 1.0
            e = rng.random(n)
            ref = np.exp(-e) @ x
            e32, x32 = jnp.asarray(e, jnp.float32), jnp.asarray(x, jnp.float32)
            groups, block_rows = pop._blocks(n)
            form = ("one dot" if n <= pop._ROWS_SUMMED_IN_BLOCKS
                    else f"blocks of {block_rows}" if block_rows
                    else "a loop over blocks" + (f" in each of {groups} groups" if groups > 1 else ""))
            row: dict = {"N": n, "d": d, "package_form": form}
            for name, fn in FORMS.items():
                err = np.abs(np.asarray(fn(e32, x32), np.float64) - ref).max() / np.abs(ref).max()
                row[f"{name}_relative_error"] = float(err)
            times: dict = {name: [] for name in FORMS}
            for _ in range(repeats):  # in turn, so a change in the machine's load hits every form
                for name, fn in FORMS.items():
                    times[name].append(best_seconds(fn, e32, x32, repeats=1, warm=not times[name]))
            for name in FORMS:
                row[f"{name}_seconds"] = min(times[name])
            row["package_over_dot_time"] = round(row["package_seconds"] / row["dot_seconds"], 3)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def consensus(sizes: list[int], seed: int) -> list[dict]:
    rows = []
    default = pop._ROWS_SUMMED_IN_BLOCKS
    for n in sizes:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(n, D_CONTRACTION)) + 1.0
        e = 0.5 * np.sum((x - 1.0) ** 2, axis=1)
        w = np.exp(-(e - e.min()))
        ref = (w / w.sum()) @ x
        row: dict = {"N": n, "d": D_CONTRACTION}
        for name, threshold in (("dot", 1 << 40), ("package", default)):
            pop._ROWS_SUMMED_IN_BLOCKS = threshold
            jax.clear_caches()  # the threshold is read at trace time
            m = cj.consensus_point(jnp.asarray(x, jnp.float32), jnp.asarray(e, jnp.float32), 1.0)
            row[f"{name}_max_abs_error"] = float(np.abs(np.asarray(m, np.float64) - ref).max())
        pop._ROWS_SUMMED_IN_BLOCKS = default
        row["monte_carlo_spread"] = float(np.abs(ref - 1.0).max())
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def _steps_per_second(n: int, steps: int, seed: int) -> float:
    objective = cj.objectives.Rastrigin()
    chunk = 1_000_000 if n > 1_000_000 else None
    config = cj.CBOConfig(lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic", alpha=1e3, particle_chunk=chunk)
    dynamics = cj.cbo(objective, config)
    x0 = jax.random.uniform(jax.random.key(seed), (n, D_STEP), minval=-3.0, maxval=3.0)
    key = jax.random.key(seed + 1)
    jax.block_until_ready(cj.simulate(dynamics, x0, key, steps, progress=False).state.x)  # compiles
    t0 = time.perf_counter()
    jax.block_until_ready(cj.simulate(dynamics, x0, key, steps, progress=False).state.x)
    return n * steps / (time.perf_counter() - t0)


def cbo_step(sizes: list[int], steps: int, pairs: int, seed: int) -> list[dict]:
    rows = []
    default = pop._ROWS_SUMMED_IN_BLOCKS
    try:
        for n in sizes:
            rates: dict = {"dot": [], "package": []}
            for _ in range(pairs):
                for name, threshold in (("dot", 1 << 40), ("package", default)):
                    pop._ROWS_SUMMED_IN_BLOCKS = threshold
                    jax.clear_caches()  # the threshold is read at trace time
                    rates[name].append(_steps_per_second(n, steps, seed))
            row = {"N": n, "d": D_STEP, "steps": steps, "pairs": pairs,
                   "dot_particle_steps_per_s": float(np.median(rates["dot"])),
                   "package_particle_steps_per_s": float(np.median(rates["package"])),
                   "package_over_dot": round(float(np.median(np.array(rates["package"]) / np.array(rates["dot"]))), 3),
                   "pair_ratios": [round(p / q, 3) for p, q in zip(rates["package"], rates["dot"])]}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        pop._ROWS_SUMMED_IN_BLOCKS = default
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1e4,1e5,1e6,1000003,1e7,10000003",
                   help="N of the contraction and consensus rows (1000003 and 10000003 have no divisor in 256..8192)")
    p.add_argument("--dims", default="10,20", help="d of the contraction rows")
    p.add_argument("--step-sizes", default="1e6,1e7", help="N of the CBO step rows (empty: none)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--pairs", type=int, default=3, help="alternating (dot, package) runs per step size")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="N = 1e3, 1e5, 100003, d = 10; one step size 1e5, 5 steps, 1 pair")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.dims, args.step_sizes, args.steps, args.pairs, args.repeats = "1e3,1e5,100003", "10", "1e5", 5, 1, 2
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    step_sizes = [int(float(s)) for s in args.step_sizes.split(",") if s]
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
           "threshold": pop._ROWS_SUMMED_IN_BLOCKS, "block_rows": list(pop._BLOCK_ROWS),
           "environment": provenance.environment(),
           "contraction": contraction(sizes, [int(d) for d in args.dims.split(",") if d], args.repeats, args.seed),
           "consensus_point": consensus(sizes, args.seed),
           "cbo_step": cbo_step(step_sizes, args.steps, args.pairs, args.seed)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
