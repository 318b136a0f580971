"""Pinned final particles of CBO, the clustered system and CB²O (fixed seeds, tiny sizes).

``tests/data/regression_particles.npz`` holds the final positions of each case below,
written by ``python tests/dynamics/test_regression_particles.py --write`` with the code as it was
before the parameter pytree (issue 14) was introduced. Any later change to the dynamics
must keep these numbers. float64 cases are compared to 1e-12 (the tolerance leaves room
for another CPU's vectorisation); float32 cases to 2e-6. Two cases run by default, all
ten with ``pytest -m slow``.

When the numbers moved into a traced pytree (issue 14), every float64 case stayed
bitwise equal; float32 too, except ``cbo_per_particle_const`` (6e-8 after 25 steps):
``λ1·dt`` is now the float32 product of the two float32 numbers, where the Python
floats of the config rounded the float64 product (``1.1 * 0.05``: one ulp apart).

When the default noise layout became ``"counter"`` (issue 59), the four cases on the default
layout were re-pinned (other draws, another trajectory); ``cbo_per_particle_const``, whose
``rng="per-particle"`` draws did not change, keeps its numbers (bitwise in float64), which the
new step (in blocks or not) reproduces.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives, schedules
from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, cb2o, clustered, particles

if __name__ == "__main__":  # run as a script (--write, below): the test helpers are in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stack import enable_x64  # noqa: E402


DATA = Path(__file__).resolve().parents[1] / "data" / "regression_particles.npz"
STEPS = 25


def _x(shape, seed):
    return np.random.default_rng(seed).uniform(-2.0, 2.0, shape)


def _cbo_aniso_mult(dtype):
    cfg = cj.CBOConfig(lambda1=0.7, sigma1=1.3, dt=0.03, noise="anisotropic",
                       alpha=schedules.Multiplicative(5.0, 1.1, 50.0), dtype=dtype)
    x0 = _x((2, 12, 3), 0).astype(dtype)
    return cj.simulate(cj.cbo(objectives.Rastrigin(), cfg), x0, jax.random.key(3), STEPS, num_runs=2).state.x


def _cbo_iso_grad_ess(dtype):
    cfg = cj.CBOConfig(lambda1=0.9, sigma1=0.4, dt=0.02, noise="isotropic", lambda2=0.3, sigma2=0.2,
                       alpha=schedules.EffectiveSampleSize(eta=0.4), dtype=dtype)
    x0 = _x((10, 4), 1).astype(dtype)
    return cj.simulate(cj.cbo(objectives.Ackley(shift=0.3), cfg), x0, jax.random.key(4), STEPS).state.x


def _cbo_per_particle_const(dtype):
    cfg = cj.CBOConfig(lambda1=1.1, sigma1=0.8, dt=0.05, noise="anisotropic", alpha=7.0, rng="per-particle",
                       max_abs=1.5, dtype=dtype)
    x0 = _x((9, 2), 2).astype(dtype)
    return cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), cfg), x0, jax.random.key(5), STEPS).state.x


def _clustered_grad(dtype):
    centers = np.array([[1.0, 0.5], [-1.0, -0.5]])
    cfg = ClusteredConfig(lambda1=0.9, sigma1=0.6, lambda2=0.2, sigma2=0.1, dt=0.02, noise="isotropic",
                          alpha=schedules.Multiplicative(3.0, 1.2, 80.0), dtype=dtype)
    dyn = clustered([objectives.Quadratic(shift=c) for c in centers], cfg)
    x0 = _x((10, 2), 3)
    return cj.simulate(dyn, particles(x0, np.arange(10) % 2), jax.random.key(6), STEPS).state.x


def _cb2o_malicious(dtype):
    a = np.array([1.0, 1.0, 1.0])

    def lower(x):
        return jnp.sum((x - a) ** 2, -1) * jnp.sum((x + a) ** 2, -1)

    def upper(x):
        return jnp.sum((x - a) ** 2, -1)

    attack = Malicious(drift=lambda t, x: -2.0 * (x + jnp.asarray(a, x.dtype)),
                       diffusion=lambda t, x: jnp.full(x.shape[0], 0.1, x.dtype))
    cfg = ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.03, alpha=20.0, beta=0.5, noise="anisotropic", dtype=dtype)
    x0 = _x((12, 3), 4)
    mal = np.arange(12) % 4 == 0
    return cj.simulate(cb2o(lower, upper, cfg, malicious=attack), particles(x0, malicious=mal), jax.random.key(7),
                       STEPS).state.x


CASES = {
    "cbo_aniso_mult": _cbo_aniso_mult,
    "cbo_iso_grad_ess": _cbo_iso_grad_ess,
    "cbo_per_particle_const": _cbo_per_particle_const,
    "clustered_grad": _clustered_grad,
    "cb2o_malicious": _cb2o_malicious,
}


def compute_all() -> dict[str, np.ndarray]:
    out = {}
    for name, fn in CASES.items():
        out[f"{name}/float32"] = np.asarray(fn("float32"))
        with enable_x64(True):
            out[f"{name}/float64"] = np.asarray(fn("float64"))
    return out


# In the default run: the two float64 cases that cover the most (gradient terms and the ESS
# schedule; the bi-level consensus with attackers); the rest are marked slow (each case is
# two compilations).
DEFAULT = {("cbo_iso_grad_ess", "float64"), ("cb2o_malicious", "float64")}


@pytest.mark.parametrize("name,dtype", [(n, t) if (n, t) in DEFAULT else pytest.param(n, t, marks=pytest.mark.slow)
                                        for n in sorted(CASES) for t in ("float32", "float64")])
def test_final_particles_are_pinned(name, dtype, optimized_xla):
    expected = np.load(DATA)[f"{name}/{dtype}"]
    if dtype == "float64":
        with enable_x64(True):
            got = np.asarray(CASES[name](dtype))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    else:
        got = np.asarray(CASES[name](dtype))
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)
    assert got.dtype == np.dtype(dtype)


if __name__ == "__main__":  # python tests/dynamics/test_regression_particles.py --write [PATH]
    if len(sys.argv) >= 2 and sys.argv[1] == "--write":
        path = Path(sys.argv[2]) if len(sys.argv) > 2 else DATA
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **compute_all())
        print(f"wrote {path}")
    else:
        print(__doc__)
