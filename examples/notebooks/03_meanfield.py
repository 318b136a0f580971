# %% [markdown]
# # The mean-field limit: concentration and propagation of chaos
#
# FedCBO's particle system (eq. (4)) has $K$ classes of particles; class $k$ minimises $L_k$
# and follows the consensus point $m_k$, computed over **all** particles with weights
# $e^{-\alpha L_k}$:
#
# $$d\theta = -\lambda_1(\theta - m_k)\,dt - \lambda_2 \nabla L_k(\theta)\,dt
#   + \sigma_1 |\theta - m_k|\, dB + \sigma_2 |\nabla L_k(\theta)|\, d\tilde B.$$
#
# Three results of the paper are checked here by simulation:
#
# * **Theorem 2.3 (concentration).** With $V(\rho^k_t) = \tfrac12\int|\theta-\theta^*_k|^2 d\rho^k_t$,
#   if $2\lambda_1 > 2\lambda_2 M + d\sigma_1^2 + d\sigma_2^2 M^2$ then $V(\rho^1_t)+V(\rho^2_t)$ decays
#   at least like $e^{-(2\lambda_1 - 2\lambda_2 M - d\sigma_1^2 - d\sigma_2^2 M^2)t}$.
# * **Theorem 2.2 (mean-field limit).** The empirical measure of $N$ particles converges to the
#   mean-field law as $N\to\infty$; the distance to a very large reference system falls like
#   the Monte-Carlo rate $N^{-1/2}$.
# * **Proposition 1, eq. (50) (propagation of chaos).** Each particle stays close to its
#   *mean-field copy* (same start, same Brownian motion, the mean-field consensus point):
#   $E|\theta^i_t - \bar\theta^i_t|^2 \le C/N$.
#
# Before those, a parameter sweep of plain CBO: a $\sigma \times \alpha$ grid on Rastrigin, all
# points and seeds in one compiled program.
#
# The full studies are `cbo-jax reproduce meanfield-decay`, `meanfield-scaling` and
# `meanfield-coupling` (their measured numbers are in `benchmarks/RESULTS_particles.md`).

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
from cbo_jax import meanfield, objectives
from cbo_jax.dynamics.clustered import ClusteredConfig, SDEParams, clustered, particles
from cbo_jax.runtime.notebook import LiveFigure, device_summary, in_notebook, small_mode

if not in_notebook():
    matplotlib.use("Agg")
SMALL = small_mode()
OUT = "results/notebooks/03_meanfield"
print(device_summary(), "| small sizes" if SMALL else "| full sizes")

# %% [markdown]
# ## A $\sigma \times \alpha$ sweep of CBO as one program
#
# The numbers of a particle system ($\lambda_1, \sigma_1, \lambda_2, \sigma_2$, `dt` and the
# $\alpha$ schedule's numbers) form a traced pytree, `cj.params.Params`, separate from its
# static structure (objective, noise kind, dtype, kind of schedule). `cj.params.grid` builds
# the outer product of swept values, and `simulate(..., params=grid)` runs every point and
# every seed in one jitted program. A run succeeds when its consensus point ends within
# $0.25$ of the minimiser $0$ (sup norm), as in CBXpy's Rastrigin check.

# %%
d_sw, N_sw = 5, 40
seeds, steps_sw = (16, 600) if SMALL else (100, 2000)
sigmas = np.linspace(0.4, 3.2, 8)
alphas = np.array([1.0, 3.0, 10.0, 30.0, 100.0, 300.0])
cbo_dyn = cj.cbo(objectives.Rastrigin(), cj.CBOConfig(
    lambda1=1.0, sigma1=1.0, dt=0.01, noise="anisotropic",
    alpha=cj.schedules.Multiplicative(alpha0=30.0, factor=1.02, alpha_max=1e5)))
