"""Entry points as a new user meets them (cbo_jax.minimize, and simulate's seeds and sizes):
minimize(f, dim=d, key=0), seeds, clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives

from _stack import enable_x64


def test_minimize_with_dim_and_an_integer_seed_lifts_a_single_particle_objective():
    single = lambda x: jnp.sum((x - 1.0) ** 2)  # noqa: E731 - written for ONE particle, as in CBXpy
    res = cj.minimize(single, dim=3, key=0, num_steps=600, sigma1=0.5, alpha=100.0)
    assert res.state.x.shape == (100, 3)
    np.testing.assert_allclose(np.asarray(res.state.best_x), 1.0, atol=0.05)
    # The documented default population: 100 particles, U[-3, 3]^d, from split(key)[0]; the run uses split(key)[1].
    start = cj.minimize(single, dim=3, key=0, num_steps=0)
    k_init, k_run = jax.random.split(jax.random.key(0))
    x0 = jax.random.uniform(k_init, (100, 3), jnp.float32, -3.0, 3.0)
    np.testing.assert_array_equal(np.asarray(start.state.x), np.asarray(x0))
    np.testing.assert_array_equal(jax.random.key_data(start.state.key), jax.random.key_data(k_run))
    # An integer seed is the key jax.random.key(seed), in simulate too.
    dyn = cj.cbo(objectives.Sphere())
    a = cj.simulate(dyn, x0, 5, 0)
    np.testing.assert_array_equal(jax.random.key_data(a.state.key), jax.random.key_data(jax.random.key(5)))
    # init under jit and vmap: the integer seed is traced (refused before as "an integer seed, got a
    # tracer of int32"); the same state as eagerly
    eager = dyn.init(x0, 7)
    jitted = jax.jit(dyn.init)(x0, 7)
    np.testing.assert_array_equal(jax.random.key_data(jitted.key), jax.random.key_data(jax.random.key(7)))
    np.testing.assert_array_equal(np.asarray(jitted.x), np.asarray(eager.x))
    batched = jax.vmap(dyn.init)(jnp.stack([x0] * 3), jnp.arange(3))
    np.testing.assert_array_equal(jax.random.key_data(batched.key), jax.random.key_data(jax.vmap(jax.random.key)(
        jnp.arange(3))))
    with pytest.raises(ValueError, match="integer seed"):
        dyn.init(x0, jnp.float32(7.0))


def test_minimize_refuses_an_objective_it_cannot_read_when_n_equals_d():
    """With N = d a single-particle ``sum(axis=0)`` also maps the population to (N,): it was taken
    as a population objective, and the run minimised the columns' sums without a word."""
    x0 = np.random.default_rng(0).uniform(-3, 3, (4, 4)).astype(np.float32)
    single = lambda p: jnp.sum((p - 1.0) ** 2, axis=0)  # noqa: E731
    with pytest.raises(ValueError, match="cannot tell how to read the objective.*per_agent"):
        cj.minimize(single, x0, 0, 5)
    lifted = cj.minimize(cj.population.per_agent(single), x0, 0, 50, sigma1=0.5, alpha=100.0)
    # a row-wise function reads the same both ways: accepted (the same run as the lifted one); N != d is not ambiguous
    rowwise = cj.minimize(lambda p: jnp.sum((p - 1.0) ** 2, axis=-1), x0, 0, 50, sigma1=0.5, alpha=100.0)
    np.testing.assert_allclose(np.asarray(rowwise.state.best_x), np.asarray(lifted.state.best_x), rtol=1e-5)
    wide = np.random.default_rng(0).uniform(-3, 3, (8, 4)).astype(np.float32)
    assert cj.minimize(single, wide, 0, 2).state.x.shape == (8, 4)


