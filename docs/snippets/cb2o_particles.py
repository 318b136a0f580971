import jax
import jax.numpy as jnp
import numpy as np
import cbo_jax as cj
from cbo_jax import consensus

# The β-quantile sub-level set Q_β of eq. (1.4) and the CB²O consensus point of eq. (1.3)
x = jax.random.normal(jax.random.key(0), (1000, 2))
L = jnp.sum(x**2, axis=-1)                 # lower level
G = jnp.sum((x - 1.0) ** 2, axis=-1)       # upper level
Q = consensus.quantile_mask(L, beta=0.3)   # boolean (N,)
m = consensus.consensus_point(x, G, alpha=100.0, mask=Q)
print(int(Q.sum()), m)

# The particle system eq. (1.2)-(1.5) with 20 % malicious particles, eq. (1.7b)
d, N = 5, 500
a, b = np.ones(d), -np.ones(d)
lower = lambda x: jnp.sum((x - a) ** 2, -1) * jnp.sum((x - b) ** 2, -1)   # minimisers a and b
upper = lambda x: jnp.sum((x - a) ** 2, -1)                               # G prefers a
rng = np.random.default_rng(0)
attack = cj.Malicious(drift=lambda t, x: -5.0 * (x - b), diffusion=lambda t, x: jnp.full(x.shape[0], 0.05))
p = cj.particles(rng.uniform(-2, 2, (N, d)), malicious=rng.permutation(N) < N // 5)
config = cj.ClusteredConfig(lambda1=1.0, sigma1=0.5, dt=0.01, alpha=1e3, beta=0.5)
res = cj.simulate(cj.cb2o(lower, upper, config, malicious=attack), p, jax.random.key(0), 1000)
print("distance of m to a:", float(np.linalg.norm(np.asarray(res.state.consensus)[0] - a)))
