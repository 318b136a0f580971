"""CBO dynamics: runs, pytrees, precision, trackers, early stop, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives, schedules

from _stack import enable_x64, on_pinned_jax

# jax.enable_x64 is a context manager from JAX 0.8 on; older JAX has it in jax.experimental.

RASTRIGIN_CFG = cj.CBOConfig(
    lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic", alpha=schedules.Multiplicative(30.0, 1.05, 1e5)
)


def _x0(shape, seed=0):
    return np.random.default_rng(seed).uniform(-3, 3, size=shape).astype(np.float32)


def test_rastrigin_success_small(optimized_xla):
    """CBXpy's reference check on 20 runs instead of 100."""
    res = cj.simulate(cj.cbo(objectives.Rastrigin(), RASTRIGIN_CFG), _x0((20, 40, 20)), jax.random.key(0), 5000, num_runs=20)
    dist = np.max(np.abs(np.asarray(res.state.consensus)), axis=-1)
    assert np.sum(dist < 0.25) >= 19
    assert np.all(np.asarray(res.state.alpha) == 1e5)


def test_vmapped_runs_equal_single_runs():
    dyn = cj.cbo(objectives.Ackley(), RASTRIGIN_CFG)
    x0 = _x0((3, 16, 4))
    key = jax.random.key(7)
    batched = cj.simulate(dyn, x0, key, 50, num_runs=3)
    keys = jax.random.split(key, 3)
    for r in range(3):
        single = cj.simulate(dyn, x0[r], keys[r], 50)
        np.testing.assert_allclose(np.asarray(batched.state.x[r]), np.asarray(single.state.x), rtol=1e-5, atol=1e-6)


def test_same_seed_same_result_and_chunking_invariance():
    dyn = cj.cbo(objectives.Rastrigin(), RASTRIGIN_CFG)
    x0 = _x0((32, 5))
    a = cj.simulate(dyn, x0, jax.random.key(1), 120, chunk_size=120)
    b = cj.simulate(dyn, x0, jax.random.key(1), 120, chunk_size=50)
    np.testing.assert_array_equal(np.asarray(a.state.x), np.asarray(b.state.x))
    c = cj.simulate(dyn, x0, jax.random.key(2), 120)
    assert not np.array_equal(np.asarray(a.state.x), np.asarray(c.state.x))


def test_pytree_population_equals_array_population():
    """Without noise the dynamics are deterministic: a dict population must move exactly as
    the same numbers laid out as an (N, d) array."""
    x0 = _x0((24, 5))
    tree0 = {"w": x0[:, :3].reshape(24, 3, 1), "b": x0[:, 3:]}
    rast = objectives.Rastrigin()

    def tree_objective(t):
        return rast(jnp.concatenate([t["w"].reshape(t["w"].shape[0], -1), t["b"]], axis=1))

    cfg = dataclasses.replace(RASTRIGIN_CFG, noise="none", lambda2=0.1)
    a = cj.simulate(cj.cbo(rast, cfg), x0, jax.random.key(0), 60)
    t = cj.simulate(cj.cbo(tree_objective, cfg), tree0, jax.random.key(0), 60)
    flat = np.concatenate([np.asarray(t.state.x["w"]).reshape(24, 3), np.asarray(t.state.x["b"])], axis=1)
    np.testing.assert_allclose(flat, np.asarray(a.state.x), rtol=1e-5, atol=1e-6)


def test_per_agent_objective_on_stacked_pytree():
    single = lambda p: jnp.sum((p["w"] - 1.0) ** 2) + jnp.sum(p["b"] ** 2)  # noqa: E731
    x0 = {"w": _x0((50, 2, 2)), "b": _x0((50, 3), seed=1)}
    cfg = cj.CBOConfig(lambda1=1.0, sigma1=0.5, lambda2=0.5, dt=0.05, alpha=100.0, noise="anisotropic")
    res = cj.simulate(cj.cbo(cj.population.per_agent(single), cfg), x0, jax.random.key(0), 600)
    np.testing.assert_allclose(np.asarray(res.state.best_x["w"]), 1.0, atol=1e-3)
    np.testing.assert_allclose(np.asarray(res.state.best_x["b"]), 0.0, atol=1e-3)
    assert res.state.grad["w"].shape == (50, 2, 2)


