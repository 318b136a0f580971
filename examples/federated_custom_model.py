"""FedCBO against FedAvg on a problem of your own: a Flax model, your data, public names only.

The problem: K linear-regression tasks. Agents of cluster k see inputs x ~ N(0, I_d) and
targets y = x·w_k + noise, with one true w_k per cluster; nobody is told the clusters.
The model is any Flax module (here a one-layer MLP with a linear output) with a
squared-error loss. FedAvg learns one model for everyone, so its test error is that of
the average task; FedCBO finds its peers by their losses and learns each task.

    python examples/federated_custom_model.py            # about a minute on 2 CPU cores
    python examples/federated_custom_model.py --quick    # a few seconds of training (CI)

Both write results/federated_custom_model/{fedcbo,fedavg}/ (``--output``); a second run
replaces the runs' files there.

The last line printed is one JSON object: ``fedcbo_final``, ``fedavg_final`` (the mean
test MSE over agents, each agent on its own test set), ``metric`` and ``higher_is_better``.
"""

import argparse
import json

import flax.linen as nn
import jax
import numpy as np

import cbo_jax.federated as fl


class Regressor(nn.Module):
    """A small MLP with a scalar output (any Flax module works)."""

    hidden: int = 16

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.hidden)(x)
        return nn.Dense(1)(h)  # linear: the tasks are linear


def clustered_regression(clusters: int, per_cluster: int, samples: int, dim: int, noise: float, seed: int):
    """Per-agent lists of (x, y) with unequal sizes, one test set per agent, and the true clusters."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(clusters, dim)) * 2.0  # the K true tasks
    xs, ys, txs, tys, cluster = [], [], [], [], []
    for k in range(clusters):
        for _ in range(per_cluster):
            n = int(rng.integers(samples // 2, samples + 1))  # agents hold different amounts of data
            x = rng.normal(size=(n, dim)).astype(np.float32)
            xs.append(x)
            ys.append((x @ w[k] + noise * rng.normal(size=n)).astype(np.float32))
            t = rng.normal(size=(100, dim)).astype(np.float32)
            txs.append(t)
            tys.append((t @ w[k]).astype(np.float32))
            cluster.append(k)
    return fl.FederatedData.from_lists(xs, ys, cluster=cluster, test_x=txs, test_y=tys,
                                       test_of=np.arange(len(xs)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=3)
    p.add_argument("--agents-per-cluster", type=int, default=10)
    p.add_argument("--samples", type=int, default=40, help="at most this many samples per agent")
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small run (CI): 6 rounds")
    p.add_argument("--output", default="results/federated_custom_model")
    args = p.parse_args()
    rounds = 6 if args.quick else args.rounds

    data = clustered_regression(args.clusters, args.agents_per_cluster, args.samples, args.dim, noise=0.1,
                                seed=args.seed)
    model = fl.from_flax(Regressor(), data.x[0, :1], loss="squared_error", name="regressor")
    data.check(model)  # shapes, counts, the model's output against the targets: before any compilation
    n = data.num_agents

    local = fl.LocalSGDConfig(epochs=5, batch_size=20, lr=0.02, momentum=0.5)
    algorithms = {
        "fedcbo": fl.fedcbo(model, fl.FedCBOConfig(M=5, alpha=10.0, eps0=0.3, eps_decay=0.02, eps_min=0.1,
                                                   local=local), n),
        "fedavg": fl.fedavg(model, fl.FedAvgConfig(local=local), n),
    }
    # Per round: local loss, SR_n against the true clusters; at evaluation rounds: the test loss.
    round_metrics, metrics = fl.metrics.default_metrics(model, data, log=None)
    final = {}
    for name, algorithm in algorithms.items():
        res = fl.run(algorithm, data, rounds, jax.random.key(args.seed), metrics=metrics, round_metrics=round_metrics,
                     every=max(1, rounds // 4), out=f"{args.output}/{name}", overwrite=True, progress=False)
        final[name] = res.summary["final_test_loss"]
        extra = f", SR {res.summary['final_sr']:.2f}" if "final_sr" in res.summary else ""
        print(f"{name}: test MSE {final[name]:.4f} after {rounds} rounds{extra}")
    print(json.dumps({"fedcbo_final": round(final["fedcbo"], 6), "fedavg_final": round(final["fedavg"], 6),
                      "metric": "test_mse", "higher_is_better": False}))


if __name__ == "__main__":
    main()
