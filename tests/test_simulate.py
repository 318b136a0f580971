"""Running a particle system (cbo_jax.simulate).

Unusual but valid inputs to the particle dynamics: mixed dtypes, integer energies, sweeps
that reach the edge of a number's range. Each test failed before its fix (a crash deep
inside ``lax.scan``, a hang, or a wrong number). The entry points as a new user meets them:
tests/test_minimize.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax.writer import read_jsonl

from _stack import enable_x64


def _x0(runs=2, n=10, d=2, seed=0):
    return jax.random.uniform(jax.random.key(seed), (runs, n, d), minval=-1.0, maxval=1.0, dtype=jnp.float32)


def _counting(x):
    """An objective that counts: int32 energies."""
    return jnp.sum(jnp.round(4 * x ** 2), axis=-1).astype(jnp.int32)


@pytest.mark.parametrize("build", [
    lambda f: cj.cbo(f),
    lambda f: cj.cbo(f, noise="covariance"),
    lambda f: cj.cbo_memory(f),
    lambda f: cj.mirror_cbo(f),
    lambda f: cj.hypersurface_cbo(f),
], ids=["cbo", "cbo-covariance", "cbo_memory", "mirror_cbo", "hypersurface_cbo"])
def test_integer_energies_under_x64(build):
    """int32 energies under ``jax_enable_x64``: the best-energy tracker's one-hot sum widened
    them to int64 and ``lax.scan`` refused the carry ("s.best_energy has type int32[2] but the
    corresponding output carry component has type int64[2]")."""
    x0 = _x0()
    with enable_x64(True):
        dyn = build(_counting)
        res = cj.simulate(dyn, x0, 0, 5, num_runs=2)
        best = np.asarray(res.state.best_energy)
    assert best.dtype == np.int32
    # without x64 the same run gives the same numbers
    ref = cj.simulate(build(_counting), x0, 0, 5, num_runs=2)
    np.testing.assert_array_equal(best, np.asarray(ref.state.best_energy))


_C64 = np.array([0.5, 0.2])  # a NumPy float64 constant: under x64 the energies come out float64


def _wide(x):
    return jnp.sum((x - _C64) ** 2, axis=-1)


@pytest.mark.parametrize("build", [
    lambda f: cj.polar_cbo(f),
    lambda f: cj.polar_cbo(f, noise="covariance"),
    lambda f: cj.adam_cbo(f),
], ids=["polar_cbo", "polar_cbo-covariance", "adam_cbo"])
def test_float32_config_with_float64_energies(build):
    """``dtype="float32"`` under ``jax_enable_x64`` with an objective that returns float64
    energies: PolarCBO's weights and AdamCBO's step count carried the energies' dtype into
    the particles, and ``lax.scan`` refused the float64 particles (the float32 state's
    carry). The particles now keep the config's dtype, as CBO's already did."""
    x0 = _x0()
    with enable_x64(True):
        res = cj.simulate(build(_wide), x0, 0, 5, num_runs=2)
        x = np.asarray(res.state.x)
        best = np.asarray(res.state.best_energy)
    assert x.dtype == np.float32
    assert np.all(np.isfinite(x)) and np.all(best < _wide(np.asarray(x0)).min(axis=1) + 1e-6)


def test_drift_constrained_sweep_with_sigma_indep_zero_does_not_hang():
    """A sweep of ``sigma_indep`` that includes ``0`` (allowed: the rule is ``>= 0``) of
    dynamics built with ``sigma_indep > 0``: once that point's particles collapsed, the
    independent-noise loop kicked them by ``0`` forever (a hang). CBXpy kicks only when
    ``sigma_indep > 0``; the point now equals dynamics built with ``sigma_indep=0``."""
    # In a child process first, so that a regression fails (after 240 s) instead of hanging the suite.
    code = ("import jax, jax.numpy as jnp, cbo_jax as cj\n"
            "dyn = cj.drift_constrained_cbo(cj.objectives.Rastrigin(), constraints=lambda x: jnp.sum(x ** 2) - 1.0, "
            "sigma_indep=1.0, eps_indep=5.0)\n"
            "x0 = jax.random.uniform(jax.random.key(0), (1, 10, 2), minval=-1.0, maxval=1.0)\n"
            "cj.simulate(dyn, x0, 0, 5, num_runs=1, params=cj.params.grid(dyn, sigma_indep=[0.0, 1.0]))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    g = lambda x: jnp.sum(x ** 2) - 1.0  # noqa: E731
    obj = cj.objectives.Rastrigin()
    x0 = _x0(runs=1)
    dyn = cj.drift_constrained_cbo(obj, constraints=g, sigma_indep=1.0, eps_indep=5.0)
    grid = cj.params.grid(dyn, sigma_indep=[0.0, 1.0])
    res = cj.simulate(dyn, x0, 0, 30, num_runs=1, params=grid)
    off = cj.simulate(cj.drift_constrained_cbo(obj, constraints=g, sigma_indep=0.0, eps_indep=5.0), x0, 0, 30,
                      num_runs=1)
    np.testing.assert_array_equal(np.asarray(res.state.x[0]), np.asarray(off.state.x))
    np.testing.assert_array_equal(np.asarray(res.state.evals[0]), np.asarray(off.state.evals))
    assert int(res.state.evals[1, 0]) > int(off.state.evals[0])  # the other point did kick (and re-evaluate)


def test_effective_sample_size_with_integer_energies():
    """EffectiveSampleSize on int32 energies: with its numbers (the path every run takes) the
    bisection ran in int32, ``log(alpha_min)`` of ``int32(1e-6) = 0`` was ``-inf``, and α came
    out ``0`` silently (a plain mean for the consensus); without them it crashed inside
    ``fori_loop``. Integer energies are now promoted as the consensus weights promote them."""
    sched = cj.schedules.EffectiveSampleSize(eta=0.5)
    e = jnp.array([0, 1, 2, 3, 5, 8, 13, 20], jnp.int32)
    want = sched.update(jnp.float32(1.0), e.astype(jnp.float32), params=sched.params())
    for params in (sched.params(), None):
        got = sched.update(jnp.float32(1.0), e, params=params)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    ess = cj.consensus.effective_sample_size(e, want)
    assert abs(float(ess) - 0.5 * e.size) < 1e-3
    # in a run: the α of a counting objective is the α of the same energies as floats
    x0 = _x0()
    runs = [cj.simulate(cj.cbo(f, alpha=sched), x0, 0, 3, num_runs=2)
            for f in (_counting, lambda x: _counting(x).astype(jnp.float32))]
    assert np.all(np.asarray(runs[0].state.alpha) > 0)
    np.testing.assert_array_equal(np.asarray(runs[0].state.x), np.asarray(runs[1].state.x))


def test_a_rule_as_alpha_names_the_fix():
    """``alpha=Multiply(1.1)`` (a rule, no α_0) said "alpha must be a real number"."""
    with pytest.raises(ValueError, match=r"rule without an initial value.*Chain\(Constant"):
        cj.cbo(cj.objectives.Sphere(), alpha=cj.schedules.Multiply(1.1))


def test_record_consensus_of_a_pytree_population(tmp_path):
    """``record_consensus=True`` (or an ``observe`` returning a dict) with a pytree population:
    the history's chunks were joined with ``np.concatenate`` of ``np.asarray(dict)`` ("zero-dimensional
    arrays cannot be concatenated"), ``num_steps=0`` and the sweep reshape failed the same way, and
    ``out=`` indexed the dict by step. Each entry is now joined leaf by leaf."""
    runs, n = 2, 6
    keys = jax.random.split(jax.random.key(0), 2)
    x0 = {"w": jax.random.normal(keys[0], (runs, n, 3)), "b": jax.random.normal(keys[1], (runs, n))}
    loss = lambda p: jnp.sum((p["w"] - 1) ** 2) + p["b"] ** 2  # noqa: E731
    dyn = cj.cbo(cj.population.per_agent(loss))
    observe = lambda s: {"obs": {"step": s.step}}  # noqa: E731
    res = cj.simulate(dyn, x0, 0, 7, num_runs=runs, record_consensus=True, chunk_size=3, observe=observe,
                      out=tmp_path / "run")
    cons = res.history["consensus"]
    assert cons["w"].shape == (7, runs, 3) and cons["b"].shape == (7, runs)
    np.testing.assert_array_equal(cons["w"][-1], np.asarray(res.state.consensus["w"]))
    np.testing.assert_array_equal(res.history["obs"]["step"][:, 0], np.arange(1, 8))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["step"] == 1 and len(rows[0]["consensus"]["w"]) == runs
    empty = cj.simulate(dyn, x0, 0, 0, num_runs=runs, record_consensus=True)
    assert empty.history["consensus"]["w"].shape == (0, runs, 3)
    swept = cj.simulate(dyn, x0, 0, 2, num_runs=runs, record_consensus=True,
                        params=cj.params.grid(dyn, sigma1=[0.5, 1.0, 2.0]))
    assert swept.history["consensus"]["w"].shape == (2, 3, runs, 3)


def test_record_history_times_steps_and_early_stop():
    """``plot.record_history``: with ``num_runs`` every time was NaN (the runs' ``dt`` has a run
    axis); with ``dt`` on a schedule the times were ``step · (the last dt)``; and a run that
    stopped early was recorded as if it went on (frames labelled with steps never taken, all
    copies of the stopped state)."""
    obj = cj.objectives.Rastrigin()
    x0 = _x0(runs=3, n=20, d=2)
    hist = cj.plot.record_history(cj.cbo(obj, dt=0.1), x0, 0, 25, every=10, num_runs=3)
    np.testing.assert_array_equal(hist.step, [0, 10, 20, 25])
    np.testing.assert_allclose(hist.t, [0.0, 1.0, 2.0, 2.5], rtol=1e-6)
    # dt halves every step: the time after k steps is 0.1 (1 + 1/2 + ... + 1/2^(k-1))
    sched = cj.cbo(obj, dt=0.1, schedule={"dt": cj.schedules.Multiply(0.5)})
    hist = cj.plot.record_history(sched, x0, 0, 4, every=2, num_runs=3)
    np.testing.assert_allclose(hist.t, [0.0, 0.15, 0.1875], rtol=1e-6)
    # a sweep of dt has no common time axis
    plain = cj.cbo(obj, dt=0.1)
    hist = cj.plot.record_history(plain, x0, 0, 4, every=2, num_runs=3, params=cj.params.grid(plain, dt=[0.1, 0.2]))
    assert hist.x.shape[:3] == (3, 2, 3) and np.isnan(hist.t[1:]).all()
    # early stop: recording ends at the step where the last run stopped
    stops = cj.cbo(obj, dt=0.1, energy_tol=1.0)
    full = cj.simulate(stops, x0[0], 0, 100)
    assert 0 < full.steps < 100
    hist = cj.plot.record_history(stops, x0[0], 0, 100, every=5)
    assert hist.step[-1] == full.steps == int(hist.state.step)
    assert len(hist.step) == len(hist.x) == -(-full.steps // 5) + 1
    np.testing.assert_array_equal(hist.x[-1], np.asarray(full.state.x))
    np.testing.assert_allclose(hist.t[-1], 0.1 * full.steps, rtol=1e-6)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad", "jit-key"])
def test_simulate_under_a_transformation_says_what_to_do(transform):
    """``jax.jit``/``vmap``/``grad`` of ``simulate`` failed in its first host check with JAX's
    ``TracerArrayConversionError`` ("__array__() was called on traced array"), which does not
    say that simulate is a host loop nor what to use instead."""
    dyn = cj.cbo(cj.objectives.Sphere(), sigma1=0.5)
    x0 = jax.random.normal(jax.random.key(0), (10, 2))
    best = lambda x, key=0: cj.simulate(dyn, x, key, 3).state.best_energy  # noqa: E731
    call = {"jit": lambda: jax.jit(best)(x0), "vmap": lambda: jax.vmap(best)(x0[None]),
            "grad": lambda: jax.grad(best)(x0),
            "jit-key": lambda: jax.jit(lambda k: best(x0, k))(jax.random.key(1))}[transform]
    with pytest.raises(ValueError, match=r"simulate got a traced (x0|key).*num_runs=.*dynamics\.init"):
        call()


def test_simulate_refuses_a_batch_of_keys():
    """A batch of keys (``split(key, M)`` passed with ``num_runs=M``) failed inside
    ``jax.random.split`` ("split accepts a single key")."""
    dyn = cj.cbo(cj.objectives.Sphere())
    x0 = _x0(runs=2)
    for keys in (jax.random.split(jax.random.key(0), 2), jax.random.split(jax.random.PRNGKey(0), 2)):
        with pytest.raises(ValueError, match=r"key must be a single PRNG key.*shape \(2,"):
            cj.simulate(dyn, x0, keys, 3, num_runs=2)
    # single keys of either kind still run
    for key in (jax.random.key(0), jax.random.PRNGKey(0), 0):
        assert cj.simulate(dyn, x0, key, 1, num_runs=2).steps == 1


def test_a_list_population_names_the_fix():
    """``x0`` given as a nested Python list said only "got shape ()" (its numbers are a pytree's leaves)."""
    dyn = cj.cbo(cj.objectives.Sphere())
    with pytest.raises(ValueError, match=r"Python list of numbers.*np\.asarray\(x0\)"):
        cj.simulate(dyn, [[0.1, 0.2], [0.3, 0.4]], 0, 3)


def test_coupling_refuses_a_path_of_another_shape():
    """``meanfield.coupling`` with a consensus path whose steps are not the dynamics' consensus
    point (another dimension, a run axis, a squeezed ``(T,)``) failed inside ``lax.scan``
    ("carry input and carry output must have equal types") or with a broadcasting error."""
    dyn = cj.cbo(cj.objectives.Sphere(), sigma1=0.5, dt=0.1)
    x0 = jax.random.normal(jax.random.key(0), (20, 3))
    path = cj.meanfield.reference_consensus(dyn, jax.random.normal(jax.random.key(1), (200, 3)), 0, 4)
    assert cj.meanfield.coupling(dyn, x0, 0, path).sq_distance.shape == (5,)
    for bad in (path[:, :1], path[:, 0], path[:, :2], jnp.stack([path] * 20, axis=1)):
        with pytest.raises(ValueError, match=r"consensus_path's steps have shape .* consensus point of these dynamics"):
            cj.meanfield.coupling(dyn, x0, 0, bad)


def test_metrics_rows_end_with_the_last_step(tmp_path):
    """``simulate(..., out=, log_every=k)`` with ``num_steps`` not a multiple of ``k`` (or a run
    that stopped between multiples) left the final step out of ``metrics.jsonl``: its last row
    was an earlier state, not the run's result."""
    dyn = cj.cbo(cj.objectives.Sphere(), sigma1=0.5)
    x0 = _x0(runs=2)
    res = cj.simulate(dyn, x0, 0, 25, num_runs=2, out=tmp_path / "a", log_every=10, chunk_size=7)
    rows = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 10, 20, 25]
    np.testing.assert_allclose(rows[-1]["best_energy"], res.history["best_energy"][-1], rtol=1e-6)
    stops = cj.cbo(cj.objectives.Sphere(), sigma1=0.5, energy_tol=1e-2)
    res = cj.simulate(stops, x0, 0, 500, num_runs=2, out=tmp_path / "b", log_every=100)
    rows = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert 1 < res.steps < 100 and [r["step"] for r in rows] == [1, res.steps]


def test_gradient_terms_of_an_integer_objective_are_refused_early():
    """``lambda2 > 0`` with an objective that returns integers failed inside ``jax.grad`` while
    tracing the first chunk; now a host check names the gradient terms."""
    x0 = _x0()
    for kw in ({"lambda2": 0.1}, {"sigma2": 0.1}):
        with pytest.raises(ValueError, match=r"gradient terms differentiate the objective.*int32"):
            cj.simulate(cj.cbo(_counting, **kw), x0, 0, 3, num_runs=2)
    assert cj.simulate(cj.cbo(cj.objectives.Sphere(), lambda2=0.1), x0, 0, 2, num_runs=2).steps == 2


def test_runs_without_num_runs_name_the_fix():
    """An ``(M, N, d)`` array without ``num_runs`` said only that the objective returned
    ``(M, N)`` instead of ``(M,)``; the message now names ``num_runs=M``."""
    with pytest.raises(ValueError, match=r"got \(3, 20\).*pass num_runs=3"):
        cj.simulate(cj.cbo(cj.objectives.Rastrigin()), _x0(runs=3, n=20), 0, 5)


def test_evaluation_count_holds_at_int32_max_instead_of_wrapping():
    """N = 1e7 particles pass 2**31 evaluations after 215 steps; the int32 count wrapped to negative."""
    dyn = cj.cbo(cj.objectives.Rastrigin(), sigma1=0.5, dt=0.1, alpha=10.0)
    x0 = _x0(runs=1, n=8)[0]
    state = dyn.init(x0, jax.random.key(0))
    top = np.iinfo(np.int32).max
    state = state._replace(evals=jnp.asarray(top - 5, jnp.int32))
    state = jax.jit(dyn.step)(state)
    assert state.evals.dtype == jnp.int32 and int(state.evals) == top
    state = jax.jit(dyn.step)(state)
    assert int(state.evals) == top
    # below the top the count is exact
    fresh = jax.jit(dyn.step)(dyn.init(x0, jax.random.key(0)))
    assert int(fresh.evals) == 16


def test_diff_tol_measures_the_consensus_move_not_cbxpys_particle_update():
    """cbo_jax's ``diff_tol`` (docs/guides/cbx_family.md, conventions): a run stops after the first
    step whose consensus point moved by less than ``diff_tol`` (Euclidean norm). CBXpy's measures
    the particles' update ``|x - x_old|_F / N`` instead, so the two stop at different steps."""
    tol = 1e-3
    x0, key = _x0(runs=1, n=40, d=3)[0], jax.random.key(0)
    cfg = cj.CBOConfig(lambda1=1.0, sigma1=0.3, dt=0.1, alpha=10.0, noise="anisotropic")
    free = cj.simulate(cj.cbo(cj.objectives.Sphere(), cfg), x0, key, 200, record_consensus=True)
    m = np.asarray(free.history["consensus"])  # (steps, d): the consensus point step k moved towards
    moves = np.linalg.norm(np.diff(m, axis=0), axis=1)  # moves[k - 2]: |m_k - m_(k-1)|, k >= 2
    first = int(np.argmax(moves < tol)) + 2
    assert moves[first - 2] < tol <= moves[:first - 2].min() and first > 5  # a discriminating setting
    res = cj.simulate(cj.cbo(cj.objectives.Sphere(), dataclasses.replace(cfg, diff_tol=tol)), x0, key, 200)
    assert not bool(res.state.active) and res.steps == first


def test_max_evals_near_int32_max_still_stops_the_run():
    """The budget check summed ``evals + next step's`` in int32, which wrapped round near 2**31: the run
    never stopped once the count got there."""
    top = np.iinfo(np.int32).max
    dyn = cj.cbo(cj.objectives.Rastrigin(), sigma1=0.5, dt=0.1, alpha=10.0, max_evals=top)
    state = dyn.init(_x0(runs=1, n=8)[0], jax.random.key(0))
    state = state._replace(evals=jnp.asarray(top - 12, jnp.int32))  # room for one step of 8, not two
    step = jax.jit(dyn.step)
    state = step(state)
    assert int(state.evals) == top - 4 and not bool(state.active)
    frozen = step(state)
    assert int(frozen.evals) == top - 4 and int(frozen.step) == int(state.step)


def test_a_one_particle_objective_returning_shape_1_is_told_to_return_a_scalar():
    """``f(one particle)`` of shape ``(1,)`` (``keepdims=True``) is neither a population
    function nor a scalar one: the error says to return a scalar."""
    f = lambda x: jnp.sum((x - 1.0) ** 2, keepdims=True)  # noqa: E731
    with pytest.raises(ValueError, match=r"shape \(100,\); got \(1, 1\)\. On one particle it returns an array of "
                                         r"one element, not a scalar: return a scalar \(drop keepdims=True"):
        cj.minimize(f, dim=2, num_steps=1)
    res = cj.minimize(lambda x: jnp.sum((x - 1.0) ** 2), dim=2, num_steps=1)  # the scalar form is lifted
    assert res.steps == 1


def test_simulate_names_what_it_takes_and_what_a_hook_returns(tmp_path):
    """An objective passed as the dynamics failed with "'Rastrigin' object has no attribute
    'record'"; an ``observe`` returning an array with "cannot convert dictionary update
    sequence element"; ``observe=5`` inside the trace; and the options of ``out=`` without it
    were ignored."""
    x0 = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)
    obj = cj.objectives.Rastrigin()
    with pytest.raises(TypeError, match=r"simulate takes dynamics .* got Rastrigin: .*cbo_jax.minimize"):
        cj.simulate(obj, x0, 0, 3)
    dyn = cj.cbo(obj)
    with pytest.raises(TypeError, match=r"observe\(state\) must return a dict .* got an array of shape \(2,\)"):
        cj.simulate(dyn, x0, 0, 3, observe=lambda s: s.consensus)
    with pytest.raises(TypeError, match="observe must be a function"):
        cj.simulate(dyn, x0, 0, 3, observe=5)
    with pytest.raises(ValueError, match=r"tensorboard=True, log_every=2 concern the files of out="):
        cj.simulate(dyn, x0, 0, 3, tensorboard=True, log_every=2)
    with pytest.raises(ValueError, match="record_consensus must be True or False, got 'no'"):
        cj.simulate(dyn, x0, 0, 3, record_consensus="no")  # a non-empty string was true
    res = cj.simulate(dyn, x0, 0, 3, out=tmp_path / "r", log_every=2)
    assert res.steps == 3
    with pytest.raises(ValueError, match="initial_state carries the population and its PRNG key: pass x0=None"):
        cj.simulate(dyn, x0 + 1, 0, 3, initial_state=res.state)  # x0 and the key were ignored


def test_a_start_where_the_objective_is_nowhere_finite_is_refused():
    """A log objective started at negative x0, or Rastrigin at 1e30 (inf in float32), ran to
    NaN particles and a NaN consensus and reported success; one finite particle is enough."""
    x0 = np.random.default_rng(0).uniform(-3, -1, (12, 2)).astype(np.float32)
    log = cj.cbo(lambda X: jnp.sum(jnp.log(X), -1))
    with pytest.raises(ValueError, match="NaN or infinite at every particle of x0: the consensus point would be NaN"):
        cj.simulate(log, x0, 0, 3)
    with pytest.raises(ValueError, match=r"every particle of x0 \(of 1 of the 2 runs"):
        cj.simulate(log, np.stack([-x0, x0]), 0, 3, num_runs=2)
    with pytest.raises(ValueError, match="every particle of x0"):
        cj.minimize(cj.objectives.Rastrigin(), np.full((12, 2), 1e30, np.float32), key=0, num_steps=3)
    one = x0.copy()
    one[0] = 1.0
    assert np.isfinite(cj.simulate(log, one, 0, 3).state.best_energy)


def test_a_bilevel_start_with_a_lower_level_nowhere_finite_is_refused():
    """CB²O with L = inf everywhere: Q_β was empty, the consensus and particles NaN, and the warning
    said the objective "became" non-finite after step 1. Refused at the start, as an upper level G
    nowhere finite already was; one finite particle of each class is enough."""
    x0 = np.random.default_rng(0).normal(size=(12, 2)).astype(np.float32)
    lower = lambda x: jnp.full(x.shape[0], jnp.inf)  # noqa: E731
    upper = lambda x: jnp.sum((x - 1.0) ** 2, -1)  # noqa: E731
    for dyn in (cj.cb2o(lower, upper, cj.ClusteredConfig(beta=0.5)), cj.cb2o(upper, lower, cj.ClusteredConfig(beta=0.5)),
                cj.clustered([upper, lower])):
        with pytest.raises(ValueError, match=r"lower level L_k or the upper level\) is NaN or infinite at every "
                                             r"particle of x0"):
            cj.simulate(dyn, cj.particles(x0), 0, 3)
    partly = lambda x: jnp.where(x[:, 0] > 0, jnp.sum(x ** 2, -1), jnp.inf)  # noqa: E731
    res = cj.simulate(cj.cb2o(partly, upper, cj.ClusteredConfig(beta=0.5)), cj.particles(x0), 0, 3)
    assert np.isfinite(np.asarray(res.state.consensus)).all()


def test_a_run_whose_objective_turns_nan_everywhere_is_warned_about():
    """An objective NaN outside |x| <= 4, with noise that throws every particle out: the consensus
    and the particles were NaN from step 3 on while best_energy stayed finite, and the run looked
    healthy. Now a RuntimeWarning names the runs and the step; clipping (max_abs) keeps it quiet."""
    import warnings

    x = jax.random.uniform(jax.random.key(0), (3, 30, 2), minval=-1, maxval=1)
    f = lambda z: jnp.where(jnp.abs(z).max(-1) > 4, jnp.nan, jnp.sum(z ** 2, -1))  # noqa: E731
    wild = cj.cbo(f, sigma1=30.0, dt=0.5, alpha=1.0, rng="fast")  # the draws that lose one run of three
    with pytest.warns(RuntimeWarning, match=r"in 1 of the 3 runs .* NaN or infinite at every particle "
                                            r"\(first after step 3\)"):
        res = cj.simulate(wild, x, jax.random.key(0), 20, num_runs=3)
    assert np.isfinite(np.asarray(res.state.best_energy)).all()  # what made the run look healthy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cj.simulate(cj.cbo(f, sigma1=30.0, dt=0.5, alpha=1.0, max_abs=3.0), x, jax.random.key(0), 20, num_runs=3)
        cj.simulate(cj.cbo(f, sigma1=0.3, alpha=1.0), x, jax.random.key(0), 20, num_runs=3)


def test_minus_infinity_is_not_a_best_energy():
    """The consensus gives a -inf energy weight zero, but the best tracker took it: best_energy
    -inf at a point the consensus ignored, and energy_tol=0 stopped the run at step 1."""
    x0 = np.random.default_rng(1).uniform(-1, 1, (20, 2)).astype(np.float32)
    f = lambda z: jnp.where(z[:, 0] > 0.9, -jnp.inf, jnp.sum(z ** 2, -1))  # noqa: E731
    x0[0] = (0.95, 0.0)  # one particle starts where the energy is -inf
    res = cj.simulate(cj.cbo(f, sigma1=0.5, alpha=10.0, energy_tol=0.0), x0, 0, 30)
    assert np.isfinite(float(res.state.best_energy)) and res.steps == 30
    assert float(res.state.best_x[0]) <= 0.9
    np.testing.assert_allclose(float(res.state.best_energy), float(f(res.state.best_x[None])[0]))


def test_a_config_given_as_a_dict_and_a_key_that_is_none_are_named():
    """``cbo(f, {"alpha": 30})`` failed in dataclasses.replace, ``minimize(config={...})`` with
    "'dict' object has no attribute 'dtype'"; ``init(x0, 0.5)`` stored 0.5 as the key and
    failed at the first step."""
    obj = cj.objectives.Rastrigin()
    with pytest.raises(TypeError, match=r"cbo: config must be a CBOConfig, got dict: pass CBOConfig\(\*\*config\)"):
        cj.cbo(obj, {"alpha": 30.0})
    with pytest.raises(TypeError, match=r"polar_cbo: config must be a PolarCBOConfig, got dict"):
        cj.polar_cbo(obj, {"alpha": 30.0})
    with pytest.raises(TypeError, match=r"minimize: config must be a CBOConfig, got dict"):
        cj.minimize(obj, dim=2, num_steps=2, config={"alpha": 30.0})
    x0 = np.zeros((4, 2), np.float32)
    for bad in (0.5, None):
        with pytest.raises(ValueError, match="key must be a PRNG key"):
            cj.cbo(obj).init(x0, bad)
    assert cj.cbo(obj).init(x0, 3).key.shape == ()


@pytest.mark.parametrize("x0,match", [(np.array([["1", "2"], ["3", "4"]]), "dtype <U1"),
                                      (np.array([[1.0, None], [2.0, 3.0]], dtype=object), "dtype object"),
                                      (np.array([[1 + 5j, 2], [3, 4j]], np.complex64), "dtype complex64: take the real part")])
def test_x0_of_strings_objects_or_complex_numbers_is_named(x0, match):
    """Strings and objects failed in NumPy's isfinite ("ufunc 'isfinite' not supported"),
    naming no argument; a complex x0 ran with its imaginary part dropped."""
    with pytest.raises(ValueError, match=rf"x0 must hold real numbers \(float or integer\), got {match}"):
        cj.simulate(cj.cbo(cj.objectives.Rastrigin()), x0, 0, 2)


def test_a_particle_runs_summary_names_each_setting_it_holds(tmp_path):
    """summary.json's ``config`` (``writer.describe``) writes each kind of setting by name: the
    config and its schedule rules as typed dicts, a Chain by its rules, a mirror map by its
    name, a schedule dict by parameter, non-finite numbers as null (docs/results.md)."""
    import json

    from cbo_jax.writer import describe

    alpha = cj.schedules.Chain(cj.schedules.Multiplicative(alpha0=10.0, factor=1.1, alpha_max=1e4),
                               cj.schedules.Multiply(2.0, maximum=1e3))
    dyn = cj.mirror_cbo(cj.objectives.Rastrigin(), mirror_map=cj.mirror_maps.ProjectionBall(1.0), sigma1=1.0,
                        alpha=alpha, schedule={"sigma1": cj.schedules.Multiply(0.5, minimum=0.1)})
    x0 = jax.random.normal(jax.random.key(0), (20, 2))
    cj.simulate(dyn, x0, jax.random.key(1), 3, out=tmp_path)
    config = json.loads((tmp_path / "summary.json").read_text())["config"]
    assert config["type"] == "MirrorCBOConfig" and config["sigma1"] == 1.0
    assert config["mirror_map"] == {"type": "MirrorMap", "name": "ProjectionBall"}
    assert config["alpha"] == {"type": "Chain", "rules": [
        {"type": "Multiplicative", "alpha0": 10.0, "factor": 1.1, "alpha_max": 1e4},
        {"type": "Multiply", "factor": 2.0, "maximum": 1e3, "minimum": 0.0}]}
    assert config["schedule"] == {"sigma1": {"type": "Multiply", "factor": 0.5, "maximum": None, "minimum": 0.1}}
    # the other kinds: named tuples by their fields, sequences, NumPy scalars and arrays, paths, functions
    params = describe(cj.params.Params(1.0, 2.0, 0.0, 0.0, 0.01, None, None))
    assert params == {"type": "Params", "lambda1": 1.0, "sigma1": 2.0, "lambda2": 0.0, "sigma2": 0.0, "dt": 0.01,
                      "alpha": None, "extra": None}
    assert describe([np.float32(1.5), (np.arange(2), tmp_path)]) == [1.5, [[0, 1], str(tmp_path)]]
    assert describe(test_a_particle_runs_summary_names_each_setting_it_holds) == (
        "test_a_particle_runs_summary_names_each_setting_it_holds")


_F = cj.objectives.Quadratic(shift=0.5)
_EVERY_DYNAMICS = {
    "cbo": lambda: cj.cbo(_F),
    "cbo_memory": lambda: cj.cbo_memory(_F),
    "pso": lambda: cj.pso(_F),
    "cbs": lambda: cj.cbs(_F),
    "polar_cbo": lambda: cj.polar_cbo(_F),
    "adam_cbo": lambda: cj.adam_cbo(_F),
    "mirror_cbo": lambda: cj.mirror_cbo(_F),
    "drift_constrained_cbo": lambda: cj.drift_constrained_cbo(_F, constraints=cj.constraints.sphere(1.0)),
    "hypersurface_cbo": lambda: cj.hypersurface_cbo(_F),
    "reg_combination_cbo": lambda: cj.reg_combination_cbo(_F, constraints=cj.constraints.sphere(1.0), eps=0.1),
    "clustered": lambda: cj.clustered([_F, _F]),
    "cb2o": lambda: cj.cb2o(_F, _F),
}


@pytest.mark.parametrize("name", list(_EVERY_DYNAMICS))
def test_particles_of_no_coordinates_are_refused(name):
    """``d = 0`` (``x0`` of shape ``(N, 0)``) ran every dynamics, on nothing, as ``N = 0`` is refused."""
    dyn = _EVERY_DYNAMICS[name]()
    x0 = np.zeros((6, 0), np.float32)
    if name in ("clustered", "cb2o"):
        x0 = cj.particles(x0)
    with pytest.raises(ValueError, match=r"no coordinates per particle \(d = 0"):
        cj.simulate(dyn, x0, 0, 2)


def test_minimize_refuses_particles_of_no_coordinates():
    with pytest.raises(ValueError, match=r"d = 0"):
        cj.minimize(cj.objectives.Sphere(), np.zeros((6, 0), np.float32), 0, 2)
    with pytest.raises(ValueError, match=r"dim must be >= 1"):
        cj.minimize(cj.objectives.Sphere(), dim=0, key=0, num_steps=2)


def test_a_number_of_steps_beyond_int32_is_refused():
    """``simulate(num_steps=10**20)`` was accepted and ran until killed (``cbo-jax optimize
    --steps`` is refused likewise)."""
    with pytest.raises(ValueError, match=r"num_steps must be at most 2\*\*31 - 1"):
        cj.simulate(cj.cbo(cj.objectives.Sphere()), np.zeros((4, 2), np.float32), 0, 10**20)
