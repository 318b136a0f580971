"""CB²O against malicious particles (eq. (1.2)-(1.5), (1.7b)).

Lower level L has two global minimisers a and b; the upper level G = |θ - a|² prefers
a. 20 % of the particles are attackers that drift to b. CB²O restricts the consensus to
the β-quantile sub-level set of L and weights it by exp(-α G): the benign consensus
stays at a. Plain CBO (weights exp(-α L) over everyone) is dragged to b.
Run:  python examples/cb2o_malicious.py   (with a plot: cbo-jax reproduce cb2o-malicious)
"""

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj

d, N = 5, 2000
a, b = np.ones(d), -np.ones(d)
lower = lambda x: jnp.sum((x - a) ** 2, -1) * jnp.sum((x - b) ** 2, -1)  # noqa: E731
upper = lambda x: jnp.sum((x - a) ** 2, -1)  # noqa: E731

rng = np.random.default_rng(0)
malicious = rng.permutation(N) < N // 5
attack = cj.Malicious(drift=lambda t, x: -5.0 * (x - b), diffusion=lambda t, x: jnp.full(x.shape[0], 0.05))
p = cj.particles(rng.uniform(-2, 2, (N, d)), malicious=malicious)
config = cj.ClusteredConfig(lambda1=1.0, sigma1=0.5, dt=0.01, alpha=1e3, beta=0.5)

robust = cj.simulate(cj.cb2o(lower, upper, config, malicious=attack), p, jax.random.key(0), 2000)
plain = cj.simulate(cj.clustered([lower], config, malicious=attack), p, jax.random.key(0), 2000)
print("CB²O consensus distance to a:", np.linalg.norm(np.asarray(robust.state.consensus)[0] - a))
print("CBO  consensus distance to a:", np.linalg.norm(np.asarray(plain.state.consensus)[0] - a))