def test_float64_on_request():
    cfg = dataclasses.replace(RASTRIGIN_CFG, dtype="float64")
    dyn = cj.cbo(objectives.Sphere(), cfg)
    with pytest.raises(ValueError, match="jax_enable_x64"):
        cj.simulate(dyn, _x0((8, 3)), jax.random.key(0), 5)
    with enable_x64(True):
        res = cj.simulate(dyn, _x0((8, 3)), jax.random.key(0), 5)
        assert res.state.x.dtype == jnp.float64
        assert res.state.energy.dtype == jnp.float64
    res32 = cj.simulate(cj.cbo(objectives.Sphere(), RASTRIGIN_CFG), _x0((8, 3)), jax.random.key(0), 5)
    assert res32.state.x.dtype == jnp.float32


def test_best_so_far_tracker_is_running_minimum():
    dyn = cj.cbo(objectives.Rastrigin(), RASTRIGIN_CFG)
    x0 = _x0((4, 30, 6))
    res = cj.simulate(dyn, x0, jax.random.key(3), 300, num_runs=4)
    h = res.history
    e0 = np.asarray(objectives.Rastrigin()(x0)).min(axis=1)
    expected = np.minimum.accumulate(np.vstack([e0, h["min_energy"]]), axis=0)[1:]
    np.testing.assert_allclose(h["best_energy"], expected, rtol=1e-6)
    best_x = np.asarray(res.state.best_x)
    np.testing.assert_allclose(np.asarray(objectives.Rastrigin()(best_x)), h["best_energy"][-1], rtol=1e-4, atol=1e-4)


def test_energy_tol_stops_runs_and_freezes_them():
    cfg = dataclasses.replace(RASTRIGIN_CFG, sigma1=2.0, energy_tol=1e-3)
    res = cj.simulate(cj.cbo(objectives.Sphere(), cfg), _x0((3, 40, 4)), jax.random.key(0), 5000, num_runs=3, chunk_size=100)
    assert res.steps < 5000
    assert not np.any(np.asarray(res.state.active))
    assert np.all(np.asarray(res.state.best_energy) <= 1e-3)
    steps = np.asarray(res.state.step)
    assert np.all(steps < res.steps + 1) and np.all(steps > 0)


def test_a_stopped_run_reports_the_steps_it_took(tmp_path):
    """``steps`` and the history's rows are the steps actually taken once every run has stopped
    (was: the whole chunk, so ``steps == num_steps`` and frozen rows after a ``max_evals`` stop)."""
    f, x0 = objectives.Sphere(), _x0((8, 3))
    res = cj.simulate(cj.cbo(f, max_evals=32), x0, 0, 10, out=tmp_path / "m", log_every=1)  # init 8 + 3 steps of 8
    assert int(res.state.step) == 3 and res.steps == 3 and not bool(res.state.active)
    np.testing.assert_array_equal(res.history["evals"], [16, 24, 32])
    assert len((tmp_path / "m" / "metrics.jsonl").read_text().splitlines()) == 3  # no rows after the stop
    again = cj.simulate(cj.cbo(f, max_evals=32), None, None, 10, initial_state=res.state)  # resumed, already stopped
    assert again.steps == 0 and again.history["evals"].shape == (0,)
    res = cj.simulate(cj.cbo(f, max_evals=12), x0, 0, 10)  # no step fits the budget
    assert res.steps == 0 and res.history["best_energy"].shape == (0,)
    # runs that stop at different steps, across chunks: rows up to the last run's stop
    cfg = cj.CBOConfig(sigma1=0.5, alpha=30.0, energy_tol=1e-2, rng="fast")  # a layout whose runs stop apart
    res = cj.simulate(cj.cbo(f, cfg), _x0((3, 20, 2)), 0, 200, num_runs=3, chunk_size=7)
    steps = np.asarray(res.state.step)
    assert res.steps == steps.max() < 200 and len(steps_set := set(steps.tolist())) > 1, steps_set
    assert res.history["active"].shape == (res.steps, 3) and not res.history["active"][-1].any()
    assert res.history["active"][-2].any()


