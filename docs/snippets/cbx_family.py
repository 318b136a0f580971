import numpy as np
import cbo_jax as cj

f = cj.objectives.Himmelblau()                                       # four global minima in R^2
x0 = np.random.default_rng(0).uniform(-5, 5, (8, 200, 2))           # 8 runs of 200 particles

# Every CBXpy dynamic is a builder returning an (init, step) pair for cj.simulate
pso = cj.pso(f, alpha=30.0, sigma1=0.5, m=0.05)
res = cj.simulate(pso, x0, 0, 500, num_runs=8)                       # 8 runs, vmapped, one program
print(res.state.best_energy)                                         # (8,) best energies

# PolarCBO: one consensus point per particle, several minima in one run
polar = cj.polar_cbo(f, kappa=0.5, alpha=1.0, kernel_factor="const", sigma1=0.5, dt=0.05)
res = cj.simulate(polar, x0[0], 0, 600)
print(np.round(np.unique(np.round(np.asarray(res.state.x), 1), axis=0), 1))  # the minima it found

# A dynamic's own numbers sweep like λ1, σ1, dt: here the kernel width, 3 values x 8 runs
grid = cj.params.grid(polar, kappa=[0.25, 0.5, 1.0])
swept = cj.simulate(polar, x0, 0, 300, num_runs=8, params=grid)     # state.x: (3, 8, 200, 2)

# Constraints are functions; mirror maps are names (CBXpy's) or your own pair of functions
f2 = cj.objectives.Ackley(shift=1.0)                                 # minimiser (1, 1), outside the unit ball
dc = cj.drift_constrained_cbo(f2, constraints=cj.constraints.sphere(1.0), alpha=30.0)
mirror = cj.mirror_cbo(f2, mirror_map={"name": "ProjectionBall", "radius": 1.0}, alpha=30.0)
for dyn in (dc, mirror):
    r = cj.simulate(dyn, x0[0] / 5, 0, 500)
    print(np.round(np.asarray(r.state.consensus), 3))              # near (1, 0) or (0, 1): lowest on the circle/disk

# CBXpy's options: noise models, corrections, schedules of any number, resampling, termination
cbo = cj.cbo(f, noise="covariance", correction="heaviside", alpha=30.0,
             schedule={"sigma1": cj.schedules.Multiply(0.99, minimum=0.1)},
             resampling=cj.resampling.Resampling(cj.resampling.LossStagnation(wait_thresh=20), sigma=0.5),
             max_evals=50_000, stagnation_patience=20)
res = cj.simulate(cbo, x0, 0, 1000, num_runs=8)
print(res.history["evals"][-1], res.history["resamplings"][-1], res.state.params.sigma1)
