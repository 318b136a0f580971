"""Where does one CBO step spend its time?  (Rastrigin, N=1e4, d=20, float32, CPU.)

Each piece of the step is timed in isolation inside its own jitted ``lax.scan`` of
``K`` iterations, and the per-step time is ``(best wall time) / K``. To keep XLA
from constant-folding a piece or hoisting it out of the loop as loop-invariant, every
piece reads a value from the scan carry and writes something back that the next
iteration reads:

* noise:      ``key, sub = split(key); x <- x + 1e-3 * normal(sub)``  (threefry,
              timed under the "fast" non-partitionable layout and the partitionable one)
* objective:  ``E = f(x + s); s <- s + 1e-9 * mean(E)``
* consensus:  ``m = consensus_point(x, E, alpha); E <- E + 1e-12 * m[0];
              alpha <- min(1.05 alpha, 1e5)``  (Gibbs weights + weighted mean)
* update:     the Euler-Maruyama arithmetic alone with a fixed normal draw ``z``
              (passed as an argument, so it is not a compile-time constant):
              ``x <- x - l dt (x - m) + s sqrt(dt) (x - m) z; m <- m + 1e-9 x[0]``
* noise+update: the draw and the update together, as they sit in the real step
              (the normals fuse into the update, which broadcasts the consensus point
              over rows); both rng layouts
* full step:  ``dyn.step`` of :func:`cbo_jax.cbo` (both rng layouts), and the same
              through :func:`cbo_jax.simulate` (chunked scan + per-step history).

The pieces carry a tiny extra cost (an axpy or a scalar reduction) so their sum can
slightly exceed the step; the "rest" row is ``full - (noise + objective + consensus
+ update)`` (key split, best-particle tracking, alpha schedule, loop overhead).

"What-if" rows (NOT cbo_jax behaviour; written here to size two kernel issues):

* a Rastrigin whose ``cos(2 pi z)`` is an exact period-1 reduction plus an even
  polynomial, to show how much of the step is XLA's scalar ``cos``;
* the full step with the normals drawn as ``normal(key, (d, N)).T`` instead of
  ``normal(key, (N, d))`` (done by swapping ``cbo_jax.sde.normal_like`` for this
  process only while the what-if step is traced), which avoids a slow XLA:CPU fusion
  of the non-partitionable threefry output with the row-broadcast of the consensus
  point;
* both together.

Pieces are timed in interleaved rounds (every piece once per round, ``repeats``
rounds) and the minimum is kept, because the 2-core machine is shared and noisy.

Run:  python benchmarks/profile_cbo_step.py [--n 10000] [--dim 20] [--k 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.provenance import environment

# The library's own settings for the benchmark problem (issue 2).
LAMBDA, SIGMA, DT = 1.0, 10.1, 0.01
ALPHA0, ALPHA_FACTOR, ALPHA_MAX = 30.0, 1.05, 1e5


def bench_config(dtype: str = "float32", rng: str = "fast") -> cj.CBOConfig:
    return cj.CBOConfig(
        lambda1=LAMBDA,
        sigma1=SIGMA,
        dt=DT,
        noise="anisotropic",
        alpha=cj.schedules.Multiplicative(ALPHA0, ALPHA_FACTOR, ALPHA_MAX),
        dtype=dtype,
        rng=rng,
    )


# --------------------------------------------------------------------------- what-if
def cos_2pi_poly(z):
    """``cos(2 pi z)`` via exact reduction ``z - round(z)`` and a Taylor polynomial.

    ``t = |z - round(z)|`` lies in ``[0, 1/2]`` and is exact in floating point; the
    quadrant fold ``t -> 1/2 - t`` (with a sign flip) brings ``u = 2 pi t`` into
    ``[0, pi/2]`` where the even Taylor series converges fast (degree 12 for float32,
    20 for float64). NaN/inf propagate to NaN like ``cos``.
    """
    t = jnp.abs(z - jnp.round(z))
    flip = t > 0.25
    t = jnp.where(flip, 0.5 - t, t)
    u = (2.0 * math.pi) * t
    u2 = u * u
    terms = 7 if z.dtype == jnp.float32 else 11
    coeffs = [(-1) ** k / math.factorial(2 * k) for k in range(terms)]
    p = jnp.full_like(u2, coeffs[-1])
    for c in coeffs[-2::-1]:
        p = p * u2 + c
    return jnp.where(flip, -p, p)


def rastrigin_poly(x):
    """CBXpy's un-normalised Rastrigin with the polynomial cos (what-if, not cbo_jax)."""
    return 10.0 * x.shape[-1] + jnp.sum(x * x - 10.0 * cos_2pi_poly(x), axis=-1)


