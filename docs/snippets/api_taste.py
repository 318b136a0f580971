import jax
import numpy as np
import cbo_jax as cj

# CBO on the 20-dimensional Rastrigin function, 100 independent runs in one vmapped program
config = cj.CBOConfig(
    lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic",
    alpha=cj.schedules.Multiplicative(alpha0=30.0, factor=1.05, alpha_max=1e5),
)
dynamics = cj.cbo(cj.objectives.Rastrigin(), config)      # a pure (init, step) pair

runs, N, d = 100, 40, 20
x0 = jax.random.uniform(jax.random.key(0), (runs, N, d), minval=-3, maxval=3)
result = cj.simulate(dynamics, x0, jax.random.key(1), num_steps=5000, num_runs=runs)

m = np.asarray(result.state.consensus)                    # (runs, d) consensus points
print("runs within 0.25 of the minimiser:", int((np.abs(m).max(axis=1) < 0.25).sum()))
print("best energy of run 0:", float(result.state.best_energy[0]))
