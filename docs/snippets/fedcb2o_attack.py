import jax
import jax.numpy as jnp
import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import attacks, mnist

# Eq. (3.15): G^i = max_c [L_{j,c}(θ_i) - L_{j,c}(θ_j)] over the classes present
l_c_down = jnp.array([[0.2, 0.3, 2.0], [0.4, 0.5, 0.6]])   # (M, C) class losses of 2 downloads
l_c_own = jnp.array([0.3, 0.4, 0.5])                        # (C,) the agent's own model
print(fl.robustness_criterion(l_c_down, l_c_own, jnp.array([True, True, True])))   # [1.5 0.1]

# ProbSampling (Algorithm 2) as a selection rule: never-observed agents first, then ∝ P
rule = fl.prob_sampling(M=2, kappa=2.0, zeta=0.5)
P = rule.init(6, 6)
sel = rule.select(jax.random.key(0), P, 0)
P = rule.update(P, sel.idx, jnp.ones((6, 2)))

# Label flipping 7 -> 1 on 2 rotated clusters, 4 benign + 2 malicious agents per cluster
flip = attacks.LabelFlipConfig(source=7, target=1, num_clusters=2, benign_per_cluster=4,
                               malicious_per_cluster=2, benign_samples=100, val_samples=20,
                               malicious_samples=100)
ds = attacks.label_flip_rotated(mnist.load_mnist("bundled"), flip, seed=0)
model = models.mlp_mnist()
cfg = fl.FedCB2OConfig(M=3, alpha=2.0, T_G=1, local=fl.LocalSGDConfig(epochs=1, batch_size=40, lr=0.05))
alg = fl.fedcb2o(model, cfg, ds.cluster, ds.malicious, num_classes=ds.num_classes)
res = fl.run(alg, ds.attack_data(), rounds=2, key=jax.random.key(0), progress=False,
             round_metrics=[fl.metrics.attack_selection(ds.cluster, ds.malicious)],   # Fig. 5 statistics
             metrics=[fl.metrics.attack_accuracy(model, ds, test_size=200)])          # accuracy, ASR
print(res.summary)
