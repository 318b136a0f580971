import jax
import cbo_jax.federated as fl
from cbo_jax import models
from cbo_jax.federated import mnist

source = mnist.load_mnist("bundled")                  # the real-MNIST subset shipped in the package
data = fl.rotated_mnist(source, num_agents=16, num_clusters=4, samples_per_agent=100, seed=0)
model = models.mlp_mnist()                            # MLP 784-200-10, parameters stacked over agents

config = fl.FedCBOConfig(
    M=4, alpha=10.0,                                  # downloads per round; μ = exp(-α L), eq. (19)
    lambda1=9.8, gamma=0.1,                           # aggregation step λ1 γ = 0.98, eq. (20)
    eps0=0.5, eps_decay=0.01, eps_min=0.1,            # ε-greedy schedule (Remark 3)
    noise="anisotropic", sigma1=0.01,                 # Appendix E aggregation noise (default "none")
    local=fl.LocalSGDConfig(epochs=1, batch_size=50, lr=0.05),
)
algorithm = fl.fedcbo(model, config, data.num_agents)  # a pure (init, round) pair
round_metrics, metrics = fl.metrics.default_metrics(model, data, test_size=200)  # SR_n, accuracy, ...
result = fl.run(algorithm, data, rounds=3, key=jax.random.key(0), metrics=metrics,
                round_metrics=round_metrics, progress=False)
print(result.summary)
