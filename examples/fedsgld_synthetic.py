"""FedSGLD against FedPD on the FedProx synthetic(1, 1) benchmark, with privacy accounting.

Run:  python examples/fedsgld_synthetic.py  (about a minute on a 2-core CPU)

The full reproduction (both noise levels, plots, JSON) is
``cbo-jax reproduce fedsgld-synthetic``.
"""

import jax
import numpy as np

from cbo_jax.experiments.fedsgld_synthetic import train_curves
from cbo_jax.federated import privacy
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, SGLDConfig, fedpd, fedsgld
from cbo_jax.federated.synthetic import synthetic
from cbo_jax.models import logistic_regression

data = synthetic(alpha=1.0, beta=1.0, seed=0)  # 30 devices, padded (30, n_max, 60) + counts
print(f"devices: {data.num_agents}, training samples per device: {data.counts.min()}..{data.counts.max()}")
model = logistic_regression()

noise = 0.5  # the paper's high-noise case: x <- x - eta*clip(h) + sqrt(eta)*noise*N(0, I)
sgld = FedSGLDConfig(
    oracle=SGLDConfig(steps=40, burn_in=20, lr=0.01, noise=noise, clip_norm=100.0, sampling_rate=0.1),
    gamma=10.0,
    delta=1e-5,
)
methods = {
    "fedsgld": fedsgld(model, sgld, data.num_agents),
    "fedpd": fedpd(model, FedPDConfig(local_steps=40, lr=0.01, gamma=10.0, sampling_rate=0.1), data.num_agents),
    "noisy_fedpd": fedpd(model, FedPDConfig(local_steps=40, lr=0.01, gamma=10.0, sampling_rate=0.1, noise=noise,
                                            clip_norm=100.0), data.num_agents),
}
rounds = 30
for name, alg in methods.items():
    c = train_curves(alg, model, data, rounds, jax.random.key(0))  # all rounds in one jitted lax.scan
    print(f"{name:>12}: training loss {c['train_loss'][0]:.3f} -> {c['train_loss'][-1]:.3f}, "
          f"test accuracy {c['test_acc'][-1]:.1f}%")

report = privacy.account(sgld, rounds)  # (epsilon, delta) per device after each round, dp-accounting RDP
print(f"FedSGLD noise multipliers z_q = noise / (2 C sqrt(eta_q)): {report.noise_multipliers[0]:.4f} .. "
      f"{report.noise_multipliers[-1]:.4f}")
print(f"epsilon after rounds 1, {rounds}: {report.epsilon[0]:.3g}, {report.epsilon[-1]:.3g} (delta={report.delta})")

# A clip norm small enough for a meaningful guarantee (this setting does not train well:
# see benchmarks/RESULTS_fedsgld.md):
tight = FedSGLDConfig(oracle=SGLDConfig(steps=40, burn_in=20, lr=0.01, noise=noise, clip_norm=1.0, sampling_rate=0.1))
eps = privacy.account(tight, rounds).epsilon
print(f"with C = 1: epsilon after round 1 = {eps[0]:.3g}, after {rounds} rounds = {eps[-1]:.3g}; "
      f"per device: {np.round(privacy.account(tight, 1).per_device(3), 3).ravel()}")
