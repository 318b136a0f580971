"""XLA:CPU's two code generators on this package's programs: compile time, run time, bits.

XLA:CPU compiles fusions with its MLIR fusion emitters by default; the flag
``xla_cpu_use_fusion_emitters=false`` selects the older elemental IR emitter instead.
The test suite is compile-bound (tiny arrays, about a thousand distinct programs), so
``tests/conftest.py`` uses the legacy emitter for the default test run; this script
measures what that trades, in one process, program by program:

- each program is lowered once per side and compiled with
  ``Lowered.compile(compiler_options={"xla_cpu_use_fusion_emitters": False})`` for the
  legacy side and with no options for the default side (the option applies to that one
  compilation only: both sides live in the same process, under the same load);
- compile time: the minimum over ``--compiles`` compilations of each side, alternating,
  each after ``jax.clear_caches()`` (JAX keeps the executable of a module it compiled);
- run time: the minimum over ``--cycles`` cycles of ``--repeats`` calls, the two sides
  alternating cycle by cycle;
- ``bitwise_equal``: every output leaf of the two sides equal bit for bit (NaN = NaN).

Programs: the tests' tiny FedCBO round and its ``init`` (the model and data of
tests/_federated_variants.py: MLP 2-4-2, 13 agents), 100 CBO steps on Rastrigin
(d = 20, N = 1e3, 1e4, 1e5; anisotropic noise), and a FedCBO round on MNIST-sized data
(MLP 784-200-10, N = 48 agents of 200 images, M = 8 downloads, τ = 2 local epochs).

``--one-compile``: instead, compile the tests' FedCBO round and ``init`` once each in this
process, under whatever ``XLA_FLAGS`` it was started with (no ``compiler_options``), and
print the seconds: run it once with and once without
``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false``, for the flag as the test run sets it.

The last line is one JSON object; ``--json PATH`` writes it to a file too.
``python benchmarks/xla_cpu_emitters.py --quick``: the tiny programs and N = 1e3 only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax import models
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.provenance import environment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import best_seconds  # noqa: E402

LEGACY = {"xla_cpu_use_fusion_emitters": False}


def _compile(lowered, legacy: bool):
    t = time.perf_counter()
    c = lowered.compile(compiler_options=LEGACY) if legacy else lowered.compile()
    return c, time.perf_counter() - t


def _equal(a, b) -> bool:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        if not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True):
            return False
    return True


def measure(name: str, fn, args, *, compiles: int, cycles: int, repeats: int) -> dict:
    """Both sides of one program (see the module docstring)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    exe = {}
    for _ in range(compiles):
        for legacy in (False, True):
            jax.clear_caches()  # else a second compilation of the same module is JAX's cached executable
            exe[legacy], dt = _compile(jax.jit(fn).lower(*args), legacy)
            times[legacy].append(dt)
    outs = {legacy: jax.block_until_ready(exe[legacy](*args)) for legacy in (False, True)}
    run: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(cycles):
        for legacy in (False, True):
            run[legacy].append(best_seconds(exe[legacy], *args, repeats=repeats, warm=False))
    row = {
        "program": name,
        "compile_s_default": round(min(times[False]), 4),
        "compile_s_legacy": round(min(times[True]), 4),
        "compile_ratio_legacy_over_default": round(min(times[True]) / min(times[False]), 3),
        "run_s_default": min(run[False]),
        "run_s_legacy": min(run[True]),
        "run_ratio_legacy_over_default": round(min(run[True]) / min(run[False]), 3),
        "bitwise_equal": _equal(outs[False], outs[True]),
    }
    print(json.dumps(row), flush=True)
    return row


def _tiny_fedcbo():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import _federated_variants as fv  # the tests' own model and data

    data = fv.clustered_data().train
    alg = fedcbo(fv.MODEL, FedCBOConfig(M=3, local=fv.LOC), data.num_agents)
    state = jax.jit(alg.init)(jax.random.key(0))
    return alg, state, data


def _mnist_fedcbo(n_agents: int = 48, n: int = 200, m: int = 8, epochs: int = 2):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n_agents, n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, (n_agents, n)).astype(np.int32)
    data = AgentData(jnp.asarray(x), jnp.asarray(y), jnp.full((n_agents,), n, jnp.int32))
    alg = fedcbo(models.mlp_mnist(), FedCBOConfig(M=m, local=LocalSGDConfig(epochs=epochs)), n_agents)
    return alg, jax.jit(alg.init)(jax.random.key(0)), data


def _cbo_steps(n: int, d: int = 20, steps: int = 100):
    dyn = cj.cbo(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=1.0, dt=0.01, alpha=30.0, noise="anisotropic")
    state = dyn.init(jax.random.uniform(jax.random.key(0), (n, d), minval=-3, maxval=3), jax.random.key(1))

    def run(s):
        return jax.lax.scan(lambda s, _: (dyn.step(s), None), s, None, length=steps)[0]

    return run, state


def _one_compile(path) -> dict:
    """The tests' FedCBO round and init, each lowered and compiled once (the process's flags)."""
    alg, state, data = _tiny_fedcbo()
    out: dict = {"benchmark": "xla_cpu_emitters --one-compile", "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    for name, fn, args in (("round", alg.round, (state, data)), ("init", alg.init, (jax.random.key(0),))):
        jax.clear_caches()  # init was compiled once already, to make the state
        lowered = jax.jit(fn).lower(*args)
        t = time.perf_counter()
        lowered.compile()
        out[f"{name}_compile_s"] = round(time.perf_counter() - t, 3)
    out["environment"] = environment()
    line = json.dumps(out)
    if path:
        Path(path).write_text(line + "\n")
    print(line)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny programs and N = 1e3 only (< 1 min)")
    ap.add_argument("--compiles", type=int, default=3, help="compilations per side, min reported (default 3)")
    ap.add_argument("--cycles", type=int, default=3, help="alternating timing cycles (default 3)")
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    ap.add_argument("--one-compile", action="store_true",
                    help="compile the tests' FedCBO round and init once each under this process's XLA_FLAGS")
    args = ap.parse_args(argv)
    if args.one_compile:
        return _one_compile(args.json)
    kw = dict(compiles=args.compiles, cycles=args.cycles)
    rows = []
    alg, state, data = _tiny_fedcbo()
    rows.append(measure("tests: FedCBO round (MLP 2-4-2, N=13, M=3)", alg.round, (state, data), repeats=20, **kw))
    rows.append(measure("tests: FedCBO init (MLP 2-4-2, N=13)", alg.init, (jax.random.key(0),), repeats=20, **kw))
    for n in (1000,) if args.quick else (1000, 10000, 100000):
        run, st = _cbo_steps(n)
        rows.append(measure(f"CBO Rastrigin d=20 N={n}, 100 steps", run, (st,), repeats=3, **kw))
    if not args.quick:
        alg, state, data = _mnist_fedcbo()
        rows.append(measure("FedCBO round, MLP 784-200-10, N=48 x 200 images, M=8, tau=2", alg.round, (state, data),
                            repeats=2, **kw))
    out = {"benchmark": "xla_cpu_emitters", "rows": rows, "load_average": list(os.getloadavg()),
           "environment": environment()}
    line = json.dumps(out)
    if args.json:
        Path(args.json).write_text(line + "\n")
    print(line)
    return out


if __name__ == "__main__":
    main()
