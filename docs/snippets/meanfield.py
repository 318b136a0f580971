import jax
import numpy as np
import cbo_jax as cj
from cbo_jax import meanfield

# Two quadratic classes in d = 2; the class label only picks the objective
d, N, steps, dt = 2, 4000, 300, 0.01
centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
objs = [cj.objectives.Quadratic(shift=c) for c in centers]
config = cj.ClusteredConfig(lambda1=1.0, sigma1=0.5, dt=dt, alpha=1e4, noise="isotropic")
label = np.arange(N) % 2
x0 = centers[label] + np.random.default_rng(0).uniform(-1, 1, (N, d))
p = cj.particles(x0, label=label)

observe = lambda s: {"V": meanfield.class_variance(s.x, s.label, centers).sum()}   # V(ρ¹_t) + V(ρ²_t)
dyn = cj.clustered(objs, config)
res = cj.simulate(dyn, p, jax.random.key(0), steps, observe=observe)
t = dt * np.arange(1, steps + 1)
print("fitted rate:", meanfield.fit_decay_rate(t, np.asarray(res.history["V"])))
print("Theorem 2.3 rate:", meanfield.predicted_decay_rate(dyn, d=d, lipschitz=1.0))   # the config's numbers and noise

# Theorem 2.2: distance of N-particle empirical measures to a large reference sample (mean of 5 samples per N)
ref = meanfield.SlicedReference(np.random.default_rng(1).normal(size=(100_000, d)), jax.random.key(1))
sizes = [100, 1000, 10_000]
err = [np.mean([float(ref.distance(np.random.default_rng([n, s]).normal(size=(n, d)))) for s in range(5)])
       for n in sizes]
print("sliced W1:", np.round(err, 4), "log-log slope:", meanfield.fit_loglog_slope(sizes, err))
