import jax
import jax.numpy as jnp
from cbo_jax import models
from cbo_jax.federated import attacks, mnist, selection
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o, robustness_criterion
from cbo_jax.federated.attack_run import run_attack
from cbo_jax.federated.local import LocalSGDConfig

# Eq. (3.15): G^i = max_c [L_{j,c}(θ_i) - L_{j,c}(θ_j)] over the classes present
l_c_down = jnp.array([[0.2, 0.3, 2.0], [0.4, 0.5, 0.6]])   # (M, C) class losses of 2 downloads
l_c_own = jnp.array([0.3, 0.4, 0.5])                        # (C,) the agent's own model
print(robustness_criterion(l_c_down, l_c_own, jnp.array([True, True, True])))   # [1.5 0.1]

# ProbSampling (Algorithm 2): never-observed agents first, then ∝ P
P = selection.init_prob_likelihood(6)
idx = selection.prob_sampling(jax.random.key(0), P, 2)
P = selection.update_prob_likelihood(P, idx, jnp.ones((6, 2)), kappa=2.0, zeta=0.5)

# Label flipping 7 -> 1 on 2 rotated clusters, 4 benign + 2 malicious agents per cluster
flip = attacks.LabelFlipConfig(source=7, target=1, num_clusters=2, benign_per_cluster=4,
                               malicious_per_cluster=2, benign_samples=100, val_samples=20,
                               malicious_samples=100)
ds = attacks.label_flip_rotated(mnist.load_mnist("bundled"), flip, seed=0)
model = models.mlp_mnist()
cfg = FedCB2OConfig(M=3, alpha=2.0, T_G=1, local=LocalSGDConfig(epochs=1, batch_size=40, lr=0.05))
alg = fedcb2o(model, cfg, ds.cluster, ds.malicious, num_classes=ds.num_classes)
res = run_attack(alg, model, ds.attack_data(), ds, rounds=2, key=jax.random.key(0), test_size=200,
                 progress=False)
print(res.summary)
