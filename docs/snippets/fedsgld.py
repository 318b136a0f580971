import jax
import jax.numpy as jnp
import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import privacy
from cbo_jax.federated.langevin import step_sizes
from cbo_jax.federated.synthetic import synthetic

data = synthetic(alpha=1.0, beta=1.0, max_samples=200, seed=0)   # 30 devices, padded + counts
agents = data.agent_data()                                       # (N, n_max, 60) inputs, labels, counts
model = models.logistic_regression()                             # 60 features, 10 classes

oracle = fl.SGLDConfig(steps=20, burn_in=10, lr=0.01, noise=0.5, clip_norm=100.0, sampling_rate=0.1)
print(step_sizes(oracle.spec()))                                 # η for q <= Q0, then η (q - Q0)^(-1/3)

for name, alg in {
    "fedsgld": fl.fedsgld(model, fl.FedSGLDConfig(oracle=oracle, gamma=10.0), data.num_agents),
    "fedpd": fl.fedpd(model, fl.FedPDConfig(local_steps=20, lr=0.01, gamma=10.0), data.num_agents),
}.items():
    state = alg.init(jax.random.key(0))
    round_fn = jax.jit(alg.round)
    for r in range(5):
        state, info = round_fn(state, agents)
    print(name, float(jnp.mean(info.train_loss)))

# (ε, δ) per device after each round (dp-accounting's RDP accountant)
tight = fl.FedSGLDConfig(oracle=fl.SGLDConfig(steps=20, burn_in=10, lr=0.01, noise=0.5, clip_norm=1.0,
                                              sampling_rate=0.1), delta=1e-5)
report = privacy.account(tight, rounds=10)
print(report.noise_multipliers[:3], report.epsilon[[0, -1]], report.per_device(data.num_agents).shape)
