import jax
from cbo_jax import models
from cbo_jax.federated import data, mnist
from cbo_jax.federated.algorithms import FedCBOConfig, fedcbo
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.run import run_federated

source = mnist.load_mnist("bundled")                  # the real-MNIST subset shipped in the package
fed = data.rotated_mnist(source, num_agents=16, num_clusters=4, samples_per_agent=100, seed=0)
model = models.mlp_mnist()                            # MLP 784-200-10, parameters stacked over agents

config = FedCBOConfig(
    M=4, alpha=10.0,                                  # downloads per round; μ = exp(-α L), eq. (19)
    lambda1=9.8, gamma=0.1,                           # aggregation step λ1 γ = 0.98, eq. (20)
    eps0=0.5, eps_decay=0.01, eps_min=0.1,            # ε-greedy schedule (Remark 3)
    noise="anisotropic", sigma1=0.01,                 # Appendix E aggregation noise (default "none")
    local=LocalSGDConfig(epochs=1, batch_size=50, lr=0.05),
)
algorithm = fedcbo(model, config, fed.num_agents)     # a pure (init, round) pair
result = run_federated(algorithm, model, fed, rounds=3, key=jax.random.key(0),
                       test_size=200, progress=False)
print(result.summary)