def test_custom_dynamics_without_a_step_count_still_stop_early():
    """A user's ``Dynamics`` whose config has ``early_stop`` and whose state has ``active``
    but no ``step`` count stops after the chunk in which every run stopped (the trimming
    of the history, which needs ``step``, must not also disable the early stop)."""
    from typing import NamedTuple

    class State(NamedTuple):
        x: jax.Array
        best_energy: jax.Array
        active: jax.Array

    @dataclasses.dataclass(frozen=True)
    class Config:
        early_stop: bool = True

    f = lambda x: jnp.sum(x**2, -1)  # noqa: E731

    def init(x0, key):
        return State(jnp.asarray(x0), jnp.min(f(jnp.asarray(x0))), jnp.array(True))

    def step(s):
        x = jnp.where(s.active, 0.5 * s.x, s.x)
        return State(x, jnp.min(f(x)), s.active & (jnp.min(f(x)) > 0.5))

    dyn = cj.Dynamics(init, step, Config(), f, record=lambda s: {"best_energy": s.best_energy, "active": s.active})
    res = cj.simulate(dyn, np.ones((4, 2), np.float32), 0, 1000, chunk_size=10)
    assert res.steps == 10 and res.history["active"].shape == (10,) and not bool(res.state.active)


def test_diff_tol_stops_when_consensus_settles():
    cfg = cj.CBOConfig(lambda1=1.0, sigma1=0.0, dt=0.1, alpha=10.0, noise="none", diff_tol=1e-6)
    res = cj.simulate(cj.cbo(objectives.Sphere(), cfg), _x0((40, 3)), jax.random.key(0), 10_000, chunk_size=200)
    assert res.steps < 10_000 and not bool(res.state.active)


def test_alpha_schedules():
    m = schedules.Multiplicative(30.0, 1.05, 1e5)
    a = m.init()
    for _ in range(300):
        a = m.update(a, None)
    assert float(a) == 1e5
    e = jnp.asarray(np.random.default_rng(0).exponential(size=200), jnp.float32)
    ess = schedules.EffectiveSampleSize(eta=0.3)
    alpha = ess.update(jnp.float32(1.0), e)
    assert float(cj.consensus.effective_sample_size(e, alpha)) == pytest.approx(60.0, rel=1e-2)
    res = cj.simulate(
        cj.cbo(objectives.Ackley(), dataclasses.replace(RASTRIGIN_CFG, sigma1=1.0, alpha=ess)), _x0((50, 3)), jax.random.key(0), 50
    )
    assert np.all(np.isfinite(res.history["alpha"])) and np.all(res.history["alpha"] > 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dt": 0.0}, "dt"),
        ({"dt": -1.0}, "dt"),
        ({"sigma1": -0.1}, "sigma1"),
        ({"sigma2": -1.0}, "sigma2"),
        ({"lambda1": float("nan")}, "lambda1"),
        ({"alpha": -1.0}, "alpha"),
        ({"noise": "pink"}, "noise"),
        ({"dtype": "float16"}, "dtype"),
    ],
)
def test_bad_config_raises_naming_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cj.CBOConfig(**kwargs)


def test_bad_schedules_raise():
    with pytest.raises(ValueError, match="alpha0"):
        schedules.Multiplicative(-1.0)
    with pytest.raises(ValueError, match="eta"):
        schedules.EffectiveSampleSize(eta=1.5)


def test_bad_initial_particles_raise_before_compilation():
    calls = []

    def objective(x):
        calls.append(1)
        return objectives.Sphere()(x)

    dyn = cj.cbo(objective, RASTRIGIN_CFG)
    bad = _x0((10, 3))
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="x0.*non-finite"):
        cj.simulate(dyn, bad, jax.random.key(0), 10)
    assert not calls  # rejected before the objective was ever traced
    with pytest.raises(ValueError, match="N >= 1"):
        cj.simulate(dyn, np.zeros((0, 3), np.float32), jax.random.key(0), 10)
    with pytest.raises(ValueError, match=r"shape \(N, d\)"):
        cj.simulate(dyn, np.zeros((5,), np.float32), jax.random.key(0), 10)
    with pytest.raises(ValueError, match="num_runs"):
        cj.simulate(dyn, _x0((4, 10, 3)), jax.random.key(0), 10, num_runs=3)
    with pytest.raises(ValueError, match="num_steps"):
        cj.simulate(dyn, _x0((10, 3)), jax.random.key(0), -1)
    with pytest.raises(ValueError, match="one energy per particle"):
        cj.simulate(cj.cbo(lambda x: jnp.sum(x), RASTRIGIN_CFG), _x0((10, 3)), jax.random.key(0), 10)


