# %% [markdown]
# # Consensus-based optimization in one picture
#
# Consensus-based optimization (CBO) minimises a function $L$ with a swarm of particles
# that never compute a gradient. Each particle is pulled towards a **consensus point**, a
# Gibbs-weighted average of the swarm, and shaken by noise proportional to its distance
# from it (FedCBO eq. (4) with one objective; its Euler–Maruyama form is eq. (15)):
#
# $$d\theta^i = -\lambda_1 (\theta^i - m_\alpha)\,dt + \sigma_1 (\theta^i - m_\alpha) \circ dB^i,
# \qquad m_\alpha = \frac{\sum_j \theta^j e^{-\alpha L(\theta^j)}}{\sum_j e^{-\alpha L(\theta^j)}}.$$
#
# This is the anisotropic noise of Carrillo et al. (2021); `noise="isotropic"` uses
# $\sigma_1 |\theta^i - m_\alpha|\, dB^i$ instead. As $\alpha \to \infty$ the consensus point
# approaches the best particle (the Laplace principle), and as the particles agree the
# noise dies out.
#
# In cbo_jax the whole swarm is one array `(N, d)` (or a stacked pytree), the dynamics are
# a pure `(init, step)` pair, and time is a jitted `lax.scan`.
#
# **Running this notebook.** On Colab the first cell installs cbo_jax; choose a GPU runtime
# for the full sizes. On a laptop CPU it runs the small sizes (`CBO_JAX_SMALL=1`, the default
# without an accelerator). It also runs as a plain script:
# `python examples/notebooks/01_cbo_basics.py`.

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
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.notebook import LiveFigure, device_summary, in_notebook, small_mode

if not in_notebook():
    matplotlib.use("Agg")
SMALL = small_mode()
OUT = "results/notebooks/01_cbo_basics"
print(device_summary(), "| small sizes" if SMALL else "| full sizes")

# %% [markdown]
# ## A swarm on the 2-D Rastrigin function
#
# Rastrigin, shifted so the global minimiser is at $(1, 1)$, has a local minimum at every
# integer point. We start 200 particles uniformly on $[-3, 3]^2$, far from most of the
# good basins, and watch the swarm find the global one. The cell redraws the figure every
# few steps while the simulation runs.

# %%
objective = cj.objectives.Rastrigin(shift=1.0)
config = cj.CBOConfig(lambda1=1.0, sigma1=1.0, dt=0.01, noise="anisotropic", alpha=30.0)
dynamics = cj.cbo(objective, config)

N, d = 200, 2
x0 = jax.random.uniform(jax.random.key(0), (N, d), minval=-3.0, maxval=3.0)
state = dynamics.init(x0, jax.random.key(1))


@jax.jit
def advance(state, steps=25):
    """25 Euler–Maruyama steps as one compiled loop."""
    return jax.lax.fori_loop(0, steps, lambda _, s: dynamics.step(s), state)


grid = np.linspace(-3.5, 3.5, 200)
gx, gy = np.meshgrid(grid, grid)
landscape = np.asarray(objective(jnp.stack([gx.ravel(), gy.ravel()], -1))).reshape(gx.shape)

fig, ax = plt.subplots(figsize=(5.5, 5))
ax.contourf(gx, gy, landscape, levels=30, cmap="Greys")
dots = ax.scatter(*np.asarray(state.x).T, s=8, c="tab:blue", label="particles")
(cross,) = ax.plot(*np.asarray(state.consensus), "r*", ms=14, label=r"consensus $m_\alpha$")
ax.plot(1, 1, "gx", ms=10, mew=2, label="global minimiser")
ax.legend(loc="upper left", fontsize=8)
live = LiveFigure(fig, f"{OUT}/swarm.png")
for frame in range(10):
    state = advance(state)
    dots.set_offsets(np.asarray(state.x))
    cross.set_data([state.consensus[0]], [state.consensus[1]])
    ax.set_title(f"step {int(state.step)}: L(m) = {float(objective(state.consensus)):.2e}")
    live.update()
live.close()
print("consensus point:", np.round(np.asarray(state.consensus), 4), "(minimiser (1, 1))")

# %% [markdown]
# ## Many independent runs at once
#
# `cj.simulate` vmaps independent runs over a leading axis and advances time in compiled
# chunks. Here: Rastrigin in $d$ dimensions with the CBXpy benchmark's settings (anisotropic
# $\sigma_1 = 10.1$, α growing by 5 % per step from 30 up to $10^5$). A run succeeds when its
# final consensus point is within 0.25 of the minimiser in every coordinate, the criterion of
# the CBO literature. With $d = 20$, 40 particles and 5000 steps (the full size), CBXpy reports
# 100 successes out of 100 runs; `cbo-jax reproduce rastrigin-success` checks it.

# %%
d, runs, N, steps = (10, 25, 40, 1200) if SMALL else (20, 100, 40, 5000)
config_many = cj.CBOConfig(lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic",
                           alpha=cj.schedules.Multiplicative(alpha0=30.0, factor=1.05, alpha_max=1e5))
dyn = cj.cbo(cj.objectives.Rastrigin(shift=1.0), config_many)
x0 = jax.random.uniform(jax.random.key(2), (runs, N, d), minval=-3.0, maxval=3.0)
res = cj.simulate(dyn, x0, jax.random.key(3), steps, num_runs=runs)
err = np.abs(np.asarray(res.state.consensus) - 1.0).max(axis=-1)
print(f"d = {d}: {int((err < 0.25).sum())}/{runs} runs succeed; median sup-norm error {np.median(err):.2e}; "
      f"{res.seconds:.1f} s for {runs * N * steps / 1e6:.1f} M particle-steps (compilation included)")

# %% [markdown]
# ## What the history records
#
# With `record_consensus=True` the consensus point of every step comes back, and
# `observe=` adds any per-step diagnostic computed on device, here the swarm's spread
# $\frac1N\sum_i |\theta^i - m|^2$, which decays exponentially once the swarm has agreed.

# %%
dyn = cj.cbo(objective, config)
x0 = jax.random.uniform(jax.random.key(4), (400, 2), minval=-3.0, maxval=3.0)
res = cj.simulate(dyn, x0, jax.random.key(5), 600, record_consensus=True,
                  observe=lambda s: {"spread": jnp.mean(jnp.sum((s.x - s.consensus) ** 2, -1))})
spread = np.asarray(res.history["spread"])
fig, ax = plt.subplots(figsize=(5, 3))
ax.semilogy(np.arange(1, len(spread) + 1) * config.dt, spread)
ax.set_xlabel("time t")
ax.set_ylabel("mean squared distance to m")
ax.grid(alpha=0.3)
LiveFigure(fig, f"{OUT}/spread.png").close()
print("final consensus:", np.round(np.asarray(res.state.consensus), 4), "| steps:", int(res.state.step))
