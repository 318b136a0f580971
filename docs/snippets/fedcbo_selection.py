import jax
import jax.numpy as jnp
import cbo_jax.federated as fl

N, M = 8, 3
rule = fl.epsilon_greedy(M, eps0=0.5, eps_decay=0.01, eps_min=0.1)   # Remark 3
P = rule.init(N, N)                                      # ones, -inf on the diagonal
sel = rule.select(jax.random.key(0), P, 0)               # round 0: ε(0) = 0.5
own = jnp.zeros(N)                                       # L_j^j
loss = jax.random.uniform(jax.random.key(1), (N, M))     # L_j^i of the downloads
P = rule.update(P, sel.idx, loss, own)                   # eq. (21)
print(sel.idx, sel.is_random[0], float(sel.eps))
