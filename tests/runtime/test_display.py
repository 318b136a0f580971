"""A result or a data set printed at a prompt: shapes, scalars and names, not every number."""

import jax
import jax.numpy as jnp
import numpy as np

import cbo_jax as cj
from cbo_jax import _repr
from cbo_jax import federated as fl


def test_a_simulation_result_prints_its_shapes_not_its_particles():
    dyn = cj.cbo(lambda x: jnp.sum(x ** 2, -1), sigma1=0.5, dt=0.05)
    x0 = jax.random.normal(jax.random.key(0), (3, 5000, 2))
    res = cj.simulate(dyn, x0, jax.random.key(1), 4, num_runs=3, record_consensus=True)
    text = repr(res)
    assert len(text) < 600, text
    assert text.startswith("SimulationResult(steps=4, seconds=")
    assert "state=CBOState(x=float32[3, 5000, 2], best_energy=float32[3], consensus=float32[3, 2], step=int32[3]" in text
    assert "history={active: bool[4, 3], alpha: float32[4, 3], best_energy: float32[4, 3], " \
           "consensus: float32[4, 3, 2], evals: int32[4, 3], min_energy: float32[4, 3]}" in text
    assert str(res) == text
    state, history, steps, seconds = res  # still the named tuple it was
    assert steps == 4 and res._replace(steps=5).steps == 5


def test_a_pytree_population_prints_its_leaves_by_path_and_one_run_its_scalars():
    agents = {"w": jnp.zeros((6, 3, 2)), "b": jnp.zeros((6, 2))}
    dyn = cj.cbo(cj.population.per_agent(lambda p: jnp.sum((p["w"] - 1) ** 2) + jnp.sum(p["b"] ** 2)),
                 sigma1=0.5, dt=0.05)
    res = cj.simulate(dyn, agents, jax.random.key(3), 2)
    text = repr(res)
    assert "x={b: float32[6, 2], w: float32[6, 3, 2]}" in text
    best = float(res.state.best_energy)
    assert f"best_energy={best:.6g}" in text and "step=2" in text


def test_leaves_and_trees():
    assert _repr.leaf(None) == "None"
    assert _repr.leaf(np.bool_(True)) == "True" and _repr.leaf(jnp.int32(7)) == "7"
    assert _repr.leaf(jnp.float32(0.25)) == "0.25" and _repr.leaf(3) == "3"
    assert _repr.leaf(jax.random.key(0)) == "key<fry>[]"
    assert _repr.leaf(jnp.zeros((2, 0))) == "float32[2, 0]"
    big = {f"layer{i}": {"kernel": jnp.zeros((4, 3)), "bias": jnp.zeros((3,))} for i in range(3)}
    assert _repr.tree(big) == "<dict of 6 arrays: 45 numbers>"
    assert _repr.tree([jnp.zeros(2), (jnp.ones(3),)]) == "{0: float32[2], 1/0: float32[3]}"
    assert _repr.columns(list("abcdefghij"), limit=3) == "a, b, c, +7 more"
    seen = []
    jax.jit(lambda s: seen.append(_repr.tree(s)) or s)(cj.params.Params(1.0, 2.0, 0.0, 0.0, 0.01, None, None))
    assert seen == ["Params(lambda1=float32[], sigma1=float32[], lambda2=float32[], sigma2=float32[], +1 more)"]


def test_a_federated_run_result_prints_its_summary_and_its_rows_by_name():
    from federated.test_runner import _tiny_local_run

    data, alg = _tiny_local_run(1)
    res = fl.run(alg, data, 3, jax.random.key(0), progress=False, plots=False,
                 round_metrics=[fl.metrics.round_stats])
    text = repr(res)
    assert text.startswith(f"RunResult(summary={res.summary!r},")
    assert "state=LocalState(params={params/bias: float32[4, 3], params/kernel: float32[4, 2, 3]}" in text
    assert "round=3" in text
    assert text.endswith("history=[3 rows of round, diverged_agents, participants, train_loss, elapsed_s])")


def test_federated_data_prints_its_counts_and_shapes_not_its_images():
    x = np.zeros((6, 5, 28, 28), np.uint8)
    data = fl.FederatedData(x, np.zeros((6, 5), np.int32), np.array([5, 5, 4, 5, 3, 5]),
                            cluster=np.array([0, 0, 0, 1, 1, 1]), test_x=np.zeros((2, 7, 28, 28), np.uint8),
                            test_y=np.zeros((2, 7), np.int32))
    assert repr(data) == (
        "FederatedData(6 agents, 27 training samples, 2 clusters, 2 test sets;\n"
        "    x=uint8[6, 5, 28, 28], y=int32[6, 5], counts=int64[6], cluster=int64[6], test_x=uint8[2, 7, 28, 28], "
        "test_y=int32[2, 7], test_counts=None, test_of=None)")
    assert repr(data.train.pad(8)) == (
        "AgentData(8 agents; x=uint8[8, 5, 28, 28], y=int32[8, 5], counts=int32[8], valid=bool[8])")
    seen = []
    jax.jit(lambda d: seen.append(repr(d)) or d.counts.sum())(data.train)  # traced fields print by shape too
    assert seen == ["AgentData(6 agents; x=uint8[6, 5, 28, 28], y=int32[6, 5], counts=int32[6], valid=None)"]


def test_a_model_and_an_algorithm_print_by_name_and_config():
    model = cj.models.mlp_mnist()
    assert repr(model) == f"Model({model.name!r}, num_classes=10, loss=cross_entropy)"
    import flax.linen as nn

    class Dropped(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(3)(nn.Dropout(0.5, deterministic=not train)(x))

    dropout = cj.models.from_flax(Dropped(), jnp.zeros((1, 4)), num_classes=3, name="dropped")
    assert repr(dropout) == "Model('dropped', num_classes=3, loss=cross_entropy, train_apply=set)"
    alg = fl.fedavg(model, fl.FedAvgConfig(), 8)
    text = repr(alg)
    assert text == f"Algorithm('fedavg', config={alg.config!r}, model={model!r}, num_agents=8)"
    assert "<function" not in text and " at 0x" not in text


def test_dynamics_print_their_objective_and_config():
    config = cj.CBOConfig(sigma1=2.0)
    assert repr(cj.cbo(cj.objectives.Rastrigin(), config)) == (
        f"Dynamics(objective=Rastrigin(shift=0.0), config={config!r})")

    def bowl(x):
        return jnp.sum(x ** 2, -1)

    assert repr(cj.cbo(bowl, config)).startswith(
        "Dynamics(objective=test_dynamics_print_their_objective_and_config.<locals>.bowl, config=CBOConfig(")
