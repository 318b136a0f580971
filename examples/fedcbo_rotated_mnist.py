"""FedCBO on rotated MNIST through the Python API (bundled real-MNIST subset, offline).

Run:  python examples/fedcbo_rotated_mnist.py          (about a minute on 2 CPU cores)
Set CBO_JAX_DATA_DIR to a directory with the MNIST IDX files to use the full data set.
"""

import jax

from cbo_jax import models
from cbo_jax.federated import data, mnist
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.run import run_federated

source = mnist.load_mnist("auto")                    # IDX files if CBO_JAX_DATA_DIR is set, else bundled
fed = data.rotated_mnist(source, num_agents=40, num_clusters=4, samples_per_agent=200, seed=0)
model = models.mlp_mnist()                           # MLP 784-200-10, one per agent (stacked)

config = FedCBOConfig(
    M=8,                                             # downloads per agent per round
    alpha=10.0,                                      # μ = exp(-α L), eq. (19)
    lambda1=9.8, gamma=0.1,                          # aggregation step λ1γ = 0.98, eq. (20)
    eps0=0.5, eps_decay=0.05, eps_min=0.1,           # ε-greedy schedule (Remark 3)
    local=LocalSGDConfig(epochs=2, batch_size=64, lr=0.05, momentum=0.9),
)
algorithm = fedcbo(model, config, fed.num_agents)    # a pure (init, round) pair

result = run_federated(algorithm, model, fed, rounds=15, key=jax.random.key(0), eval_every=5,
                       test_size=1000, out_dir="results/example-fedcbo")
print(result.summary)