def test_checkpoint_and_resume_equals_whole_run(tmp_path):
    from cbo_jax import checkpoint

    dyn = cj.cbo(objectives.Rastrigin(), RASTRIGIN_CFG)
    x0 = _x0((3, 16, 4))
    whole = cj.simulate(dyn, x0, jax.random.key(5), 80, num_runs=3)
    first = cj.simulate(dyn, x0, jax.random.key(5), 40, num_runs=3)  # rest reuses this 40-step program
    checkpoint.save(tmp_path / "ckpt", first.state, step=40)
    like = cj.simulate(dyn, x0, jax.random.key(0), 0, num_runs=3).state
    state, meta = checkpoint.restore(tmp_path / "ckpt", like)
    assert meta["step"] == 40
    rest = cj.simulate(dyn, None, None, 40, num_runs=3, initial_state=state)
    np.testing.assert_array_equal(np.asarray(rest.state.x), np.asarray(whole.state.x))
    np.testing.assert_array_equal(np.asarray(rest.state.best_energy), np.asarray(whole.state.best_energy))
    np.testing.assert_array_equal(rest.history["best_energy"], whole.history["best_energy"][40:])
    with pytest.raises(ValueError, match="no checkpoint there"):
        checkpoint.restore(tmp_path / "missing", like)
    # a num_runs that does not match the state's run axis is refused (it used to run 3 runs
    # for num_runs=5, and one for a state of one run with num_runs=2)
    with pytest.raises(ValueError, match="initial_state has 3 runs on its run axis, but num_runs=5"):
        cj.simulate(dyn, None, None, 5, num_runs=5, initial_state=state)
    one = jax.jit(dyn.init)(x0[0], jax.random.key(5))  # a state of one run; init only, jitted: no run compiled
    with pytest.raises(ValueError, match="initial_state has no run axis, but num_runs=2"):
        cj.simulate(dyn, None, None, 5, num_runs=2, initial_state=one)


def test_initial_state_of_other_dynamics_is_refused_before_the_step():
    """A state made by another CBX dynamics (or another configuration) used to fail deep in the
    step with an AttributeError (a plain CBO state given to PSO) or, worse, to run (a CBOMemory
    state given to plain CBO, which ignored its memory); it is refused up front, naming the fields."""
    obj = objectives.Rastrigin()
    x0 = _x0((2, 8, 2))
    key = jax.random.key(0)
    memory = jax.jit(cj.cbo_memory(obj).init)(x0[0], key)  # init only, jitted: the test stays fast
    with pytest.raises(ValueError, match=r"initial_state \(a CBOState\) was made by other dynamics.*CBOConfig.*"
                       r"aux is a MemoryAux where these dynamics have None.*same function and config"):
        cj.simulate(cj.cbo(obj), None, None, 2, initial_state=memory)
    plain = jax.jit(jax.vmap(cj.cbo(obj).init))(x0, jax.random.split(key, 2))  # batched: the run axis is left out
    with pytest.raises(ValueError, match=r"PSOConfig.*params.extra is None where these dynamics have a PSOParams.*"
                       r"aux is None where these dynamics have a PSOAux"):
        cj.simulate(cj.pso(obj), None, None, 2, num_runs=2, initial_state=plain)
    with pytest.raises(ValueError, match=r"its batch is None where these dynamics have a BatchState"):
        cj.simulate(cj.cbo(obj, batch_size=4), None, None, 2, num_runs=2, initial_state=plain)