def test_minimize_called_again_compiles_nothing_and_equals_a_fresh_build(monkeypatch):
    """minimize reuses the dynamics of an equal call (same objective object, equal config), so a
    loop of minimize calls compiles once; the results are those of dynamics built anew."""
    import importlib

    sim = importlib.import_module("cbo_jax.minimize")  # the module (cbo_jax.minimize is also the function)

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    f = objectives.Rastrigin(shift=np.full(4, 0.5))  # an array in the objective: keyed by the object itself
    cj.minimize(f, dim=4, key=0, num_steps=30, alpha=30.0, sigma1=0.7)
    before = len(compiles)
    again = cj.minimize(f, dim=4, key=1, num_steps=30, alpha=30.0, sigma1=0.7)
    assert len(compiles) == before, "an equal minimize call compiled again"
    k_init, k_run = jax.random.split(jax.random.key(1))
    x0 = jax.random.uniform(k_init, (100, 4), jnp.float32, -3.0, 3.0)
    fresh = cj.simulate(cj.cbo(f, alpha=30.0, sigma1=0.7), x0, k_run, 30)
    np.testing.assert_array_equal(np.asarray(again.state.x), np.asarray(fresh.state.x))
    # Other numbers (lambda1, sigma1, dt, alpha) reuse the compiled programs, and the run is that of
    # dynamics built with those numbers, bit for bit.
    before = len(compiles)
    other = cj.minimize(f, dim=4, key=1, num_steps=30, alpha=10.0, sigma1=0.8, lambda1=1.5, dt=0.02)
    assert len(compiles) == before, "a minimize call with other numbers compiled again"
    fresh = cj.simulate(cj.cbo(f, alpha=10.0, sigma1=0.8, lambda1=1.5, dt=0.02), x0, k_run, 30)
    np.testing.assert_array_equal(np.asarray(other.state.x), np.asarray(fresh.state.x))
    np.testing.assert_array_equal(other.history["alpha"], fresh.history["alpha"])
    assert not np.array_equal(np.asarray(other.state.x), np.asarray(again.state.x))
    assert sim._typed({"alpha": 30}) != sim._typed({"alpha": 30.0})  # keywords before the config normalises them
    # Another structure (here energy_tol, baked into the step) is other dynamics, and the cache stays bounded.
    with monkeypatch.context() as m:  # the cache bound needs minimize's dynamics lookup, not 16 compiled runs
        ran = []
        m.setattr(sim, "simulate", lambda dyn, *a, **kw: ran.append(dyn))
        for a in range(2 * sim._MINIMIZE_CACHE_SIZE):
            cj.minimize(f, dim=4, key=0, num_steps=0, energy_tol=float(a + 1))
    assert len(set(map(id, ran))) == 2 * sim._MINIMIZE_CACHE_SIZE  # every structure its own dynamics
    assert len(sim._MINIMIZE_DYNAMICS) == sim._MINIMIZE_CACHE_SIZE

    class Unhashable:  # an objective that cannot be a key runs all the same, built anew each call
        __hash__ = None

        def __call__(self, x):
            return jnp.sum(x**2, axis=-1)

    keys = list(sim._MINIMIZE_DYNAMICS)
    assert cj.minimize(Unhashable(), dim=2, key=0, num_steps=5).state.x.shape == (100, 2)
    assert list(sim._MINIMIZE_DYNAMICS) == keys


def _tree_sphere(p):
    return jnp.sum(p["w"] ** 2, axis=-1) + jnp.sum(p["b"] ** 2, axis=-1)