sweep_grid = cj.params.grid(cbo_dyn, sigma1=sigmas, alpha0=alphas)          # a (8, 6) grid
x0_sw = np.random.default_rng(1).uniform(-3, 3, (seeds, N_sw, d_sw))        # shared by every point
res_sw = cj.simulate(cbo_dyn, x0_sw, 0, steps_sw, num_runs=seeds, params=sweep_grid)
success = (np.abs(np.asarray(res_sw.state.consensus)).max(axis=-1) < 0.25).mean(axis=-1)   # (8, 6)
print(f"{sweep_grid.sigma1.size} points x {seeds} seeds in one program: {res_sw.seconds:.1f} s")

fig, ax = plt.subplots(figsize=(6, 4))
im = ax.imshow(success, origin="lower", cmap="viridis", vmin=0, vmax=1, aspect="auto")
ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
ax.set_yticks(range(len(sigmas)), [f"{s:.1f}" for s in sigmas])
ax.set_xlabel(r"$\alpha_0$ (then $\times 1.02$ per step)")
ax.set_ylabel(r"$\sigma_1$ (anisotropic)")
ax.set_title(f"success rate, Rastrigin d={d_sw}, N={N_sw}, {steps_sw} steps")
for i in range(len(sigmas)):
    for j in range(len(alphas)):
        ax.text(j, i, f"{success[i, j]:.2f}", ha="center", va="center", fontsize=7,
                color="white" if success[i, j] < 0.5 else "black")
fig.colorbar(im, ax=ax)
fig.tight_layout()
LiveFigure(fig, f"{OUT}/sweep_success.png").close()

# %% [markdown]
# Every entry of a grid is checked on the host before anything is compiled; a bad entry is
# named with its grid index:

# %%
bad = sweep_grid.sigma1.copy()
bad[3, 2] = np.nan
try:
    cj.simulate(cbo_dyn, x0_sw, 0, steps_sw, num_runs=seeds, params=sweep_grid._replace(sigma1=bad))
except ValueError as err:
    print("rejected:", err)

# %% [markdown]
# ## Concentration: a parameter sweep as one `vmap`
#
# Two quadratic classes $L_k(\theta) = \tfrac12|\theta - c_k|^2$ in $d=2$ (so $\nabla L_k$ is
# 1-Lipschitz, $M=1$). The SDE strengths live in the state (`SDEParams`), so the sweep over
# $(\lambda_1, \lambda_2, \sigma_1, \sigma_2)$ is a `vmap` of one compiled simulation; the config
# only says which terms exist.

# %%
d, dt = 2, 0.01
N, steps = (4_000, 400) if SMALL else (100_000, 600)
centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
config = ClusteredConfig(lambda1=1.0, lambda2=1.0, sigma1=1.0, sigma2=1.0, dt=dt, alpha=1e4, noise="isotropic")
dyn = clustered([objectives.Quadratic(shift=c) for c in centers], config)
label = np.arange(N) % 2
p0 = particles(centers[label] + np.random.default_rng(0).uniform(-1, 1, (N, d)), label)
sweep = SDEParams(lambda1=jnp.array([1.0, 2.0, 1.0]), lambda2=jnp.array([0.0, 0.5, 0.0]),
                  sigma1=jnp.array([0.5, 0.6, 1.0]), sigma2=jnp.array([0.0, 0.2, 0.0]))


@jax.jit
@jax.vmap
def variance_path(params):
    def body(state, _):
        state = dyn.step(state)
        return state, meanfield.class_variance(state.x, state.label, centers).sum()

    return jax.lax.scan(body, dyn.init(p0, jax.random.key(0), params), None, length=steps)[1]


