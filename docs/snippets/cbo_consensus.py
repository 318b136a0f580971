import jax
import jax.numpy as jnp
import cbo_jax as cj
from cbo_jax import consensus, sde

# The consensus point m_α (eq. (4)): Gibbs weights exp(-α L) normalised in log space
x = jax.random.normal(jax.random.key(0), (1000, 3))
energy = cj.objectives.Sphere()(x)
w = consensus.consensus_weights(energy, alpha=1e12)       # finite even for huge α
m = consensus.consensus_point(x, energy, alpha=50.0)
print(float(w.sum()), m, float(consensus.effective_sample_size(energy, 50.0)))

# The diffusion term D(θ - m) z of eq. (15), anisotropic: (θ - m) ∘ z
print(sde.diffusion("anisotropic", x - m, jax.random.normal(jax.random.key(1), x.shape)).shape)

# Gradient drift λ2 ∇L and gradient noise σ2 |∇L| switch on with lambda2 / sigma2
dyn = cj.cbo(cj.objectives.Rastrigin(), lambda1=1.0, sigma1=1.0, lambda2=0.1, sigma2=0.05,
             noise="isotropic", dt=0.01, alpha=100.0)
res = cj.simulate(dyn, x, jax.random.key(2), 200)
print(res.state.consensus)

# FedCBO eq. (19): agent j averages the M models it downloaded, weighted by exp(-α L_j^i)
N, M = 6, 3
models = jax.random.normal(jax.random.key(3), (N, 4))
idx = jnp.array([[(j + k + 1) % N for k in range(M)] for j in range(N)])   # (N, M) downloads
losses = jax.random.uniform(jax.random.key(4), (N, M))                      # L_j^i on j's data
m_j = consensus.subset_consensus(models, idx, losses, alpha=10.0)           # (N, 4)
print(m_j.shape)
