# %% [markdown]
# # FedSGLD: federated learning with a Langevin oracle
#
# FedSGLD keeps the primal–dual structure of FedPD: device $i$ holds a local model $x_i$, a dual
# variable $\lambda_i$ and the server's $x_0$, and works on the augmented Lagrangian
# $f_i(x) + \langle\lambda_i, x - x_0\rangle + \tfrac{\gamma}{2}|x - x_0|^2$ locally. The local solver
# is a stochastic-gradient **Langevin** oracle (the paper's Algorithm 2): every round's chain starts
# at the broadcast point $x_0$, and each step uses a Poisson-subsampled mini-batch, clips the
# gradient to norm $C$, adds Gaussian noise, with decreasing steps $\eta_q \propto (q - Q_0)^{-1/3}$
# after a burn-in and a running average of the iterates:
#
# $$x \leftarrow x - \eta_q\, \mathrm{clip}_C(h) + \sqrt{\eta_q}\,\sigma\, \xi,\qquad \xi \sim N(0, I).$$
#
# The paper clips the whole gradient $h$ of the augmented Lagrangian. Beyond the paper, the
# oracle can also clip per sample, as DP-SGD does: each sampled gradient of the data loss is
# clipped to $C$ and the dual and proximal terms are added unclipped (`clipping="per_sample"`).
#
# The noise makes every round differentially private; `cbo_jax.federated.privacy` turns the
# noise multiplier and the sampling rate into $(\varepsilon, \delta)$ per device with the RDP
# accountant of `dp-accounting`: $z_q = \sigma / (2C\sqrt{\eta_q})$ for the paper's clipping, and
# $z_q = \sigma\, q\, n_i / (C\sqrt{\eta_q})$ for per-sample clipping on a device with $n_i$ records.
#
# The benchmark is FedProx's synthetic(α, β) with logistic regression: 30 devices whose models
# and features differ by α and β. The full reproduction (low and high noise, four FedSGLD
# variants, plots) is `cbo-jax reproduce fedsgld-synthetic`; its numbers are in
# `benchmarks/RESULTS_fedsgld.md`.

# %%
import importlib.util
import os
import subprocess
import sys

# A fresh Colab runtime has no cbo_jax: install the distribution `cbo-jax`. Until it is on PyPI, set
# CBO_JAX_PIP_SOURCE first to a wheel (`python -m build` in a clone writes dist/cbo_jax-*.whl; upload it,
# then `%env CBO_JAX_PIP_SOURCE=/content/cbo_jax-0.1.0-py3-none-any.whl`) or to a git URL of the repository.
if importlib.util.find_spec("cbo_jax") is None:
    source = os.environ.get("CBO_JAX_PIP_SOURCE", "cbo-jax")
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
from cbo_jax.runtime.notebook import LiveFigure, device_summary, in_notebook, small_mode

if not in_notebook():
    matplotlib.use("Agg")
SMALL = small_mode()
OUT = "results/notebooks/05_fedsgld_synthetic"
print(device_summary(), "| small sizes" if SMALL else "| full sizes")

# %% [markdown]
# ## Data and methods
#
# The paper's high-noise case: oracle noise σ = 0.5. FedPD runs the same local steps without
# noise or clipping; "noisy FedPD" adds the same noise to FedPD's plain SGD steps. FedSGLD runs
# twice: with the paper's clipping at $C = 100$ (it rarely clips), and with per-sample clipping at
# $C = 5$.

# %%
data = synthetic(alpha=1.0, beta=1.0, seed=0)
model = logistic_regression()
print(f"{data.num_agents} devices, training samples per device {int(data.counts.min())}..{int(data.counts.max())}")
rounds, Q = (25, 20) if SMALL else (100, 40)
noise = 0.5


def sgld_config(clip_norm, clipping="batch"):
    return FedSGLDConfig(oracle=SGLDConfig(steps=Q, burn_in=Q // 2, lr=0.01, noise=noise, clip_norm=clip_norm,
                                           sampling_rate=0.1, clipping=clipping), gamma=10.0, delta=1e-5)


fedpd_cfg = FedPDConfig(local_steps=Q, lr=0.01, gamma=10.0, sampling_rate=0.1)
methods = {
    "FedSGLD": fedsgld(model, sgld_config(100.0), data.num_agents),
    "FedSGLD, per-sample clip": fedsgld(model, sgld_config(5.0, "per_sample"), data.num_agents),
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
    print(f"{name:>24}: training loss {c['train_loss'][0]:.3f} -> {c['train_loss'][-1]:.3f}, "
          f"test accuracy {c['test_acc'][-1]:.1f} %, clipped share {c['clipped'].mean():.2f}")
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
# ε after each round. With the paper's clipping at $C = 100$ the noise multiplier is tiny and the
# guarantee vacuous; $C = 1$ gives a meaningful ε, but then the oracle clips the whole
# augmented-Lagrangian gradient, proximal pull included, and training fails (see
# `benchmarks/RESULTS_fedsgld.md`). Per-sample clipping divides the sensitivity by the expected
# batch size $q n_i$, so $C = 5$ gives a meaningful ε on every device; the smallest device has the
# largest ε, the accountant reports it per device.

# %%
sizes = np.asarray(data.counts)
few = np.unique([sizes.min(), int(np.median(sizes)), sizes.max()])  # three devices, to keep this cell quick
fig, ax = plt.subplots(figsize=(6, 3.6))
for label, cfg in (("batch clip, C = 100", sgld_config(100.0)), ("batch clip, C = 1", sgld_config(1.0)),
                   ("per-sample clip, C = 5", sgld_config(5.0, "per_sample"))):
    rep = privacy.account(cfg, rounds, device_sizes=few)
    ax.semilogy(np.arange(1, rounds + 1), rep.epsilon, label=label)
    per_device = ", ".join(f"n={n}: {e:.3g}" for n, e in zip(rep.device_sizes, rep.device_epsilon[-1]))
    print(f"{label}: epsilon after {rounds} rounds {rep.epsilon[-1]:.3g} (delta = {rep.delta}); {per_device}")
ax.set_xlabel("communication round")
ax.set_ylabel("largest ε over devices")
ax.legend()
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
LiveFigure(fig, f"{OUT}/epsilon.png").close()
