import jax
import jax.numpy as jnp
import numpy as np
import cbo_jax as cj

# 1. minimize: build the dynamics and simulate them in one call
x0 = jax.random.uniform(jax.random.key(0), (200, 5), minval=-3, maxval=3)
res = cj.minimize(cj.objectives.Ackley(), x0, jax.random.key(1), 500,
                  lambda1=1.0, sigma1=1.0, dt=0.01, alpha=100.0)
print(res.state.best_x, res.state.best_energy)

# 2. the same step by step: init and step are pure, jittable functions
dyn = cj.cbo(cj.objectives.Ackley(), lambda1=1.0, sigma1=1.0, dt=0.01, alpha=100.0)
state = dyn.init(x0, jax.random.key(1))
step = jax.jit(dyn.step)
for _ in range(10):
    state = step(state)
print(int(state.step), state.consensus.shape)

# 3. a population that is a pytree: lift a one-agent loss with per_agent
loss = lambda p: jnp.sum((p["w"] - 1.0) ** 2) + jnp.sum(p["b"] ** 2)
params = {"w": jnp.zeros((100, 3, 2)), "b": jnp.ones((100, 2))}    # 100 agents
params = jax.tree_util.tree_map(lambda a: a + jax.random.normal(jax.random.key(2), a.shape), params)
dyn = cj.cbo(cj.population.per_agent(loss), lambda1=1.0, sigma1=0.5, lambda2=0.5, dt=0.05, alpha=100.0)
res = cj.simulate(dyn, params, jax.random.key(3), 300)
print(jax.tree_util.tree_map(lambda a: np.round(np.asarray(a), 2), res.state.consensus))
print(sorted(res.history))
