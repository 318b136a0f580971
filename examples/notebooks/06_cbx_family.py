# %% [markdown]
# # The CBX family: every CBXpy dynamic on one picture
#
# CBXpy ships a family of consensus-based particle dynamics. cbo_jax has each of them as a
# pure `(init, step)` pair that `cj.simulate` runs (vmapped runs, parameter sweeps,
# sharding), checked step by step against CBXpy (`tests/dynamics/test_family.py`):
#
# | CBXpy | cbo_jax | what it adds to CBO |
# | --- | --- | --- |
# | `CBO` | `cj.cbo` | (the base) |
# | `CBOMemory` | `cj.cbo_memory` | a personal-best memory; consensus of the memories |
# | `PSO` | `cj.pso` | inertia and velocities (particle swarm optimisation as an SDE) |
# | `CBS` | `cj.cbs` | covariance-shaped noise: optimisation or *sampling* |
# | `PolarCBO` | `cj.polar_cbo` | one kernel-weighted consensus point per particle |
# | `AdamCBO` | `cj.adam_cbo` | Adam's moment estimates on the drift |
# | `MirrorCBO` | `cj.mirror_cbo` | the update in the dual space of a mirror map |
# | `DriftConstrainedCBO` | `cj.drift_constrained_cbo` | a stiff constraint drift, implicit |
# | `HyperSurfaceCBO` | `cj.hypersurface_cbo` | drift and noise projected onto a surface |
# | `RegCombinationCBO` | `cj.reg_combination_cbo` | penalty plus a semi-implicit constraint step |
#
# **Running this notebook.** On Colab the first cell installs cbo_jax. On a laptop CPU it
# runs the small sizes (`CBO_JAX_SMALL=1`, the default without an accelerator); it also
# runs as a plain script: `python examples/notebooks/06_cbx_family.py`.

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

import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

import cbo_jax as cj
from cbo_jax.runtime.notebook import LiveFigure, device_summary, in_notebook, small_mode

if not in_notebook():
    matplotlib.use("Agg")
SMALL = small_mode()
OUT = "results/notebooks/06_cbx_family"
print(device_summary(), "| small sizes" if SMALL else "| full sizes")

# %% [markdown]
# ## Ten dynamics, one objective
#
# The objective is the 2-D Ackley function shifted to $(1, 1)$, a minimiser *outside* the
# unit disk. The unconstrained dynamics find $(1, 1)$. The three constrained ones (held to
# the unit circle $|x|^2 = 1$) and MirrorCBO (projected onto the unit disk) must stay on
# the circle or in the disk; their best points are $(1, 0)$ and $(0, 1)$, where Ackley's
# ripples (a local minimum at every integer offset from the minimiser) make them better
# than $(1, 1)/\sqrt 2$. Every dynamic starts from the same particles. Each panel shows
# where its particles are at the end, on the contour of the objective, with the consensus
# point (PolarCBO: one per particle) as red stars.

# %%
f = cj.objectives.Ackley(shift=1.0)
N, steps = (100, 400) if SMALL else (400, 1500)
x0 = np.random.default_rng(0).uniform(-3, 3, (N, 2)).astype(np.float32)
alpha = cj.schedules.Multiplicative(alpha0=10.0, factor=1.02, alpha_max=1e4)
circle = cj.constraints.sphere(1.0)
family = {
    "cbo": cj.cbo(f, sigma1=1.0, alpha=alpha),
    "cbo_memory": cj.cbo_memory(f, sigma1=1.0, alpha=alpha),
    "pso": cj.pso(f, sigma1=0.5, alpha=alpha, m=0.05),
    "cbs (optimisation)": cj.cbs(f, alpha=30.0, mode="optimization"),
    "polar_cbo": cj.polar_cbo(f, sigma1=0.5, alpha=1.0, kappa=0.5, kernel_factor="const"),
    "adam_cbo": cj.adam_cbo(f, lambda1=0.02, sigma1=0.5, alpha=alpha),
    "mirror_cbo (ball)": cj.mirror_cbo(f, sigma1=0.5, alpha=alpha, mirror_map={"name": "ProjectionBall"}),
    "drift_constrained_cbo": cj.drift_constrained_cbo(f, sigma1=0.3, alpha=alpha, constraints=circle),
    "hypersurface_cbo": cj.hypersurface_cbo(f, sigma1=0.3, alpha=alpha),
    "reg_combination_cbo": cj.reg_combination_cbo(f, sigma1=0.3, alpha=alpha, constraints=circle, eps=0.1),
}
final = {}
for name, dyn in family.items():
    start = x0 / np.linalg.norm(x0, axis=1, keepdims=True) if name == "hypersurface_cbo" else x0
    res = cj.simulate(dyn, start, 0, steps)
    final[name] = res
    m = np.asarray(res.state.consensus)
    where = np.round(m if m.ndim == 1 else np.median(m, axis=0), 3)
    print(f"{name:24s} best energy {float(res.state.best_energy):9.4f}, consensus {where}, "
          f"{int(res.history['evals'][-1])} evaluations")

