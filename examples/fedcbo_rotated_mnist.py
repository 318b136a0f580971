"""FedCBO on rotated MNIST through the Python API (bundled real-MNIST subset, offline).

Run:  python examples/fedcbo_rotated_mnist.py          (about a minute on 2 CPU cores)
Set CBO_JAX_DATA_DIR to a directory with the MNIST IDX files to use the full data set.
It writes results/example-fedcbo/ (under the current directory); a second run replaces
that run's files there (``overwrite=True``).
"""

import jax

import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import mnist

source = mnist.load_mnist("auto")                    # IDX files if CBO_JAX_DATA_DIR is set, else bundled
data = fl.rotated_mnist(source, num_agents=40, num_clusters=4, samples_per_agent=200, seed=0)
model = models.mlp_mnist()                           # MLP 784-200-10, one per agent (stacked)

config = fl.FedCBOConfig(
    M=8,                                             # downloads per agent per round
    alpha=10.0,                                      # μ = exp(-α L), eq. (19)
    lambda1=9.8, gamma=0.1,                          # aggregation step λ1γ = 0.98, eq. (20)
    eps0=0.5, eps_decay=0.05, eps_min=0.1,           # ε-greedy schedule (Remark 3)
    local=fl.LocalSGDConfig(epochs=2, batch_size=64, lr=0.05, momentum=0.9),
)
algorithm = fl.fedcbo(model, config, data.num_agents)   # a pure (init, round) pair

# What to measure is plain functions: per round from the round's info (SR_n needs the
# true clusters, which only the metrics see), at evaluation rounds from the models.
result = fl.run(algorithm, data, rounds=15, key=jax.random.key(0), every=5,
                round_metrics=[fl.metrics.round_stats, fl.metrics.selection(data.cluster)],
                metrics=[fl.metrics.test_accuracy(model, data, test_size=1000)],
                out="results/example-fedcbo", overwrite=True)  # metrics.jsonl, summary.json, config.json, metrics.png
print(result.summary)
