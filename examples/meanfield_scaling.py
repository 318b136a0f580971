"""Propagation of chaos (FedCBO Theorem 2.2): distance to a large-N reference vs N.

The class-0 particles of an N-particle clustered system at time T are compared with
those of a reference system (N_ref particles) by the sliced 1-Wasserstein distance;
the Monte-Carlo rate is N^(-1/2). Run:  python examples/meanfield_scaling.py
(the full study, N up to 1e5 against 1e6, with its plot: cbo-jax reproduce meanfield-scaling)
"""

import jax
import numpy as np

import cbo_jax as cj
from cbo_jax import meanfield, objectives
from cbo_jax.dynamics.clustered import ClusteredConfig, clustered, particles

d, steps = 2, 100
centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
dyn = clustered([objectives.RastriginNormalized(shift=c) for c in centers],
                ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.01, alpha=10.0, noise="isotropic"))


def class0_at_T(n, seed):
    p = particles(np.random.default_rng(seed).uniform(-3, 3, (n, d)), np.arange(n) % 2)
    x = np.asarray(cj.simulate(dyn, p, jax.random.key(seed), steps).state.x)
    return x[np.arange(n) % 2 == 0]


reference = class0_at_T(200_000, seed=123)
sizes, errors = [100, 1000, 10_000], []
for n in sizes:
    errs = [float(meanfield.sliced_wasserstein(class0_at_T(n, s), reference, jax.random.key(0))) for s in range(4)]
    errors.append(np.mean(errs))
    print(f"N={n:>6}: sliced W1 to reference {errors[-1]:.4f}")
print(f"slope of log(error) vs log(N): {meanfield.fit_loglog_slope(sizes, errors):.3f} (Monte-Carlo rate -0.5)")