def _normal_like_transposed(key, tree):
    """Like ``cbo_jax.sde.normal_like`` but 2-D leaves are drawn as ``(d, N)`` then transposed."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves)) if len(leaves) > 1 else [key]
    out = []
    for k, leaf in zip(keys, leaves):
        if leaf.ndim == 2:
            out.append(jax.random.normal(k, leaf.shape[::-1], leaf.dtype).T)
        else:
            out.append(jax.random.normal(k, leaf.shape, leaf.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


@contextlib.contextmanager
def _transposed_normals():
    """Trace-time swap of ``cbo_jax.sde.normal_like`` (what-if only; restored on exit)."""
    import cbo_jax.sde as sde

    original = sde.normal_like
    sde.normal_like = _normal_like_transposed
    try:
        yield
    finally:
        sde.normal_like = original


# --------------------------------------------------------------------------- timing
def _scan_fn(body, length):
    def run(carry, *args):
        def step(c, _):
            return body(c, *args), None

        return jax.lax.scan(step, carry, None, length=length)[0]

    return jax.jit(run)


class _Piece:
    """A jitted K-step scan of one piece, compiled under its rng layout."""

    def __init__(self, name, body, carry, args=(), partitionable=False, length=200):
        self.name = name
        self.partitionable = partitionable
        self.length = length
        self.carry = carry
        self.args = args
        self.fn = _scan_fn(body, length)
        self.best = math.inf
        with jax.threefry_partitionable(partitionable):
            jax.block_until_ready(self.fn(carry, *args))  # compile + warm

    def time_once(self):
        with jax.threefry_partitionable(self.partitionable):
            t0 = time.perf_counter()
            jax.block_until_ready(self.fn(self.carry, *self.args))
            dt = time.perf_counter() - t0
        self.best = min(self.best, dt / self.length)
        return dt


class _SimulatePiece:
    """Per-step time through ``cj.simulate`` (chunked scan, history recording)."""

    def __init__(self, name, dyn, x0, length):
        self.name = name
        self.dyn, self.x0, self.length = dyn, x0, length
        self.best = math.inf
        self._call()  # compile + warm

    def _call(self):
        res = cj.simulate(self.dyn, self.x0, jax.random.key(1), self.length, chunk_size=self.length)
        jax.block_until_ready(res.state)

    def time_once(self):
        t0 = time.perf_counter()
        self._call()
        dt = time.perf_counter() - t0
        self.best = min(self.best, dt / self.length)
        return dt


def profile_step(n: int = 10_000, d: int = 20, k: int = 200, repeats: int = 5, seed: int = 0) -> dict:
    """Time the pieces of one float32 CBO step; returns a dict of milliseconds per step."""
    from cbo_jax.consensus import consensus_point

    dtype = jnp.float32
    rng = np.random.default_rng(seed)
    x0_np = rng.uniform(-3.0, 3.0, (n, d))
    x0 = jnp.asarray(x0_np, dtype)
    z_fixed = jnp.asarray(rng.standard_normal((n, d)), dtype)
    objective = cj.objectives.Rastrigin()
    e0 = objective(x0)
    m0 = jnp.mean(x0, axis=0)
    key0 = jax.random.key(1)

    def noise(c):
        x, key = c
        key, sub = jax.random.split(key)
        return x + 1e-3 * jax.random.normal(sub, x.shape, x.dtype), key

    def make_objective(f):
        def body(c):
            x, s = c
            e = f(x + s)
            return x, s + 1e-9 * jnp.mean(e)

        return body

    def consensus(c):
        x, e, alpha = c
        m = consensus_point(x, e, alpha)
        return x, e + 1e-12 * m[0], jnp.minimum(alpha * ALPHA_FACTOR, ALPHA_MAX).astype(alpha.dtype)

    def update(c, z):
        x, m = c
        u = x - m
        x = x - (LAMBDA * DT) * u + (SIGMA * math.sqrt(DT)) * u * z
        return x, m + 1e-9 * x[0]

    def noise_update(c):
        x, m, key = c
        key, sub = jax.random.split(key)
        z = jax.random.normal(sub, x.shape, x.dtype)
        u = x - m
        x = x - (LAMBDA * DT) * u + (SIGMA * math.sqrt(DT)) * u * z
        return x, m + 1e-9 * x[0], key

    dyn_fast = cj.cbo(objective, bench_config("float32", "fast"))
    dyn_part = cj.cbo(objective, bench_config("float32", "partitionable"))
    dyn_poly = cj.cbo(rastrigin_poly, bench_config("float32", "fast"))
    dyn_tnorm = cj.cbo(objective, bench_config("float32", "fast"))  # traced with transposed draws
    dyn_both = cj.cbo(rastrigin_poly, bench_config("float32", "fast"))
    with jax.threefry_partitionable(False):
        s_fast = dyn_fast.init(x0, key0)
        s_poly = dyn_poly.init(x0, key0)
    with jax.threefry_partitionable(True):
        s_part = dyn_part.init(x0, key0)

    zero = jnp.zeros((), dtype)
    pieces = [
        _Piece("noise (threefry fast)", noise, (x0, key0), partitionable=False, length=k),
        _Piece("noise (threefry partitionable)", noise, (x0, key0), partitionable=True, length=k),
        _Piece("objective (Rastrigin, jnp.cos)", make_objective(objective), (x0, zero), length=k),
        _Piece("consensus (weights + weighted mean)", consensus, (x0, e0, jnp.asarray(ALPHA0, dtype)), length=k),
        _Piece("update arithmetic (Euler-Maruyama, fixed z)", update, (x0, m0), args=(z_fixed,), length=k),
        _Piece("noise+update fused (rng=fast)", noise_update, (x0, m0, key0), partitionable=False, length=k),
        _Piece("noise+update fused (rng=partitionable)", noise_update, (x0, m0, key0), partitionable=True, length=k),
        _Piece("full step (rng=fast)", dyn_fast.step, s_fast, partitionable=False, length=k),
        _Piece("full step (rng=partitionable)", dyn_part.step, s_part, partitionable=True, length=k),
        _SimulatePiece("full step via simulate() (rng=fast)", dyn_fast, x0_np, k),
        _Piece("what-if: objective with polynomial cos", make_objective(rastrigin_poly), (x0, zero), length=k),
        _Piece("what-if: full step, polynomial-cos Rastrigin", dyn_poly.step, s_poly, partitionable=False, length=k),
    ]
    with _transposed_normals():  # compiled (traced) inside the swap; timed later
        pieces += [
            _Piece("what-if: full step, transposed normal draw", dyn_tnorm.step, s_fast, partitionable=False, length=k),
            _Piece("what-if: full step, both", dyn_both.step, s_poly, partitionable=False, length=k),
        ]
    for _ in range(repeats):
        for p in pieces:
            p.time_once()
    ms = {p.name: p.best * 1e3 for p in pieces}

    full_fast = ms["full step (rng=fast)"]
    full_part = ms["full step (rng=partitionable)"]
    parts_fast = {
        "noise": ms["noise (threefry fast)"],
        "objective": ms["objective (Rastrigin, jnp.cos)"],
        "consensus": ms["consensus (weights + weighted mean)"],
        "update": ms["update arithmetic (Euler-Maruyama, fixed z)"],
    }
    rest = full_fast - sum(parts_fast.values())
    fused_penalty = ms["noise+update fused (rng=fast)"] - parts_fast["noise"] - parts_fast["update"]
    rest_after_fused = full_fast - ms["noise+update fused (rng=fast)"] - parts_fast["objective"] - parts_fast["consensus"]
    both = ms["what-if: full step, both"]
    return {
        "n": n,
        "d": d,
        "dtype": "float32",
        "scan_length": k,
        "repeats": repeats,
        "ms_per_step": ms,
        "fraction_of_full_step_fast": {**{kk: v / full_fast for kk, v in parts_fast.items()}, "rest": rest / full_fast},
        "noise_fraction_of_full_step_partitionable": ms["noise (threefry partitionable)"] / full_part,
        "rest_ms_fast": rest,
        "noise_speedup_fast_vs_partitionable": ms["noise (threefry partitionable)"] / ms["noise (threefry fast)"],
        "full_step_speedup_fast_vs_partitionable": full_part / full_fast,
        "objective_speedup_poly_cos": ms["objective (Rastrigin, jnp.cos)"] / ms["what-if: objective with polynomial cos"],
        "full_step_speedup_poly_cos": full_fast / ms["what-if: full step, polynomial-cos Rastrigin"],
        "particle_steps_per_s_full_step_fast": n / (full_fast * 1e-3),
        "particle_steps_per_s_full_step_poly_cos": n / (ms["what-if: full step, polynomial-cos Rastrigin"] * 1e-3),
        "fast_noise_update_fusion_penalty_ms": fused_penalty,
        "rest_after_fused_ms_fast": rest_after_fused,
        "full_step_speedup_transposed_draw": full_fast / ms["what-if: full step, transposed normal draw"],
        "full_step_speedup_both": full_fast / both,
        "particle_steps_per_s_full_step_both": n / (both * 1e-3),
    }


def format_profile(p: dict) -> str:
    ms = p["ms_per_step"]
    full_fast = ms["full step (rng=fast)"]
    full_part = ms["full step (rng=partitionable)"]
    partitionable_rows = {
        "noise (threefry partitionable)",
        "noise+update fused (rng=partitionable)",
        "full step (rng=partitionable)",
    }
    lines = [
        f"Step profile: Rastrigin N={p['n']}, d={p['d']}, {p['dtype']}, best of {p['repeats']} x {p['scan_length']}-step scans",
        f"{'piece':48s} {'ms/step':>9s} {'% of step':>10s}",
        "-" * 69,
    ]
    for name, v in ms.items():
        if name in partitionable_rows:
            lines.append(f"{name:48s} {v:9.3f} {100 * v / full_part:9.1f}% (of the partitionable step)")
        else:
            lines.append(f"{name:48s} {v:9.3f} {100 * v / full_fast:9.1f}%")
    lines.append(f"{'rest = full(fast) - noise - objective - consensus - update':48s} {p['rest_ms_fast']:9.3f} "
                 f"{100 * p['fraction_of_full_step_fast']['rest']:9.1f}%")
    lines.append(
        f"noise: fast layout is {p['noise_speedup_fast_vs_partitionable']:.2f}x faster than partitionable; "
        f"full step: {p['full_step_speedup_fast_vs_partitionable']:.2f}x"
    )
    lines.append(
        f"{'rest = full(fast) - noise+update fused - objective - consensus':48s} {p['rest_after_fused_ms_fast']:9.3f} "
        f"{100 * p['rest_after_fused_ms_fast'] / full_fast:9.1f}%"
    )
    lines.append(
        f"fast layout: noise+update fused costs {p['fast_noise_update_fusion_penalty_ms']:.3f} ms more than "
        f"noise and update apart (slow XLA:CPU fusion; see docstring)"
    )
    lines.append(
        f"what-if transposed draw: full step {p['full_step_speedup_transposed_draw']:.2f}x faster; "
        f"both what-ifs: {p['full_step_speedup_both']:.2f}x "
        f"({p['particle_steps_per_s_full_step_both'] / 1e6:.2f} M particle-steps/s)"
    )
    lines.append(
        f"what-if polynomial cos: objective {p['objective_speedup_poly_cos']:.1f}x faster, "
        f"full step {p['full_step_speedup_poly_cos']:.2f}x faster "
        f"({p['particle_steps_per_s_full_step_fast'] / 1e6:.2f} -> "
        f"{p['particle_steps_per_s_full_step_poly_cos'] / 1e6:.2f} M particle-steps/s)"
    )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="particles (default 10000)")
    ap.add_argument("--dim", type=int, default=20, help="dimension (default 20)")
    ap.add_argument("--k", type=int, default=200, help="steps per timed scan (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds, best kept (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the profile as JSON")
    args = ap.parse_args(argv)
    p = profile_step(args.n, args.dim, args.k, args.repeats)
    print(format_profile(p))
    p["environment"] = environment()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(p, fh, indent=2)
    print(json.dumps({"profile": p}))


if __name__ == "__main__":
    main()