V = np.asarray(variance_path(sweep))
t = dt * np.arange(1, steps + 1)
fig, ax = plt.subplots(figsize=(6, 4))
for i in range(V.shape[0]):
    prm = [round(float(a[i]), 4) for a in (sweep.lambda1, sweep.lambda2, sweep.sigma1, sweep.sigma2)]
    predicted = meanfield.predicted_decay_rate(*prm, d=d, lipschitz=1.0)
    fitted = meanfield.fit_decay_rate(t, V[i])
    line, = ax.semilogy(t, V[i], label=f"λ1,λ2,σ1,σ2 = {prm}: fitted {fitted:.2f}, Thm 2.3 {predicted:.2f}")
    ax.semilogy(t, V[i, 0] * np.exp(-predicted * (t - t[0])), "--", color=line.get_color(), lw=1)
    print(f"{prm}: fitted decay rate {fitted:.3f}, Theorem 2.3 bound {predicted:.3f}")
ax.set_xlabel("time t")
ax.set_ylabel(r"$V(\rho^1_t) + V(\rho^2_t)$")
ax.set_title("dashed: the theorem's exponential rate")
ax.legend(fontsize=7)
ax.grid(alpha=0.3)
fig.tight_layout()
LiveFigure(fig, f"{OUT}/decay.png").close()

# %% [markdown]
# The measured rates are at or above the theorem's bound. With $\lambda_2 > 0$ they are well
# above it: the bound's $-2\lambda_2 M$ is a worst case, and for a quadratic the gradient drift
# helps (the exact rate is $2(\lambda_1+\lambda_2) - d\sigma_1^2 - d\sigma_2^2$). The third set has
# $2\lambda_1 = d\sigma_1^2$: the theorem guarantees nothing, and the variance decays only slowly
# (the theorem's condition is sufficient, not necessary).
#
# ## Theorem 2.2: distance to a large-N reference
#
# Rastrigin classes centred at $\pm(1,1)$. At time $T$ the class-0 particles of an
# $N$-particle system are compared with those of a reference system by an exact sliced
# 1-Wasserstein distance (`meanfield.sliced_wasserstein`), averaged over independent runs.

# %%
steps_T = 100
dyn_r = clustered([objectives.RastriginNormalized(shift=c) for c in centers],
                  ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.01, alpha=10.0, noise="isotropic"))


def class0_at_T(n, seed):
    p = particles(np.random.default_rng(seed).uniform(-3, 3, (n, d)), np.arange(n) % 2)
    x = np.asarray(cj.simulate(dyn_r, p, jax.random.key(seed), steps_T).state.x)
    return x[np.arange(n) % 2 == 0]


n_ref, sizes, seeds = (50_000, [100, 1_000, 10_000], 3) if SMALL else (1_000_000, [100, 1_000, 10_000, 100_000], 8)
reference = meanfield.SlicedReference(class0_at_T(n_ref, seed=123), jax.random.key(0))
errors = []
for n in sizes:
    errors.append(np.mean([float(reference.distance(class0_at_T(n, s))) for s in range(seeds)]))
    print(f"N = {n:>7}: sliced W1 to the N = {n_ref} reference {errors[-1]:.4f}")
slope = meanfield.fit_loglog_slope(sizes, errors)
fig, ax = plt.subplots(figsize=(5, 3.6))
ax.loglog(sizes, errors, "o-", label=f"measured, slope {slope:.2f}")
ax.loglog(sizes, errors[0] * (np.asarray(sizes) / sizes[0]) ** -0.5, "k--", label="Monte-Carlo rate $N^{-1/2}$")
ax.set_xlabel("N")
ax.set_ylabel("sliced W1 at time T")
ax.legend()
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
LiveFigure(fig, f"{OUT}/scaling.png").close()
print(f"log-log slope {slope:.3f} (Monte-Carlo rate -0.5); the reference's own error flattens the curve "
      f"when N approaches N_ref")