@pytest.mark.parametrize("call,match", [
    (lambda: cj.minimize(objectives.Sphere(), dim=2, sigma=1.0), r"unknown keyword 'sigma' \(did you mean .*sigma1"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, steps=10), r"valid keywords: .*num_steps"),
    (lambda: cj.cbo(objectives.Sphere(), lamda1=1.0), r"cbo: unknown keyword 'lamda1'.*lambda1"),
    (lambda: cj.clustered([objectives.Sphere()], signa1=1.0), r"clustered: unknown keyword 'signa1'.*sigma1"),
    (lambda: cj.minimize(objectives.Sphere()), "x0 or the dimension dim"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, init_bounds=(1.0, -1.0)), "low < high"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, init_bounds=3.0), r"init_bounds must be a pair"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, init_bounds=(0, 1, 2)), r"init_bounds must be a pair"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, init_bounds=(-1e39, 1e39)), r"init_bounds.*overflows float32"),
    (lambda: cj.minimize(objectives.Sphere(), dim=2, key="zero"), "integer seed"),
    (lambda: cj.minimize(objectives.Sphere(), np.zeros((4, 3), np.float32), dim=2),
     r"dim=2 does not match x0's last axis \(x0 has shape \(4, 3\)\)"),
    # a pytree population's dim is its numbers per particle (2 + 3 here), with or without num_runs
    (lambda: cj.minimize(_tree_sphere, {"w": np.zeros((4, 2)), "b": np.zeros((4, 3))}, dim=4),
     "dim=4 does not match x0, a pytree population of 5 numbers per particle"),
    (lambda: cj.minimize(_tree_sphere, {"w": np.zeros((2, 4, 2)), "b": np.zeros((2, 4, 3))}, dim=6, num_runs=2),
     "pytree population of 5 numbers per particle"),
    (lambda: cj.simulate(cj.cbo(objectives.Sphere()), np.zeros((4, 2), np.float32), 1.5, 1), "integer seed"),
    (lambda: cj.simulate(cj.cbo(lambda x: jnp.sum(x**2)), np.zeros((4, 2), np.float32), 0, 1),
     r"one energy per particle.*per_agent"),
])
def test_bad_input_is_explained(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_matching_dim_is_accepted_with_a_pytree_population():
    x0 = {"w": np.ones((4, 2), np.float32), "b": np.ones((4, 3), np.float32)}
    assert cj.minimize(_tree_sphere, x0, dim=5, num_steps=2).state.x["b"].shape == (4, 3)


def test_zero_steps_gives_the_history_keys_with_no_rows():
    # SimulationResult.history: one row per step taken; with none taken, empty arrays, not an empty dict
    res = cj.minimize(objectives.Sphere(), dim=2, key=0, num_steps=0, num_runs=2, record_consensus=True)
    assert res.steps == 0
    assert res.history["best_energy"].shape == (0, 2) and res.history["best_energy"].dtype == np.float32
    assert res.history["consensus"].shape == (0, 2, 2) and res.history["active"].dtype == np.bool_


def test_a_dtype_keyword_overrides_the_config_for_the_default_population():
    with enable_x64(True):
        a = cj.minimize(objectives.Sphere(), dim=2, num_steps=0, config=cj.CBOConfig(), dtype="float64").state.x
        b = cj.minimize(objectives.Sphere(), dim=2, num_steps=0, dtype="float64").state.x
    assert a.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # drawn in float64 either way, not float32


def test_population_sizes_are_checked_integers():
    """``models.init_population`` with 0, -1 or 2.5 agents returned an empty population, failed
    with an MLIRError or a TypeError; ``population.resize_rows(x, -1)`` cut the last row
    (``leaf[:-1]``) without a word; ``pad_agents(x, 2.5)`` failed in ``jnp.zeros``."""
    from cbo_jax import models
    from cbo_jax import population as pop

    m = models.logistic_regression(4, 3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_agents"):
            models.init_population(m, jax.random.key(0), bad)
    assert jax.tree_util.tree_leaves(models.init_population(m, jax.random.key(0), 2))[0].shape[0] == 2
    x = jnp.ones((5, 2))
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match="size"):
            pop.resize_rows(x, bad)
    assert pop.resize_rows(x, 0).shape == (0, 2) and pop.resize_rows(x, 7).shape == (7, 2)
    with pytest.raises(ValueError, match="multiple"):
        pop.pad_agents(x, 2.5)
    assert pop.pad_agents(x, 4)[0].shape == (8, 2)


def test_integer_seeds_use_all_64_bits():
    """JAX without x64 keeps a seed's low 32 bits (``jax.random.key(2**32)`` is ``key(0)``), so
    seeds 0 and 2**32 gave the same run. A seed outside ``[-2**31, 2**32)`` is now the key JAX's
    64-bit mode makes of it; seeds inside that range are still ``jax.random.key(seed)``."""
    from cbo_jax import _checks

    data = lambda seed: jax.random.key_data(_checks.as_key("key", seed)).tolist()  # noqa: E731
    for seed in (0, 5, 2**31, 2**32 - 1, -1, -(2**31)):
        assert data(seed) == jax.random.key_data(jax.random.key(seed)).tolist()
    assert data(2**32) == [1, 0] and data(2**32 + 5) == [1, 5] and data(2**64 - 1) == [2**32 - 1, 2**32 - 1]
    assert data(-(2**63)) == [2**31, 0] and data(-(2**31) - 1) == [2**32 - 1, 2**31 - 1]
    x0 = np.zeros((4, 2), np.float32)  # in the dynamics' init too (simulate, an integer key)
    state = cj.cbo(objectives.Sphere()).init(x0, 2**32)
    assert jax.random.key_data(state.key).tolist() == [1, 0]


def test_minimize_keys_on_the_resolved_config():
    """One setting spelt three ways (a config, keywords, a default config plus keywords) is
    one dynamics: each spelling compiled the run again."""
    import importlib

    sim = importlib.import_module("cbo_jax.minimize")
    f = objectives.Sphere()
    with pytest.MonkeyPatch.context() as m:
        ran, numbers = [], []
        m.setattr(sim, "simulate", lambda dyn, *a, **kw: (ran.append(dyn), numbers.append(kw["params"])))
        cj.minimize(f, dim=2, key=0, num_steps=0, config=cj.CBOConfig(alpha=30.0, sigma1=0.5))
        cj.minimize(f, dim=2, key=0, num_steps=0, alpha=30.0, sigma1=0.5)
        cj.minimize(f, dim=2, key=0, num_steps=0, config=cj.CBOConfig(sigma1=0.5), alpha=30.0)
        # other numbers: the same dynamics, run with this call's numbers; a static setting: other dynamics
        cj.minimize(f, dim=2, key=0, num_steps=0, config=cj.CBOConfig(alpha=30.0), sigma1=0.6)
        cj.minimize(f, dim=2, key=0, num_steps=0, config=cj.CBOConfig(alpha=30.0), sigma1=0.6, energy_tol=1e-3)
    assert len({id(d) for d in ran[:4]}) == 1 and ran[4] is not ran[0]
    assert ran[0].config == cj.CBOConfig(alpha=30.0, sigma1=0.5)
    assert numbers[:4] == [cj.params.defaults(cj.CBOConfig(alpha=30.0, sigma1=s)) for s in (0.5, 0.5, 0.5, 0.6)]


def test_minimize_with_an_equal_chain_schedule_compiles_once():
    """A ``schedules.Chain`` written in each call (equal rules, a new object) is an equal
    setting: ``minimize`` reuses its dynamics, as for the dataclass schedules."""
    import importlib

    from cbo_jax import schedules as sch

    sim = importlib.import_module("cbo_jax.minimize")
    f = objectives.Sphere()
    make = lambda: dict(alpha=sch.Chain(sch.Constant(1.0), sch.Multiply(1.05, maximum=1e3)),  # noqa: E731
                        schedule={"sigma1": sch.Chain(sch.Multiply(0.99), sch.Multiply(1.0, minimum=0.1))})
    assert sch.Chain(sch.Multiply(2.0)) == sch.Chain(sch.Multiply(2.0))
    assert hash(sch.Chain(sch.Multiply(2.0))) == hash(sch.Chain(sch.Multiply(2.0)))
    assert sch.Chain(sch.Multiply(2.0)) != sch.Chain(sch.Multiply(3.0))
    assert sim._typed(sch.Chain(sch.Multiply(2))) != sim._typed(sch.Chain(sch.Multiply(2.0)))
    with pytest.MonkeyPatch.context() as m:
        ran = []
        m.setattr(sim, "simulate", lambda dyn, *a, **kw: ran.append(dyn))
        for seed in range(3):
            cj.minimize(f, dim=2, key=seed, num_steps=0, **make())
    assert len(set(map(id, ran))) == 1


def test_a_config_built_under_a_transform_names_the_sweep_path():
    """``jax.vmap(lambda s: cj.cbo(f, sigma1=s)...)``, a researcher's first try at a sweep, failed
    with a bare ConcretizationTypeError from float() inside the config check."""
    f = objectives.Rastrigin()
    build = lambda s: cj.cbo(f, sigma1=s, alpha=100.0).init(jnp.zeros((5, 2)), 0).x  # noqa: E731
    with pytest.raises(ValueError, match=r"sigma1 is a traced value .*params=cj.params.grid\(dynamics, sigma1="):
        jax.vmap(build)(jnp.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="lambda1 is a traced value"):
        jax.jit(lambda lam: cj.cbo(f, lambda1=lam).config)(1.0)
    # the path the message names runs the sweep in one program
    dyn = cj.cbo(f, alpha=100.0)
    res = cj.simulate(dyn, np.zeros((5, 2), np.float32), 0, 3, params=cj.params.grid(dyn, sigma1=[0.5, 1.0]))
    assert res.state.x.shape == (2, 5, 2)


def test_dynamics_with_a_schedule_are_a_static_jit_argument():
    """A config's schedule was a plain dict, so a config with one (and its dynamics) was
    unhashable: jax.jit(static_argnums=...) refused it, as it does not refuse one without."""
    import copy
    import functools
    import pickle

    f = objectives.Rastrigin()
    x0 = np.random.default_rng(0).uniform(-1, 1, (10, 2)).astype(np.float32)

    @functools.partial(jax.jit, static_argnums=0)
    def three_steps(dyn, state):
        return jax.lax.fori_loop(0, 3, lambda i, s: dyn.step(s), state)

    dyn = cj.cbo(f, schedule={"sigma1": cj.schedules.Multiply(0.5)})
    np.testing.assert_allclose(float(three_steps(dyn, dyn.init(x0, 0)).params.sigma1), 0.125)
    same = cj.CBOConfig(schedule={"sigma1": cj.schedules.Multiply(0.5)})
    assert hash(dyn.config) == hash(same) and dyn.config == same
    assert pickle.loads(pickle.dumps(dyn.config)) == same and copy.deepcopy(dyn.config) == same
    with pytest.raises(TypeError, match="read-only"):
        dyn.config.schedule["lambda1"] = cj.schedules.Multiply(0.9)