@pytest.mark.parametrize("rng", ["fast", "partitionable"])
def test_batched_run_r_equals_the_single_run_from_split_key_r(rng):
    """What simulate's docstring states: with num_runs=M, run r draws the random numbers of the
    run started alone from jax.random.split(key, M)[r]. In float64 the two are equal bit for bit
    with the JAX CI installs (anisotropic noise, a growing α, 20 steps); JAX 0.12's XLA orders
    the batched reductions differently (measured: 2.1e-14), so elsewhere they must agree to
    1e-12, where other draws would differ by O(1). In float32 they agree up to rounding, which
    the dynamics amplify (measured: up to 1e-4)."""
    with enable_x64(True):
        cfg = cj.CBOConfig(sigma1=5.0, dt=0.01, alpha=cj.schedules.Multiplicative(30.0, 1.05, 1e5),
                           noise="anisotropic", rng=rng, dtype="float64")
        dyn = cj.cbo(objectives.Rastrigin(), cfg)
        x0 = jax.random.uniform(jax.random.key(0), (3, 200, 10), jnp.float64, minval=-3, maxval=3)
        key = jax.random.key(1)
        both = cj.simulate(dyn, x0, key, 20, num_runs=3)
        for r in range(3):
            alone = cj.simulate(dyn, x0[r], jax.random.split(key, 3)[r], 20)
            np.testing.assert_allclose(np.asarray(alone.state.x), np.asarray(both.state.x[r]), rtol=0,
                                       atol=0.0 if on_pinned_jax() else 1e-12)


def test_progress_bar_counts_finished_steps_not_dispatched_ones(monkeypatch):
    """The bar moves when a chunk's steps are computed, not when they are queued (dispatch is asynchronous)."""
    import importlib

    sim = importlib.import_module("cbo_jax.simulate")  # the module (cbo_jax.simulate is also the function)
    seen, current = [], {}

    class Bar:
        def update(self, n):
            seen.append((n, current["state"].x.is_ready()))

        def set_postfix(self, shown, refresh=True):
            pass

        def close(self):
            pass

    run_chunk = sim._run_chunk

    def spy(state, **kw):
        current["state"], rec = run_chunk(state, **kw)
        return current["state"], rec

    from cbo_jax.runtime import progress

    monkeypatch.setattr(progress, "progress_bar", lambda total, **kw: Bar())
    monkeypatch.setattr(sim, "_run_chunk", spy)
    dyn = cj.cbo(objectives.Rastrigin(), cj.CBOConfig(sigma1=1.0, dt=0.01, alpha=30.0))
    x0 = jax.random.uniform(jax.random.key(0), (2000, 20), minval=-3, maxval=3)
    cj.simulate(dyn, x0, jax.random.key(1), 60, chunk_size=20, progress=True)
    assert seen == [(20, True)] * 3


def _cbo_case(rng):
    return cj.cbo(lambda x: jnp.sum(x ** 2, -1), sigma1=1.0, dt=0.05, rng=rng), _x0((8, 3))


def _clustered_case(rng):
    from cbo_jax.dynamics.clustered import clustered, particles

    gen = np.random.default_rng(1)
    p = particles(gen.uniform(-2, 2, (12, 2)).astype(np.float32), gen.integers(0, 2, 12))
    fs = [objectives.Quadratic(shift=c) for c in ([1.0, 0.0], [-1.0, 0.0])]
    return clustered(fs, alpha=2.0, sigma1=0.5, dt=0.05, rng=rng), p


@pytest.mark.parametrize("case", [_cbo_case, _clustered_case], ids=["cbo", "clustered"])
@pytest.mark.parametrize("rng", ["fast", "partitionable", "per-particle"])
@pytest.mark.parametrize("global_layout", [True, False])
def test_step_called_directly_draws_the_layout_config_rng_names(case, rng, global_layout):
    """``config.rng`` holds for ``dyn.step`` jitted or run by hand, whatever JAX's global
    threefry layout: the same trajectory as :func:`simulate` (which sets the layout itself),
    for the CBO family and the clustered system alike."""
    dyn, x0 = case(rng)
    ref = cj.simulate(dyn, x0, jax.random.key(0), 4)
    with jax.threefry_partitionable(global_layout):
        s = dyn.init(x0, jax.random.key(0))
        step = jax.jit(dyn.step)
        for _ in range(4):
            s = step(s)
    np.testing.assert_array_equal(np.asarray(s.x), np.asarray(ref.state.x))