# %% [markdown]
# ## Propagation of chaos, pathwise: eq. (50)
#
# The sliced distance above compares *distributions*: $N$ independent samples of $\rho_T$ are
# also $O(N^{-1/2})$ away from it, so that slope cannot tell interacting particles from
# independent ones. The JMLR version of the paper (Proposition 1, eq. (50)) couples each
# particle $\theta^i$ with a mean-field copy $\bar\theta^i$: the same initial point, the same
# Brownian increments, but the consensus point of the mean-field law $\rho_t$ instead of the
# $N$ particles'. Then $E|\theta^i_t - \bar\theta^i_t|^2 \le C(1/N_1 + 1/N_2)$.
#
# `meanfield.reference_consensus` runs a large independent ensemble (streaming consensus,
# `particle_chunk`) and records $m_\alpha(\rho_t)$ at every step; `meanfield.coupling` runs the
# particles and their copies in one scanned program (`dynamics.drive` moves the copies with
# exactly the particles' noise). Two quadratic classes, as in the first section.

# %%
R, chunk = (200_000, 50_000) if SMALL else (1_000_000, 100_000)
sizes_c = [100, 316, 1_000, 3_162] if SMALL else [100, 316, 1_000, 3_162, 10_000, 31_623, 100_000]
runs_c, steps_c = (8, 100) if SMALL else (16, 100)
quad = [objectives.Quadratic(shift=c) for c in centers]
cfg_c = ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.01, alpha=10.0, noise="isotropic")
rng_c = np.random.default_rng(2)
x_ref = rng_c.uniform(-3, 3, (R, d)).astype(np.float32)
path = meanfield.reference_consensus(clustered(quad, cfg_c, particle_chunk=chunk),
                                     particles(x_ref, np.arange(R) % 2), 10_000, steps_c)
dyn_c = clustered(quad, cfg_c)
sq = {}
for n in sizes_c:
    one = particles(np.zeros((n, d), np.float32), np.arange(n) % 2)
    stack = lambda v: np.broadcast_to(np.asarray(v), (runs_c,) + np.shape(v))  # noqa: E731
    p_runs = one._replace(x=rng_c.uniform(-3, 3, (runs_c, n, d)).astype(np.float32), label=stack(one.label),
                          malicious=stack(one.malicious), pid=stack(one.pid))
    sq[n] = meanfield.coupling(dyn_c, p_runs, n, path, num_runs=runs_c).sq_distance.mean(axis=0)
    print(f"N = {n:>6}: E|θ_T - θ̄_T|² = {sq[n][-1]:.3g}")
final = [sq[n][-1] for n in sizes_c]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
cj.plot.loglog_error(sizes_c, final, reference_slope=-1.0, ax=axes[0], ylabel=r"$E|\theta^i_T - \bar\theta^i_T|^2$",
                     title=f"eq. (50), reference R = {R:.0e}")
t_c = dt * np.arange(steps_c + 1)
for n in sizes_c:
    axes[1].semilogy(t_c[1:], sq[n][1:], label=f"N={n}")
axes[1].set_xlabel("t")
axes[1].set_title("over time")
axes[1].legend(fontsize=7)
fig.tight_layout()
LiveFigure(fig, f"{OUT}/coupling.png").close()
print(f"log-log slope {meanfield.fit_loglog_slope(sizes_c, final):.3f} (eq. (50): -1)")

# %% [markdown]
# ## Watching one run
#
# `cj.plot.record_history` keeps a frame every few steps (memory bounded by the number of
# frames, not steps), and `cj.plot.snapshots` / `cj.plot.animate` draw them over the
# objective's contour (Figure objects; `animate` writes a GIF with matplotlib's Pillow writer).

# %%
rast2 = objectives.Rastrigin()
hist = cj.plot.record_history(cj.cbo(rast2, sigma1=1.0, alpha=cj.schedules.Multiplicative(10.0, 1.05, 1e5)),
                              np.random.default_rng(3).uniform(-3, 3, (200, 2)), 0, 200, every=10)
snap = cj.plot.snapshots(rast2, hist, frames=[0, 2, 5, 20], bounds=((-3, 3), (-3, 3)))
LiveFigure(snap, f"{OUT}/snapshots.png").close()
gif = cj.plot.animate(rast2, hist, f"{OUT}/cbo_rastrigin.gif", fps=6, bounds=((-3, 3), (-3, 3)))
print("animation:", gif)
