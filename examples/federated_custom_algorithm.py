"""A federated algorithm of your own, written against the package's pieces: FedAvg with server momentum.

FedAvgM (Hsu, Qi and Brown, 2019): the agents of G_n train from the global model θ as in
FedAvg; the server takes the data-weighted average θ̄ of their models as a pseudo-gradient
step Δ = θ̄ - θ and applies it with momentum,

    v ← β v + Δ,    θ ← θ + v.

With β = 0 it is FedAvg. The algorithm is an ``fl.Algorithm``: a pure ``init(key)`` and
``round(state, data) -> (state, info)``, an ``eval_models`` that says which models are tested,
and NamedTuples for the state and the info, the per-agent fields marked with
``fl.per_agent_fields`` (so the runner can pad and shard them). ``fl.run`` then gives it what
the package's algorithms get: compiled scans of rounds, metrics, results files, checkpoints
and resumes, sharding.

    python examples/federated_custom_algorithm.py            # 30 rounds, about half a minute on 2 CPU cores
    python examples/federated_custom_algorithm.py --quick    # 5 rounds

The data: 16 agents with a 3-class problem in 10 dimensions (Gaussian classes), each agent a
different number of samples; the model: a small Flax MLP.

The last line printed is one JSON object: the final test accuracy (%) of FedAvg and of
FedAvgM with β = 0.9, and the largest difference between FedAvgM with β = 0 and FedAvg's
global models (float rounding).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax.federated as fl


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.relu(nn.Dense(16)(x)))


def gaussian_classes(agents: int = 16, dim: int = 10, seed: int = 0) -> fl.FederatedData:
    """Per-agent samples of three Gaussian classes (shared means), unequal sizes, a test set each."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(3, dim)) * 1.2
    xs, ys, txs, tys = [], [], [], []
    for j in range(agents):
        for n, (xl, yl) in ((int(rng.integers(20, 80)), (xs, ys)), (200, (txs, tys))):
            y = rng.integers(0, 3, n)
            xl.append((means[y] + rng.normal(size=(n, dim))).astype(np.float32))
            yl.append(y.astype(np.int32))
    return fl.FederatedData.from_lists(xs, ys, test_x=txs, test_y=tys, test_of=np.arange(agents))


@dataclasses.dataclass(frozen=True)
class FedAvgMConfig(fl.BaselineConfig):
    """FedAvg's settings (``participation``, ``local``) and the server momentum β."""

    beta: float = 0.9

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must lie in [0, 1), got {self.beta}")


class FedAvgMState(NamedTuple):
    params: Any  # the global model (no agent axis)
    velocity: Any  # the server's momentum, shaped like the model
    round: jax.Array
    key: jax.Array  # the state carries its own key: a resumed run draws what the uninterrupted one drew


@fl.per_agent_fields("active", "train_loss")
class FedAvgMInfo(NamedTuple):
    active: jax.Array  # (N,) agents in G_n; fl.metrics.round_stats reads it, and train_loss
    train_loss: jax.Array  # (N,) mean mini-batch loss of each agent's last local epoch


def fedavgm(model: fl.Model, cfg: FedAvgMConfig, num_agents: int) -> fl.Algorithm:
    def init(key):
        k_model, k_state = jax.random.split(key)
        params = model.init(k_model)
        return FedAvgMState(params, jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.int32), k_state)

    def round_fn(state: FedAvgMState, data: fl.AgentData):
        key, k_part, k_local = jax.random.split(state.key, 3)
        active = fl.participants(k_part, data.agent_mask, cfg.participation)  # G_n (padding agents never)
        start = fl.broadcast(state.params, data.counts.shape[0])  # every agent starts from θ
        trained = fl.local_train(model, cfg.local, start, None, data, k_local)
        weights = jnp.where(active, data.counts, 0).astype(jnp.float32)
        average = jax.tree_util.tree_map(
            lambda leaf: jnp.tensordot(weights, leaf, axes=1) / jnp.sum(weights), trained.params)
        velocity = jax.tree_util.tree_map(lambda v, a, p: cfg.beta * v + (a - p), state.velocity, average,
                                          state.params)
        params = jax.tree_util.tree_map(jnp.add, state.params, velocity)
        return FedAvgMState(params, velocity, state.round + 1, key), FedAvgMInfo(active, trained.loss)

    # "server": one model (a leading axis of 1) tested on every test set, as FedAvg's
    return fl.Algorithm("fedavgm", init, round_fn,
                        lambda s: ("server", jax.tree_util.tree_map(lambda a: a[None], s.params)), cfg, model=model,
                        num_agents=num_agents)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 rounds instead of 30")
    args = p.parse_args()
    rounds = 5 if args.quick else 30
    data = gaussian_classes()
    model = fl.from_flax(MLP(), data.train.x[0, :1])
    local = fl.LocalSGDConfig(epochs=1, batch_size=16, lr=0.02, momentum=0.0)
    metrics = [fl.metrics.test_accuracy(model, data)]
    kw = dict(round_metrics=[fl.metrics.round_stats], metrics=metrics, every=rounds, progress=False)
    key = jax.random.key(0)
    fedavg = fl.run(fl.fedavg(model, fl.FedAvgConfig(local=local), data.num_agents), data, rounds, key, **kw)
    plain = fl.run(fedavgm(model, FedAvgMConfig(local=local, beta=0.0), data.num_agents), data, rounds, key, **kw)
    momentum = fl.run(fedavgm(model, FedAvgMConfig(local=local, beta=0.9), data.num_agents), data, rounds, key, **kw)
    gap = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
        jax.tree_util.tree_leaves(fedavg.state.params), jax.tree_util.tree_leaves(plain.state.params)))
    for name, res in (("FedAvg", fedavg), ("FedAvgM, beta = 0", plain), ("FedAvgM, beta = 0.9", momentum)):
        print(f"{name:20s} test accuracy {res.history[-1]['test_acc']:.2f} %, train loss "
              f"{res.history[-1]['train_loss']:.4f}")
    print(json.dumps({"rounds": rounds, "fedavg_final": fedavg.history[-1]["test_acc"],
                      "fedavgm_final": momentum.history[-1]["test_acc"], "beta0_max_abs_diff_to_fedavg": gap}))


if __name__ == "__main__":
    main()
