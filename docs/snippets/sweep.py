import jax.numpy as jnp
import numpy as np
import cbo_jax as cj

# Static structure: objective, noise kind, dtype, kind of α schedule. Numbers: a Params pytree.
config = cj.CBOConfig(lambda1=1.0, sigma1=1.0, dt=0.01, noise="anisotropic",
                      alpha=cj.schedules.Multiplicative(alpha0=30.0, factor=1.05, alpha_max=1e5))
dyn = cj.cbo(cj.objectives.Rastrigin(), config)

# σ1 × α0 × dt: a (6, 4, 2) grid around the config's own numbers; 16 seeds per point
grid = cj.params.grid(dyn, sigma1=np.linspace(0.2, 1.4, 6), alpha0=[1.0, 10.0, 30.0, 100.0], dt=[0.01, 0.02])
x0 = np.random.default_rng(0).uniform(-3, 3, (16, 40, 2))             # (runs, N, d), shared by every point
res = cj.simulate(dyn, x0, 0, 500, num_runs=16, params=grid)            # one jitted program: 48 points x 16 runs
success = (jnp.max(jnp.abs(res.state.consensus), axis=-1) < 0.25).mean(axis=-1)   # (6, 4, 2)
print(np.round(np.asarray(success[:, :, 0]), 2))                        # success rate, dt = 0.01

# Every entry is checked on the host first; this fails before anything is compiled:
sigma1 = grid.sigma1.copy()
sigma1[2, 1, 0] = -0.5
try:
    cj.simulate(dyn, x0, 0, 500, num_runs=16, params=grid._replace(sigma1=sigma1))
except ValueError as err:
    print(err)   # params.sigma1[2, 1, 0] = -0.5: sigma1 must be >= 0 (grid index (2, 1, 0) of a (6, 4, 2) grid)

# Random batches: each step's consensus from 10 random particles, only those move (CBXpy's batch_args)
rbm = cj.simulate(cj.cbo(cj.objectives.Rastrigin(), config, batch_size=10), x0, 0, 500, num_runs=16)

# A quick minimisation: a default population of 100 particles in [-3, 3]^d; f written for ONE particle
best = cj.minimize(lambda x: jnp.sum(x**2 - 10 * jnp.cos(2 * jnp.pi * x)) + 20, dim=2, key=0)
print(best.state.best_x)
