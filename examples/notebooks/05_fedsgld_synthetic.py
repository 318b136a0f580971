# %% [markdown]
# # FedSGLD: federated learning with a Langevin oracle
#
# FedSGLD keeps the primal–dual structure of FedPD: device $i$ holds a local model $x_i$, a dual
# variable $\lambda_i$ and the server's $x_0$, and minimises the augmented Lagrangian
# $f_i(x) + \langle\lambda_i, x - x_0\rangle + \tfrac{1}{2\gamma}|x - x_0|^2$ locally. The local solver
# is a stochastic-gradient **Langevin** oracle: Poisson-subsampled mini-batches, gradients
# clipped to norm $C$, Gaussian noise, decreasing steps $\eta_q \propto (q - Q_0)^{-1/3}$, a burn-in
# and a running average of the iterates:
#
# $$x \leftarrow x - \eta_q\, \mathrm{clip}_C(h) + \sqrt{\eta_q}\,\sigma\, \xi,\qquad \xi \sim N(0, I).$$
#
# The noise makes every round differentially private; `cbo_jax.federated.privacy` turns the
# noise multiplier $z_q = \sigma / (2C\sqrt{\eta_q})$ and the sampling rate into $(\varepsilon, \delta)$
# per device with the RDP accountant of `dp-accounting`.
#
# The benchmark is FedProx's synthetic(α, β) with logistic regression: 30 devices whose models
# and features differ by α and β. The full reproduction (low and high noise, plots) is
# `cbo-jax reproduce fedsgld-synthetic`; its numbers are in `benchmarks/RESULTS_fedsgld.md`.

# %%
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("cbo_jax") is None:  # a fresh Colab runtime: install from the repository
    source = os.environ.get("CBO_JAX_PIP_SOURCE", "git+https://github.com/cbo-jax/cbo_jax.git")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], check=True)

import jax
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from cbo_jax.experiments.fedsgld_synthetic import train_curves
from cbo_jax.federated import privacy
from cbo_jax.federated import FedPDConfig, FedSGLDConfig, SGLDConfig, fedpd, fedsgld
from cbo_jax.federated.synthetic import synthetic
from cbo_jax.models import logistic_regression
from cbo_jax.notebook import LiveFigure, device_summary, in_notebook, small_mode

if not in_notebook():
    matplotlib.use("Agg")
SMALL = small_mode()
OUT = "results/notebooks/05_fedsgld_synthetic"
print(device_summary(), "| small sizes" if SMALL else "| full sizes")

# %% [markdown]
# ## Data and methods
#
# The paper's high-noise case: oracle noise σ = 0.5. FedPD runs the same local steps without
# noise or clipping; "noisy FedPD" adds the same noise to FedPD's plain SGD steps.

# %%
data = synthetic(alpha=1.0, beta=1.0, seed=0)
model = logistic_regression()
print(f"{data.num_agents} devices, training samples per device {int(data.counts.min())}..{int(data.counts.max())}")
rounds, Q = (25, 20) if SMALL else (100, 40)
noise = 0.5
sgld = FedSGLDConfig(oracle=SGLDConfig(steps=Q, burn_in=Q // 2, lr=0.01, noise=noise, clip_norm=100.0,
                                       sampling_rate=0.1), gamma=10.0, delta=1e-5)
fedpd_cfg = FedPDConfig(local_steps=Q, lr=0.01, gamma=10.0, sampling_rate=0.1)
methods = {
    "FedSGLD": fedsgld(model, sgld, data.num_agents),
    "FedPD": fedpd(model, fedpd_cfg, data.num_agents),
    "noisy FedPD": fedpd(model, FedPDConfig(local_steps=Q, lr=0.01, gamma=10.0, sampling_rate=0.1, noise=noise,
                                            clip_norm=100.0), data.num_agents),
}

# %% [markdown]
# ## Training loss
#
# Each method's rounds run as one jitted `lax.scan`; the curves are the global training loss
# after every round.

# %%
curves = {name: train_curves(alg, model, data, rounds, jax.random.key(0)) for name, alg in methods.items()}
fig, ax = plt.subplots(figsize=(6, 4))
for name, c in curves.items():
    ax.plot(np.arange(1, rounds + 1), c["train_loss"], label=name)
    print(f"{name:>12}: training loss {c['train_loss'][0]:.3f} -> {c['train_loss'][-1]:.3f}, "
          f"test accuracy {c['test_acc'][-1]:.1f} %")
ax.set_xlabel("communication round")
ax.set_ylabel("training loss")
ax.set_title(f"synthetic(1, 1), oracle noise {noise}")
ax.legend()
ax.grid(alpha=0.3)
fig.tight_layout()
LiveFigure(fig, f"{OUT}/training_loss.png").close()

# %% [markdown]
# ## Privacy
#
# ε after each round for the clip norm used above and for a tight one. With $C = 100$ the noise
# multiplier is tiny and the guarantee vacuous; $C = 1$ gives a meaningful ε, but then the
# oracle clips the whole augmented-Lagrangian gradient and training suffers (see
# `benchmarks/RESULTS_fedsgld.md`).

# %%
fig, ax = plt.subplots(figsize=(6, 3.6))
for C in (100.0, 1.0):
    cfg = FedSGLDConfig(oracle=SGLDConfig(steps=Q, burn_in=Q // 2, lr=0.01, noise=noise, clip_norm=C,
                                          sampling_rate=0.1), gamma=10.0, delta=1e-5)
    rep = privacy.account(cfg, rounds)
    ax.semilogy(np.arange(1, rounds + 1), rep.epsilon, label=f"C = {C:g}")
    print(f"C = {C:g}: epsilon after 1 round {rep.epsilon[0]:.3g}, after {rounds} rounds {rep.epsilon[-1]:.3g} "
          f"(delta = {rep.delta})")
ax.set_xlabel("communication round")
ax.set_ylabel("ε per device")
ax.legend()
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
LiveFigure(fig, f"{OUT}/epsilon.png").close()