def test_counts_are_int32_under_x64():
    """The evaluation count and the real-agent count are int32 (``max_evals`` is bounded by
    2**31 - 1 for that reason), with ``jax_enable_x64`` on too."""
    with enable_x64(True):
        for dtype in ("float32", "float64"):
            dyn = cj.cbo(lambda x: jnp.sum(x ** 2, -1), dtype=dtype, max_evals=1000, stagnation_patience=3)
            s = dyn.init(np.zeros((4, 2), dtype), jax.random.key(0))
            assert (s.evals.dtype, s.ctrl.agents.dtype, s.step.dtype) == (jnp.int32,) * 3
            res = cj.simulate(dyn, np.zeros((4, 2), dtype), 0, 3)
            assert res.history["evals"].dtype == np.int32
            assert res.state.evals.dtype == jnp.int32


def test_chunked_step_equals_unchunked_with_per_particle_noise():
    """particle_chunk changes the memory of a step, not the dynamics: with per-particle
    noise streams the chunked run equals the unchunked one up to summation order
    (gradient terms, random batches and clipping included)."""
    x0 = np.random.default_rng(1).uniform(-2, 2, (24, 3))
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.9, sigma1=0.7, dt=0.03, alpha=schedules.Multiplicative(3.0, 1.1, 100.0),
                           lambda2=0.3, sigma2=0.1, batch_size=16, max_abs=1.8, rng="per-particle", dtype="float64")
        a = cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), cfg), x0, 1, 30)
        b = cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), dataclasses.replace(cfg, particle_chunk=8)), x0, 1, 30)
    np.testing.assert_allclose(np.asarray(b.state.x), np.asarray(a.state.x), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(b.history["best_energy"], a.history["best_energy"], rtol=1e-11, atol=1e-12)
    # a chunk that does not divide N: the last rows are a block of their own
    with enable_x64(True):
        c = cj.simulate(cj.cbo(objectives.Quadratic(shift=0.5), dataclasses.replace(cfg, particle_chunk=5)), x0, 1, 30)
    np.testing.assert_allclose(np.asarray(c.state.x), np.asarray(a.state.x), rtol=1e-11, atol=1e-12)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_cbo_chunks_draw_independent_noise():
    """``particle_chunk`` with the fast layout: chunk ``c`` draws from ``fold_in(key, c)``. Two
    identical halves of a population, one chunk each, must not move identically (without the
    fold every chunk would repeat chunk 0's normals: correlated particles, a biased swarm)."""
    half = np.random.default_rng(0).uniform(-2, 2, (8, 3))
    x0 = np.concatenate([half, half])
    with enable_x64(True):
        dyn = cj.cbo(objectives.Quadratic(shift=0.3), lambda1=1.0, sigma1=1.0, dt=0.1, alpha=1.0,
                     noise="anisotropic", particle_chunk=8, rng="fast", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(x0, jax.random.key(0)))
    x = np.asarray(s.x)
    assert np.min(np.abs(x[:8] - x[8:])) > 0


@pytest.mark.reference
def test_diff_tol_compares_the_consensus_move_itself_not_its_square():
    """``diff_tol``: stop once the consensus moves by less than ``diff_tol`` (Euclidean norm)
    in one step, from the second step on. Gradient descent alone (α = 0, no consensus drift,
    no noise) on ``|x - c|²/2`` moves the consensus (the mean) by ``λ2 dt r^{k-2} |x̄_0 - c|``
    at step ``k``, ``r = 1 - λ2 dt``: the stopping step is known in closed form."""
    c, lam2, dt, tol = 0.3, 1.0, 0.1, 1e-2
    x0 = np.random.default_rng(1).uniform(0.8, 1.6, (6, 2))
    dist = np.linalg.norm(x0.mean(0) - c)
    r = 1 - lam2 * dt
    k = 2
    while lam2 * dt * r ** (k - 2) * dist >= tol:
        k += 1
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=0.0, sigma1=0.0, lambda2=lam2, dt=dt, alpha=0.0, noise="none", diff_tol=tol,
                           dtype="float64")
        res = cj.simulate(cj.cbo(objectives.Quadratic(shift=c), cfg), x0, jax.random.key(0), 200)
    assert k > 10  # the squared move would have stopped it at step 3
    assert int(res.state.step) == k and not bool(res.state.active)