fig, axes = plt.subplots(2, 5, figsize=(17, 7))
for ax, (name, res) in zip(axes.ravel(), final.items()):
    cj.plot.particles(f, res.state.x, res.state.consensus, bounds=((-3, 3), (-3, 3)), ax=ax, title=name,
                      resolution=80)
    if "constrained" in name or "hypersurface" in name or "reg_comb" in name or "mirror" in name:
        t = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(t), np.sin(t), "w--", lw=0.8)
fig.tight_layout()
LiveFigure(fig, f"{OUT}/family.png").close()

# %% [markdown]
# ## PolarCBO finds every minimum at once
#
# Himmelblau's function has four global minima. Plain CBO gathers all particles at one of
# them. PolarCBO gives each particle its own consensus point, a Gibbs mean weighted by a
# Gaussian kernel of width $\kappa$ around it, so the swarm splits between the minima.
# The weights are formed a block of rows at a time (`chunk`), never as an $N \times N$
# matrix.

# %%
h = cj.objectives.Himmelblau()
x0h = np.random.default_rng(1).uniform(-5, 5, (200 if SMALL else 1000, 2)).astype(np.float32)
polar = cj.polar_cbo(h, kappa=0.5, alpha=1.0, kernel_factor="const", sigma1=0.5, dt=0.05, chunk=64)
history = cj.plot.record_history(polar, x0h, 0, 600, every=150)
fig = cj.plot.snapshots(h, history, bounds=((-5, 5), (-5, 5)))
LiveFigure(fig, f"{OUT}/polar_himmelblau.png").close()
dist = np.linalg.norm(history.x[-1][:, None] - h.minimisers(2)[None], axis=-1)
print("particles within 0.1 of each of Himmelblau's minima:", (dist < 0.1).sum(axis=0))

# %% [markdown]
# ## CBS samples a Gaussian
#
# In sampling mode ($\lambda = 1/(1 + \alpha)$), consensus-based sampling leaves a Gaussian
# target $e^{-f}$ invariant: the particles spread out to the target's mean and covariance
# instead of collapsing. Below, the particles after $t = 15$ and the target's 1σ and 2σ
# ellipses.

# %%
mu = np.array([1.0, -0.5])
cov = np.array([[1.0, 0.6], [0.6, 0.8]])
prec = np.linalg.inv(cov)
gauss = lambda x: 0.5 * jnp.einsum("...a,ab,...b->...", x - mu, jnp.asarray(prec, x.dtype), x - mu)  # noqa: E731
xs = 2.0 * np.random.default_rng(2).normal(size=(300 if SMALL else 2000, 2)).astype(np.float32)
res = cj.simulate(cj.cbs(gauss, alpha=1.0, dt=0.01, mode="sampling"), xs, 0, 1500)
xt = np.asarray(res.state.x)
print("sample mean", np.round(xt.mean(0), 3), "(target", mu, ")")
print("sample covariance", np.round(np.cov(xt.T), 3).tolist(), "(target", cov.tolist(), ")")
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.scatter(xt[:, 0], xt[:, 1], s=5, alpha=0.6, label="CBS particles")
w, v = np.linalg.eigh(cov)
t = np.linspace(0, 2 * np.pi, 200)
for k in (1, 2):
    ell = mu[:, None] + k * v @ (np.sqrt(w)[:, None] * np.stack([np.cos(t), np.sin(t)]))
    ax.plot(*ell, "r-", lw=1)
ax.set_aspect("equal")
ax.legend(loc="upper left")
ax.set_title("CBS, sampling mode")
LiveFigure(fig, f"{OUT}/cbs_sampling.png").close()
