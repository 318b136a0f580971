"""Quickstart: minimise Rastrigin in d=20 with 100 independent CBO runs at once.

Run:  python examples/quickstart.py
"""

import jax
import numpy as np

import cbo_jax as cj

config = cj.CBOConfig(
    lambda1=1.0,            # consensus drift λ1
    sigma1=10.1,            # anisotropic noise σ1: σ1 (x - m) ∘ dB
    dt=0.01,
    noise="anisotropic",
    alpha=cj.schedules.Multiplicative(alpha0=30.0, factor=1.05, alpha_max=1e5),
)
dynamics = cj.cbo(cj.objectives.Rastrigin(), config)   # a pure (init, step) pair

runs, particles, dim = 100, 40, 20
x0 = jax.random.uniform(jax.random.key(0), (runs, particles, dim), minval=-3.0, maxval=3.0)
result = cj.simulate(dynamics, x0, jax.random.key(1), num_steps=5000, num_runs=runs, progress=True)

m = np.asarray(result.state.consensus)                  # (runs, dim) final consensus points
print("successes:", int(np.sum(np.abs(m).max(axis=1) < 0.25)), "of", runs)
print("best energy per run (first 5):", np.asarray(result.state.best_energy)[:5])
