import jax
import jax.numpy as jnp
from cbo_jax.federated import selection

N, M = 8, 3
P = selection.init_likelihood(N)                         # ones, -inf on the diagonal
eps = selection.epsilon_schedule(0)                      # ε(0) = 0.5
idx, is_random = selection.epsilon_greedy(jax.random.key(0), P, M, eps)
own = jnp.zeros(N)                                        # L_j^j
loss = jax.random.uniform(jax.random.key(1), (N, M))      # L_j^i of the downloads
P = selection.update_likelihood(P, idx, own, loss)       # eq. (21)
print(idx, is_random[0], float(eps))
