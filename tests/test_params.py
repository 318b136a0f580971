"""Parameters as a traced pytree: sweeps as one vmapped program, validated on the host."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives, schedules
from cbo_jax import params as P
from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, Particles, cb2o, clustered, particles

from _stack import enable_x64


STEPS, SEEDS = 12, 2
# Two grid points, σ1, α and dt all changing (a zipped sweep: leaves of shape (2,)); the
# separate runs compile once per point, so the grid stays small.
SIGMA1, ALPHA0, DT = [0.4, 1.6], [3.0, 300.0], [0.01, 0.05]


def _systems():
    """(name, build(sigma1, alpha0, dt) -> dynamics, x0 for SEEDS runs)."""
    rng = np.random.default_rng(0)
    centers = np.array([[1.0, 0.5], [-1.0, -0.5]])
    mult = lambda a0: schedules.Multiplicative(a0, 1.1, 1e4)  # noqa: E731

    def cbo(s, a, dt):
        cfg = cj.CBOConfig(lambda1=0.8, sigma1=s, dt=dt, alpha=mult(a), noise="anisotropic", lambda2=0.1,
                           sigma2=0.05, dtype="float64")
        return cj.cbo(objectives.Quadratic(shift=0.2), cfg)

    def clus(s, a, dt):
        cfg = ClusteredConfig(lambda1=0.8, sigma1=s, dt=dt, alpha=mult(a), noise="isotropic", dtype="float64")
        return clustered([objectives.Quadratic(shift=c) for c in centers], cfg)

    def bilevel(s, a, dt):
        lower = lambda x: jnp.sum((x - 1.0) ** 2, -1) * jnp.sum((x + 1.0) ** 2, -1)  # noqa: E731
        upper = lambda x: jnp.sum((x - 1.0) ** 2, -1)  # noqa: E731
        attack = Malicious(drift=lambda t, x: -(x + 1.0), diffusion=lambda t, x: jnp.full(x.shape[0], 0.1, x.dtype))
        cfg = ClusteredConfig(lambda1=0.8, sigma1=s, dt=dt, alpha=mult(a), beta=0.5, noise="anisotropic",
                              dtype="float64")
        return cb2o(lower, upper, cfg, malicious=attack)

    def runs(p):  # the same labels for every run, positions per run
        return Particles(*(np.stack([np.asarray(v)] * SEEDS) for v in p))._replace(x=rng.uniform(-2, 2, (SEEDS, 8, 2)))

    return [
        ("cbo", cbo, rng.uniform(-2, 2, (SEEDS, 7, 2))),
        ("clustered", clus, runs(particles(np.zeros((8, 2)), np.arange(8) % 2))),
        ("cb2o", bilevel, runs(particles(np.zeros((8, 2)), malicious=np.arange(8) % 4 == 0))),
    ]


def _run_of(x0, r):
    return jax.tree_util.tree_map(lambda v: np.asarray(v)[r], x0)


@pytest.mark.parametrize("name,build,x0", _systems(), ids=lambda v: v if isinstance(v, str) else "")
def test_vmapped_sweep_over_sigma_alpha_dt_and_seeds_equals_separate_runs(name, build, x0):
    with enable_x64(True):
        dyn = build(SIGMA1[0], ALPHA0[0], DT[0])
        grid = P.defaults(dyn)._replace(sigma1=np.array(SIGMA1), dt=np.array(DT))
        grid = grid._replace(alpha=grid.alpha._replace(alpha0=np.array(ALPHA0)))
        key = jax.random.key(11)
        swept = cj.simulate(dyn, x0, key, STEPS, num_runs=SEEDS, params=grid)
        x_swept = np.asarray(swept.state.x)
        assert x_swept.shape[:2] == (2, SEEDS)
        keys = jax.random.split(key, SEEDS)
        for g in range(2):
            # A separate run of dynamics built the ordinary way, from a config with this point's numbers.
            dyn_g = build(SIGMA1[g], ALPHA0[g], DT[g])
            for r in range(SEEDS):
                one = cj.simulate(dyn_g, _run_of(x0, r), keys[r], STEPS)
                np.testing.assert_allclose(x_swept[g, r], np.asarray(one.state.x), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(np.asarray(swept.state.alpha)[g, r], np.asarray(one.state.alpha),
                                           rtol=1e-12)
        # The points differ from each other (the sweep is not three copies of one run).
        assert np.abs(x_swept[0] - x_swept[1]).max() > 1e-3


@pytest.mark.parametrize("name,build,x0", _systems(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_single_point_has_no_sweep_axis_reuses_the_chunks_and_equals_a_fresh_build(name, build, x0):
    """``params=`` with one point (every leaf a number) runs with the unswept state's shapes: the
    chunks compiled for the dynamics' own numbers serve other numbers (minimize relies on it), and
    the run equals dynamics built with those numbers bit for bit."""
    import importlib

    sim = importlib.import_module("cbo_jax.simulate")  # the module (cbo_jax.simulate is also the function)
    with enable_x64(True):
        dyn = build(SIGMA1[0], ALPHA0[0], DT[0])
        key = jax.random.key(5)
        own = cj.simulate(dyn, x0, key, STEPS, num_runs=SEEDS)
        compiled = sim._run_chunk._cache_size()
        other = build(SIGMA1[1], ALPHA0[1], DT[1])
        res = cj.simulate(dyn, x0, key, STEPS, num_runs=SEEDS, params=P.defaults(other))
        assert sim._run_chunk._cache_size() == compiled, "a single point compiled its chunks again"
        fresh = cj.simulate(other, x0, key, STEPS, num_runs=SEEDS)
        assert np.shape(res.state.x) == np.shape(own.state.x)
        assert res.history["alpha"].shape == own.history["alpha"].shape  # no sweep axis: (STEPS, SEEDS, ...)
        for got, want in zip(jax.tree_util.tree_leaves(res.state.x), jax.tree_util.tree_leaves(fresh.state.x)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert res.history.keys() == fresh.history.keys()
        for name in fresh.history:
            np.testing.assert_array_equal(res.history[name], fresh.history[name], err_msg=name)
        assert not np.array_equal(res.history["alpha"], own.history["alpha"])


def test_grid_is_an_outer_product_and_history_has_grid_axes():
    dyn = cj.cbo(objectives.Sphere(), alpha=schedules.Multiplicative(5.0, 1.05, 100.0), sigma1=0.5)
    g = P.grid(dyn, sigma1=[0.1, 0.2, 0.3], alpha0=[1.0, 10.0], dt=[0.01, 0.02])
    assert P.grid_shape(g) == (3, 2, 2)
    assert g.sigma1[2, 1, 0] == 0.3 and g.alpha.alpha0[2, 1, 0] == 10.0 and g.dt[2, 1, 1] == 0.02
    assert np.all(g.lambda1 == 1.0) and np.all(g.alpha.factor == 1.05)
    pt = P.point(g, (1, 0, 1))
    assert (pt.sigma1, pt.alpha.alpha0, pt.dt) == (0.2, 1.0, 0.02)
    x0 = np.random.default_rng(0).uniform(-1, 1, (4, 6, 3)).astype(np.float32)
    res = cj.simulate(dyn, x0, 0, 5, num_runs=4, params=g)  # an integer seed is a key
    assert res.state.x.shape == (3, 2, 2, 4, 6, 3)
    assert res.history["best_energy"].shape == (5, 3, 2, 2, 4)
    np.testing.assert_allclose(res.history["alpha"][0, :, 1, :, 0], 10.0 * 1.05, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown parameter 'alpha'.*valid"):
        P.grid(dyn, alpha=[1.0])


def test_point_names_a_bad_index_and_the_grid_shape():
    """An index off the grid is named with the grid's shape (was NumPy's bare IndexError, and a
    single point ignored any index); negative indices count from the end, as in NumPy."""
    dyn = cj.cbo(objectives.Sphere(), sigma1=0.5)
    g = P.grid(dyn, sigma1=[0.1, 0.2, 0.3], dt=[0.01, 0.02])
    assert P.point(g, (-1, 0)).sigma1 == 0.3 and P.point(g, (2, -2)).dt == 0.01
    assert P.point(g, np.array([1, 1])).sigma1 == 0.2  # any integer sequence
    for bad in [(3, 0), (0, -3), (-4, 1)]:
        with pytest.raises(IndexError, match=rf"index \({bad[0]}, {bad[1]}\) is out of range for a grid of shape "
                                             r"\(3, 2\)"):
            P.point(g, bad)
    with pytest.raises(ValueError, match=r"index \(3, 0\) is out of range"):  # also a ValueError, like the rest
        P.point(g, (3, 0))
    with pytest.raises(ValueError, match=r"index \(5,\) does not address a grid of shape \(3, 2\)"):
        P.point(g, 5)
    for bad in [(0.5, 1), ("a", 1), (True, 0)]:
        with pytest.raises(ValueError, match=r"must be integers.*grid of shape \(3, 2\)"):
            P.point(g, bad)
    one = P.defaults(dyn)  # a single point: only the empty index addresses it
    assert P.point(one, ()).sigma1 == 0.5
    with pytest.raises(ValueError, match=r"index \(3,\) does not address a grid of shape \(\)"):
        P.point(one, 3)


@pytest.mark.parametrize("mutate,match", [
    (lambda g: g._replace(sigma1=np.array([0.5, 1.0, 2.0, 3.0]), dt=np.array([0.01, 0.02, 0.03])),
     r"sweep axes do not match \(sigma1 has shape \(4,\), dt has shape \(3,\)"),
    (lambda g: g._replace(sigma1=np.array([[0.5, -0.2], [1.0, 2.0]])),
     r"params.sigma1\[0, 1\] = -0.2: sigma1 must be >= 0 \(grid index \(0, 1\) of a \(2, 2\) grid\)"),
    (lambda g: g._replace(alpha=g.alpha._replace(alpha0=np.array([1.0, np.nan, 3.0]))),
     r"params.alpha.alpha0\[1\] = nan: alpha0 must be finite \(grid index \(1,\)"),
    (lambda g: g._replace(dt=np.array([0.01, 0.0])), r"params.dt\[1\] = 0.0: dt must be > 0"),
    (lambda g: g._replace(alpha=g.alpha._replace(factor=np.array([1.0, -1.0]))), r"alpha.factor\[1\].*> 0"),
    (lambda g: g._replace(sigma2=np.array([0.0, 0.1])), r"params.sigma2\[1\] = 0.1, but the dynamics were built "
                                                          r"with sigma2=0"),
    (lambda g: g._replace(alpha=schedules.ConstantParams(3.0)), "params.alpha must be MultiplicativeParams"),
    (lambda g: g._replace(lambda1="fast"), "params.lambda1 must hold real numbers"),
    (lambda g: g._replace(alpha=g.alpha._replace(alpha0=np.array([1.0, 1e3]))),
     r"params.alpha.alpha0\[1\] = 1000.0 is above alpha_max = 100.0"),
])
def test_bad_grid_is_rejected_on_the_host_before_compilation(mutate, match):
    traced = []

    def objective(x):
        traced.append(1)
        return objectives.Sphere()(x)

    dyn = cj.cbo(objective, sigma1=1.0, alpha=schedules.Multiplicative(5.0, 1.05, 100.0))
    bad = mutate(P.defaults(dyn))
    with pytest.raises(ValueError, match=match):
        cj.simulate(dyn, np.zeros((2, 5, 3), np.float32), 0, 3, num_runs=2, params=bad)
    assert not traced  # nothing was traced, let alone compiled


def test_clustered_grid_errors_and_sdeparams_still_accepted():
    dyn = clustered([objectives.Quadratic()], ClusteredConfig(sigma1=0.5, noise="none", alpha=10.0))
    p = particles(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"sigma1\[1\] = 0.5, but the dynamics were built with noise='none'"):
        cj.simulate(dyn, p, 0, 2, params=P.grid(dyn, sigma1=[0.0, 0.5]))
    with pytest.raises(ValueError, match=r"params.alpha.alpha\[0\] = -1.0: alpha must be >= 0"):
        cj.simulate(dyn, p, 0, 2, params=P.grid(dyn, alpha=[-1.0, 1.0]))
    from cbo_jax.dynamics.clustered import SDEParams

    sde = SDEParams(*(np.array(v) for v in ([1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0])))
    res = cj.simulate(dyn, p, 0, 2, params=sde)
    assert res.state.x.shape == (2, 4, 2) and float(res.state.params.dt[1]) == pytest.approx(0.01)


def test_a_sweep_writes_its_rows_with_the_grid_axes(tmp_path):
    """``out=``'s rows hold what the returned history holds: the grid's axes (they were written
    with the one flattened sweep axis, ``(G, M)`` for ``(*grid, M)``; TensorBoard's tags too)."""
    import json

    dyn = cj.cbo(objectives.Sphere(), sigma1=0.5, alpha=5.0)
    g = P.grid(dyn, sigma1=[0.1, 0.2, 0.3], dt=[0.01, 0.02])
    x0 = np.random.default_rng(0).uniform(-1, 1, (2, 6, 3)).astype(np.float32)
    res = cj.simulate(dyn, x0, 0, 5, num_runs=2, params=g, out=tmp_path / "m", log_every=1, chunk_size=3)
    rows = [json.loads(r) for r in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # and a summary.json beside them: steps, best energy per grid point and run, the environment
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["steps"] == 5 and "environment" in summary
    np.testing.assert_allclose(np.asarray(summary["best_energy_per_run"]), np.asarray(res.state.best_energy),
                               rtol=1e-6)
    assert summary["best_energy"] == pytest.approx(float(np.min(res.state.best_energy)), rel=1e-6)
    # what ran: the grid's numbers by name (the files alone map a grid index to its values), the config
    assert summary["grid_shape"] == [3, 2] and summary["num_runs"] == 2 and summary["num_steps"] == 5
    np.testing.assert_array_equal(summary["params"]["sigma1"], g.sigma1)
    np.testing.assert_array_equal(summary["params"]["dt"], g.dt)
    assert summary["params"]["alpha.alpha"] == [[5.0] * 2] * 3
    assert summary["config"]["type"] == "CBOConfig" and summary["config"]["alpha"] == {"type": "Constant", "alpha": 5.0}
    for i, row in enumerate(rows):
        for k in ("best_energy", "alpha", "active"):
            np.testing.assert_allclose(np.asarray(row[k], float), np.asarray(res.history[k][i], float), rtol=1e-6)


def test_a_sweep_of_a_constrained_dynamic_that_switches_on_a_term_left_out_is_refused():
    # drift_constrained_cbo built with sigma_indep=0 compiles no independent-noise prestep, and
    # reg_combination_cbo built with eps >= 1e15 no constraint drift: a sweep of those numbers ran
    # every point as the built one, while the state reported the swept value.
    f = objectives.Ackley(shift=1.0)
    sphere = cj.constraints.sphere(1.0)
    x0 = np.random.default_rng(0).uniform(-1, 1, (2, 20, 2)).astype(np.float32)
    dc = cj.drift_constrained_cbo(f, constraints=sphere, alpha=30.0, sigma1=0.1, eps_indep=1.0)
    with pytest.raises(ValueError, match=r"sigma_indep\[1\] = 0.5, but the dynamics were built with sigma_indep=0"):
        cj.simulate(dc, x0, 0, 3, num_runs=2, params=P.grid(dc, sigma_indep=[0.0, 0.5]))
    P.validate(P.grid(dc, sigma_indep=[0.0, 0.0]), dc)  # zeros leave it off, as built
    on = cj.drift_constrained_cbo(f, constraints=sphere, alpha=30.0, sigma1=0.1, eps_indep=1.0, sigma_indep=0.5)
    assert P.validate(P.grid(on, sigma_indep=[0.0, 0.5, 2.0]), on) == (3,)
    # built with the noise, the sweep's points are those of separately built dynamics
    swept = cj.simulate(on, x0, 0, 20, num_runs=2, params=P.grid(on, sigma_indep=[0.0, 2.0]))
    for i, s in enumerate([0.0, 2.0]):
        alone = cj.simulate(cj.drift_constrained_cbo(f, constraints=sphere, alpha=30.0, sigma1=0.1, eps_indep=1.0,
                                                     sigma_indep=s), x0, 0, 20, num_runs=2)
        np.testing.assert_allclose(np.asarray(swept.state.x[i]), np.asarray(alone.state.x), atol=1e-5)

    off = cj.reg_combination_cbo(f, constraints=sphere, alpha=30.0, eps=1e15)
    point = P.defaults(off)
    point = point._replace(extra=point.extra._replace(eps=0.01))
    with pytest.raises(ValueError, match=r"params.extra.eps = 0.01, but the dynamics were built with eps=1e\+15"):
        cj.simulate(off, x0[0], 0, 3, params=point)
    P.validate(P.defaults(off)._replace(extra=point.extra._replace(eps=2e15)), off)


def _dyn():
    return cj.cbo(objectives.Sphere(), sigma1=1.0)


@pytest.mark.parametrize("leaf,match", [
    (np.array([]), r"sweep grid \(0,\) has no points"),  # was a bare IndexError inside simulate
    (np.ones((0, 3)), r"sweep grid \(0, 3\) has no points"),
    (np.array([1 + 2j, 1.0]), "must hold real numbers"),  # the imaginary part was dropped with a warning
    (True, "must hold real numbers"),
    ("0.5", "must hold real numbers"),
    (None, "must hold real numbers"),  # was "= nan: must be finite"
])
def test_validate_refuses_empty_grids_and_non_real_leaves(leaf, match):
    dyn = _dyn()
    with pytest.raises(ValueError, match=match):
        P.validate(P.defaults(dyn)._replace(sigma1=leaf), dyn)


def test_validate_still_accepts_integer_and_low_precision_leaves():
    dyn = _dyn()
    p = P.defaults(dyn)._replace(lambda1=np.array([1, 2], np.int32), sigma1=jnp.array([0.5, 1.0], jnp.bfloat16))
    assert P.validate(p, dyn) == (2,)


@pytest.mark.parametrize("values", [[0.1, "a"], [True, False], [0.5 + 1j]])
def test_grid_refuses_values_that_are_not_real_numbers(values):
    """grid() read bools as 1/0 and dropped imaginary parts (a ComplexWarning); a string was NumPy's
    "could not convert", without the parameter's name."""
    with pytest.raises(ValueError, match=r"grid: sigma1 must hold real numbers"):
        P.grid(_dyn(), sigma1=values)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_alpha0_equal_to_alpha_max_is_a_valid_grid_point():
    """Guards ``alpha0 > alpha_max`` (strict) in :func:`params.validate`: ``alpha0 = alpha_max``
    is a schedule that starts at its cap, which ``Multiplicative`` itself accepts."""

    dyn = cj.cbo(objectives.Sphere(), alpha=schedules.Multiplicative(alpha0=10.0, factor=1.1, alpha_max=100.0))
    g = P.grid(dyn, alpha0=[50.0, 100.0])
    assert P.validate(g, dyn) == (2,)
    with pytest.raises(ValueError, match="above alpha_max"):
        P.validate(P.grid(dyn, alpha0=[50.0, 100.5]), dyn)


@pytest.mark.reference
def test_point_accepts_the_most_negative_index_of_each_axis():
    """Guards ``-s <= i < s`` in :func:`params.point` (``-shape[k]`` is the first point)."""

    g = P.grid(cj.cbo(objectives.Sphere()), sigma1=[0.1, 0.2, 0.3], dt=[0.01, 0.02])
    pt = P.point(g, (-3, -2))
    assert (pt.sigma1, pt.dt) == (0.1, 0.01)
