"""How much of an isotropic perturbation survives τ epochs of local SGD (FedCBO, Appendix E).

FedCBO's isotropic aggregation noise adds ``δ = σ1 √γ |θ - m| z`` (``z ~ N(0, I_d)``,
``|·|`` the norm of the whole parameter vector, ``d = 159,010`` for the MLP 784-200-10)
to an agent's model. This script measures what the next local update does to ``δ``.

Setting: rotated MNIST (4 rotations, 4 agents per rotation, 200 images each), the
package's local SGD with FedCBO's defaults (``LocalSGDConfig()``: batch 128, lr 0.1,
momentum 0.9, optimizer reset every round). Every agent trains ``--warmup-rounds``
rounds of τ = 5 epochs from its own initialisation (no aggregation); ``m`` is the mean
model of its rotation and ``θ`` its own model (``--base agent``, default) or, as after
FedCBO's aggregation step (20) without noise, ``(1 - λ1γ) θ + λ1γ m`` with λ1γ = 0.98
(``--base aggregated``). For the first agent of each rotation,
``σ1`` in ``--sigmas`` and τ in ``--taus``, the same τ epochs of local SGD (same
mini-batch order, same key) run from ``θ`` and from ``θ + δ``, and the script reports

* ``survival = |θ'(θ + δ) - θ'(θ)| / |δ|``, the part of δ that local SGD leaves;
* ``cosine`` between ``θ'(θ + δ) - θ'(θ)`` and ``δ``;
* the same two on the first layer's weights of the input pixels that are 0 in all of
  the agent's images (their gradient is exactly 0) and on all other parameters.

γ = 0.1 (FedCBO's default, eq. (70) as written).

    CBO_JAX_DATA_DIR=/path/to/data python benchmarks/noise_survival.py

(without ``CBO_JAX_DATA_DIR`` it uses the bundled 10,000-image subset). Last line: one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from cbo_jax.federated import data as fdata
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.federated.mnist import load_mnist
from cbo_jax.models import init_population, mlp_mnist
from cbo_jax.runtime.provenance import environment

GAMMA = 0.1
LAMBDA1_GAMMA = 0.98
CLUSTERS, PER_CLUSTER, SAMPLES = 4, 4, 200


def main(warmup_rounds: int, taus: list[int], sigmas: list[float], seed: int, base: str = "agent") -> dict:
    t_start = time.perf_counter()
    mnist = load_mnist("auto")
    fd = fdata.rotated_mnist(mnist, CLUSTERS * PER_CLUSTER, CLUSTERS, SAMPLES, seed=seed)
    model = mlp_mnist()
    data = AgentData(jnp.asarray(fd.x), jnp.asarray(fd.y), jnp.asarray(fd.counts))

    def trainer(cfg, agent_data):
        return jax.jit(lambda p, k: local_train(model, cfg, p, None, agent_data, k).params)

    # Warm-up: every agent trains alone for warmup_rounds rounds of 5 epochs.
    warm = trainer(LocalSGDConfig(epochs=5), data)
    key = jax.random.key(seed)
    params = init_population(model, jax.random.fold_in(key, 0), CLUSTERS * PER_CLUSTER)
    for r in range(warmup_rounds):
        params = warm(params, jax.random.fold_in(key, 1 + r))

    flat = jax.vmap(lambda p: ravel_pytree(p)[0])(params)  # (N, d)
    unravel = ravel_pytree(jax.tree_util.tree_map(lambda a: a[0], params))[1]
    d = flat.shape[1]
    chosen = [k * PER_CLUSTER for k in range(CLUSTERS)]  # the first agent of each rotation
    sub = AgentData(data.x[jnp.asarray(chosen)], data.y[jnp.asarray(chosen)], data.counts[jnp.asarray(chosen)])
    theta = flat[jnp.asarray(chosen)]
    means = jnp.stack([flat[k * PER_CLUSTER:(k + 1) * PER_CLUSTER].mean(0) for k in range(CLUSTERS)])
    spread = jnp.linalg.norm(theta - means, axis=1)  # |θ - m| per chosen agent
    if base == "aggregated":  # the aggregation step's mean, before its noise
        theta = (1 - LAMBDA1_GAMMA) * theta + LAMBDA1_GAMMA * means

    # The first layer's weights of pixels that are 0 in all of an agent's images: zero gradient.
    idx = jnp.arange(d)
    probe = unravel(idx.astype(jnp.float32))
    kernel0 = np.asarray(probe["params"]["Dense_0"]["kernel"]).astype(np.int64)  # (784, 200) flat positions
    dead = np.zeros((len(chosen), d), bool)
    for a, j in enumerate(chosen):
        zero_pixel = np.asarray(fd.x[j]).reshape(SAMPLES, -1).max(0) == 0
        dead[a, kernel0[zero_pixel].ravel()] = True
    dead = jnp.asarray(dead)

    z = jax.random.normal(jax.random.fold_in(key, 10_000), theta.shape, jnp.float32)
    train_key = jax.random.fold_in(key, 20_000)

    def cos(u, v):
        return float(jnp.vdot(u, v) / (jnp.linalg.norm(u) * jnp.linalg.norm(v)))

    rows = []
    for tau in taus:
        run = trainer(LocalSGDConfig(epochs=tau), sub)
        to_tree = jax.vmap(unravel)
        ref = jax.vmap(lambda p: ravel_pytree(p)[0])(run(to_tree(theta), train_key))
        for sigma in sigmas:
            delta = sigma * np.sqrt(GAMMA) * spread[:, None] * z
            moved = jax.vmap(lambda p: ravel_pytree(p)[0])(run(to_tree(theta + delta), train_key))
            diff = moved - ref
            for a, j in enumerate(chosen):
                dd, de, m = diff[a], delta[a], dead[a]
                live = ~m
                row = {
                    "tau": tau, "sigma1": sigma, "agent": j, "rotation": int(fd.cluster[j]),
                    "theta_norm": float(jnp.linalg.norm(theta[a])), "spread": float(spread[a]),
                    "delta_norm": float(jnp.linalg.norm(de)),
                    "delta_over_theta": float(jnp.linalg.norm(de) / jnp.linalg.norm(theta[a])),
                    "survival": float(jnp.linalg.norm(dd) / jnp.linalg.norm(de)),
                    "cosine": cos(dd, de),
                    "dead_share_of_delta_sq": float(jnp.sum(jnp.where(m, de, 0) ** 2) / jnp.sum(de ** 2)),
                    "survival_dead": float(jnp.linalg.norm(jnp.where(m, dd, 0)) / jnp.linalg.norm(jnp.where(m, de, 0))),
                    "survival_live": float(jnp.linalg.norm(jnp.where(live, dd, 0)) / jnp.linalg.norm(jnp.where(live, de, 0))),
                    "cosine_live": cos(jnp.where(live, dd, 0), jnp.where(live, de, 0)),
                }
                rows.append(row)
            sel = [r for r in rows if r["tau"] == tau and r["sigma1"] == sigma]
            print(f"tau={tau:2d} sigma1={sigma:<7g} |delta|/|theta| {np.mean([r['delta_over_theta'] for r in sel]):.3f}  "
                  f"survival {min(r['survival'] for r in sel):.4f}-{max(r['survival'] for r in sel):.4f}  "
                  f"cosine {min(r['cosine'] for r in sel):.4f}-{max(r['cosine'] for r in sel):.4f}  "
                  f"live part: survival {min(r['survival_live'] for r in sel):.4f}-"
                  f"{max(r['survival_live'] for r in sel):.4f}, dead share of |delta|^2 "
                  f"{np.mean([r['dead_share_of_delta_sq'] for r in sel]):.3f}", flush=True)

    return {
        "data_source": mnist.source, "agents": CLUSTERS * PER_CLUSTER, "rotations": CLUSTERS,
        "samples_per_agent": SAMPLES, "d": int(d), "gamma": GAMMA, "warmup_rounds": warmup_rounds, "base": base,
        "warmup_epochs_per_round": 5, "local": {"batch_size": 128, "lr": 0.1, "momentum": 0.9,
                                                "reset_optimizer": True},
        "taus": taus, "sigmas": sigmas, "seed": seed, "rows": rows,
        "survival_range": [min(r["survival"] for r in rows), max(r["survival"] for r in rows)],
        "cosine_range": [min(r["cosine"] for r in rows), max(r["cosine"] for r in rows)],
        "wall_s": time.perf_counter() - t_start,
        "load_average": list(os.getloadavg()), "jax_version": jax.__version__, "environment": environment(),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warmup-rounds", type=int, default=3)
    p.add_argument("--taus", type=int, nargs="+", default=[5, 10])
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.001, 0.005, 0.01, 0.05])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", choices=["agent", "aggregated"], default="agent")
    a = p.parse_args()
    print(json.dumps(main(a.warmup_rounds, a.taus, a.sigmas, a.seed, a.base)))
