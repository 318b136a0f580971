"""Mean-field diagnostics: variances, decay rates, sliced Wasserstein."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import meanfield, objectives
from cbo_jax.dynamics.clustered import ClusteredConfig, clustered, particles

from _stack import default_codegen, enable_x64


def _assert_the_system(sq_distance, copies, x):
    """The copies fed the system's own consensus path are the system: bit for bit under XLA's
    default code generation; where the test run compiles otherwise (tests/conftest.py: backend
    optimisation off) the copies, another program, may round otherwise, and agree to 64 ulps."""
    copies, x, sq_distance = np.asarray(copies), np.asarray(x), np.asarray(sq_distance)
    if default_codegen():
        np.testing.assert_array_equal(sq_distance, 0.0)
        np.testing.assert_array_equal(copies, x)
        return
    tol = 64 * np.finfo(x.dtype).eps * max(1.0, float(np.max(np.abs(x))))
    np.testing.assert_allclose(copies, x, rtol=0, atol=tol)
    assert np.max(sq_distance) <= x[0].size * tol**2


def _w1_cdf(a, b):
    """1-D W1 as ∫|F(x) - G(x)| dx (CDF form; the library uses the quantile form)."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid[:-1], side="right") / a.size
    fb = np.searchsorted(np.sort(b), grid[:-1], side="right") / b.size
    return np.sum(np.abs(fa - fb) * np.diff(grid))


@pytest.mark.parametrize("n,r", [(7, 7), (5, 13), (100, 1000)])
def test_sliced_w1_in_one_dimension_is_exact_w1(n, r):
    rng = np.random.default_rng(n * r)
    a, b = rng.standard_normal(n), 0.3 + 2 * rng.standard_normal(r)
    got = meanfield.sliced_wasserstein(a[:, None], b[:, None], jax.random.key(0), num_projections=3)
    np.testing.assert_allclose(float(got), _w1_cdf(a, b), rtol=1e-5)


def test_sliced_wasserstein_translation_closed_form():
    """Shifting a sample by v moves every projection by θ·v: SW1 = E|θ·v| exactly,
    which for θ uniform on the circle is 2|v|/π."""
    x = np.random.default_rng(0).standard_normal((500, 2))
    v = np.array([3.0, -4.0])
    got = float(meanfield.sliced_wasserstein(x, x + v, jax.random.key(1), num_projections=4000))
    assert abs(got - 2 * 5.0 / np.pi) < 0.05
    assert float(meanfield.sliced_wasserstein(x, x, jax.random.key(1))) == 0.0


def test_class_variance_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((30, 3))
    label = rng.integers(0, 3, 30)
    centers = rng.standard_normal((3, 3))
    inc = rng.random(30) < 0.8
    got = np.asarray(meanfield.class_variance(x, label, centers, include=inc))
    for k in range(3):
        sel = (label == k) & inc
        np.testing.assert_allclose(got[k], 0.5 * np.mean(np.sum((x[sel] - centers[k]) ** 2, -1)), rtol=1e-5)


def test_fit_decay_rate_and_loglog_slope():
    t = np.linspace(0, 5, 200)
    v = 3.0 * np.exp(-1.7 * t) + 1e-9
    assert abs(meanfield.fit_decay_rate(t, v) - 1.7) < 1e-3
    n = np.array([1e2, 1e3, 1e4])
    assert abs(meanfield.fit_loglog_slope(n, 2.0 / np.sqrt(n)) + 0.5) < 1e-12
    with pytest.raises(ValueError):
        meanfield.fit_decay_rate(t[:2], v[:2])


def test_predicted_rate_formula():
    assert meanfield.predicted_decay_rate(2.0, 0.1, 0.3, 0.05, d=4, lipschitz=1.0) == pytest.approx(
        4.0 - 0.2 - 4 * 0.09 - 4 * 0.0025)
    assert meanfield.predicted_decay_rate(2.0, 0.0, 0.3, 0.0, d=4, lipschitz=1.0, noise="anisotropic") == pytest.approx(
        4.0 - 0.09)
    for bad in (-1.0, float("nan"), [1.0, -0.5]):  # a negative M gave a faster rate (3.5 where M = 1 gives -0.5)
        with pytest.raises(ValueError, match="lipschitz .* must be finite and >= 0"):
            meanfield.predicted_decay_rate(1.0, 1.0, 0.5, 0.0, d=2, lipschitz=bad)


def test_rates_read_the_numbers_and_noise_of_dynamics_or_params():
    """Four numbers are in the theorem's order (λ1, λ2, σ1, σ2), Params in theirs (λ1, σ1, λ2, σ2):
    `predicted_decay_rate(*cj.params.point(grid, i)[:4], ...)` swapped λ2 and σ1 without a word, and
    the isotropic default did not follow an anisotropic config. Dynamics, configs and Params now
    give their own numbers (and the dynamics their noise kind)."""
    dyn = cj.cbo(objectives.Quadratic(), lambda1=1.0, sigma1=0.3, lambda2=0.5, sigma2=0.1)  # anisotropic
    by_hand = meanfield.predicted_decay_rate(1.0, 0.5, 0.3, 0.1, d=5, lipschitz=2.0, noise="anisotropic")
    assert by_hand == pytest.approx(2.0 - 2.0 - 0.09 - 5 * 0.01 * 4)
    assert meanfield.predicted_decay_rate(dyn, d=5, lipschitz=2.0) == pytest.approx(by_hand, rel=1e-12)
    assert meanfield.predicted_decay_rate(dyn.config, d=5, lipschitz=2.0) == pytest.approx(by_hand, rel=1e-12)
    assert meanfield.ideal_quadratic_rate(dyn, d=5) == pytest.approx(
        meanfield.ideal_quadratic_rate(1.0, 0.5, 0.3, 0.1, d=5, noise="anisotropic"), rel=1e-12)
    iso = _two_quadratics(dtype="float32", sigma1=0.3)
    assert meanfield.predicted_decay_rate(iso, d=2, lipschitz=1.0) == pytest.approx(2.0 - 2 * 0.09)
    grid = cj.params.grid(dyn, sigma1=[0.3, 1.0], lambda1=[1.0, 2.0])
    got = meanfield.predicted_decay_rate(grid, d=5, lipschitz=2.0, noise="anisotropic")
    want = [[meanfield.predicted_decay_rate(lam, 0.5, s, 0.1, d=5, lipschitz=2.0, noise="anisotropic")
             for lam in (1.0, 2.0)] for s in (0.3, 1.0)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for call, match in [
        (lambda: meanfield.predicted_decay_rate(grid, d=5, lipschitz=2.0), "Params carry no noise kind"),
        (lambda: meanfield.predicted_decay_rate(dyn, 0.5, d=5, lipschitz=2.0), "not both"),
        (lambda: meanfield.predicted_decay_rate(1.0, 0.5, d=5, lipschitz=2.0), "theorem's order"),
        (lambda: meanfield.predicted_decay_rate(dyn, d=5), "lipschitz="),
        (lambda: meanfield.predicted_decay_rate(cj.cbo(objectives.Quadratic(), noise="constant"), d=5, lipschitz=0),
         "isotropic or anisotropic consensus noise; these dynamics have noise='constant'"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()


def test_quadratic_decay_rate_within_theorem_regime():
    """Two quadratic classes, isotropic noise: V_t decays at least at Theorem 2.3's rate and
    close to the exact rate 2(λ1+λ2) - dσ1² - dσ2² of the ideal (m = θ*) system."""
    d, n = 2, 4000
    centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
    lam1, lam2, s1, s2 = 1.0, 0.2, 0.4, 0.1
    cfg = ClusteredConfig(lambda1=lam1, lambda2=lam2, sigma1=s1, sigma2=s2, dt=0.01, alpha=1e4)
    dyn = clustered([objectives.Quadratic(shift=c) for c in centers], cfg)
    rng = np.random.default_rng(0)
    label = np.arange(n) % 2
    x = centers[label] + rng.uniform(-1, 1, (n, d))
    obs = lambda s: {"V": meanfield.class_variance(s.x, s.label, centers)}  # noqa: E731
    res = cj.simulate(dyn, particles(x, label), jax.random.key(0), 300, observe=obs)
    t = 0.01 * np.arange(1, 301)
    rate = meanfield.fit_decay_rate(t, res.history["V"].sum(-1))
    pred = meanfield.predicted_decay_rate(lam1, lam2, s1, s2, d, 1.0)
    ideal = meanfield.ideal_quadratic_rate(lam1, lam2, s1, s2, d)
    assert rate >= pred
    assert abs(rate - ideal) < 0.15 * ideal, (rate, ideal, pred)


# --------------------------------------------------------------------------------------
# Propagation of chaos, pathwise (FedCBO JMLR eq. (50)): meanfield.coupling
# --------------------------------------------------------------------------------------

def _two_quadratics(**kw):
    centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
    kw = {"lambda1": 1.0, "sigma1": 0.5, "dt": 0.02, "alpha": 10.0, "noise": "isotropic", "dtype": "float64", **kw}
    cfg = ClusteredConfig(**kw)
    return clustered([objectives.Quadratic(shift=c) for c in centers], cfg)


def test_copies_driven_by_the_systems_own_consensus_are_the_system():
    """The copies share the particles' initial points and Brownian increments; fed the
    particles' own consensus points they must reproduce the particles exactly."""
    rng = np.random.default_rng(3)
    with enable_x64(True):
        dyn = _two_quadratics()
        p = particles(rng.uniform(-2, 2, (16, 2)), np.arange(16) % 2)
        own = cj.simulate(dyn, p, 7, 30, record_consensus=True)
        res = meanfield.coupling(dyn, p, 7, own.history["consensus"])
    assert res.sq_distance.shape == (31,)
    _assert_the_system(res.sq_distance, res.final_copies, own.state.x)


def test_coupling_distance_closed_form_for_a_shifted_consensus():
    """Noise off, copies driven toward the particles' own consensus shifted by δ: the
    difference obeys d_{t+1} = (1 - λ1 dt) d_t + λ1 dt δ, so |d_t|² = |δ|² (1 - (1 - λ1 dt)^t)²."""
    rng = np.random.default_rng(4)
    delta = np.array([0.3, -0.4])
    with enable_x64(True):
        dyn = _two_quadratics(noise="none", lambda1=0.8)
        x = np.stack([rng.uniform(-2, 2, (10, 2)) for _ in range(2)])
        runs = particles(x[0], np.arange(10) % 2)
        runs = runs._replace(x=x, **{f: np.stack([np.asarray(getattr(runs, f))] * 2) for f in ("label", "malicious", "pid")})
        own = cj.simulate(dyn, runs, 1, 25, num_runs=2, record_consensus=True)
        path = own.history["consensus"][:, 0] + delta  # run 0's path for both runs: run 1 only checks the vmap
        res = meanfield.coupling(dyn, runs, 1, path, num_runs=2)
    t = np.arange(26)
    expected = np.sum(delta**2) * (1 - (1 - 0.8 * 0.02) ** t) ** 2
    np.testing.assert_allclose(res.sq_distance[0], expected, rtol=1e-10, atol=1e-15)
    assert res.sq_distance.shape == (2, 26) and np.all(res.sq_distance[1, 1:] > 0)


def test_coupling_with_a_scheduled_config():
    """A config with a ``schedule`` dict (not hashable) couples as any other: the copies fed
    the system's own consensus path are the system (coupling held the whole Dynamics static
    and failed inside jit on the dict)."""
    x0 = np.random.default_rng(6).uniform(-1, 1, (8, 2)).astype(np.float32)
    dyn = cj.cbo(objectives.Sphere(), sigma1=0.5, schedule={"sigma1": cj.schedules.Multiply(0.99)})
    own = cj.simulate(dyn, x0, 2, 6, record_consensus=True)
    res = meanfield.coupling(dyn, x0, 2, own.history["consensus"])
    _assert_the_system(res.sq_distance, res.final_x, own.state.x)


def test_coupling_runs_the_numbers_it_is_given():
    """``reference_consensus`` passed ``params=`` on to simulate while ``coupling`` always ran the
    dynamics' own numbers: the copies then followed another SDE's path, and the distance stayed
    flat in N. With the same point in both, the copies fed the system's own path are the system,
    and the run equals dynamics built with those numbers."""
    rng = np.random.default_rng(8)
    with enable_x64(True):
        dyn = _two_quadratics()
        p = particles(rng.uniform(-2, 2, (12, 2)), np.arange(12) % 2)
        point = cj.params.defaults(dyn)._replace(sigma1=0.9, lambda1=1.5)
        path = meanfield.reference_consensus(dyn, p, 7, 20, params=point)
        res = meanfield.coupling(dyn, p, 7, path, params=point)
        built = _two_quadratics(sigma1=0.9, lambda1=1.5)
        fresh = meanfield.coupling(built, p, 7, path)
        _assert_the_system(res.sq_distance, res.final_x, fresh.final_x)
        assert np.all(meanfield.coupling(dyn, p, 7, path).sq_distance[2:] > 0)  # its own numbers: another SDE
        with pytest.raises(ValueError, match="one point of numbers.*grid of shape \\(2,\\)"):
            meanfield.coupling(dyn, p, 7, path, params=cj.params.grid(dyn, sigma1=[0.5, 0.9]))


def test_float64_dynamics_without_64_bit_jax_are_refused_everywhere():
    """simulate refused dtype='float64' in 32-bit JAX, but coupling and a dynamics' own init ran it
    in float32, with only JAX's truncation warnings."""
    p = particles(np.zeros((4, 2)))
    with enable_x64(False):
        for dyn in (_two_quadratics(), cj.cbo(objectives.Sphere(), dtype="float64")):
            x0 = p if isinstance(dyn.config, ClusteredConfig) else np.zeros((4, 2))
            with pytest.raises(ValueError, match="dtype='float64' needs 64-bit JAX"):
                dyn.init(x0, 0)
            with pytest.raises(ValueError, match="dtype='float64' needs 64-bit JAX"):
                meanfield.coupling(dyn, x0, 0, np.zeros((3, 2, 2) if x0 is p else (3, 2)))


def test_coupling_bad_input():
    dyn = _two_quadratics(dtype="float32")
    p = particles(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="consensus_path.*non-finite"):
        meanfield.coupling(dyn, p, 0, np.full((3, 2, 2), np.nan))
    with pytest.raises(ValueError, match="leading step axis"):
        meanfield.coupling(dyn, p, 0, np.zeros(()))
    with pytest.raises(ValueError, match="PRNG key .* or an integer seed"):
        meanfield.coupling(dyn, p, "seed", np.zeros((3, 2, 2)))


@pytest.mark.slow
def test_cbo_copies_with_own_consensus_are_the_system_chunked_and_batched():
    """The same for single-objective CBO, with random batches and the chunked step."""
    x = np.random.default_rng(5).uniform(-2, 2, (2, 24, 3))
    with enable_x64(True):
        dyn = cj.cbo(objectives.Ackley(), sigma1=0.8, alpha=30.0, dtype="float64", batch_size=12, particle_chunk=8,
                     lambda2=0.1)
        own = cj.simulate(dyn, x, 3, 20, num_runs=2, record_consensus=True)
        res = meanfield.coupling(dyn, x, 3, own.history["consensus"][:, 0], num_runs=2)
    np.testing.assert_array_equal(res.sq_distance[0], 0.0)
    assert np.all(res.sq_distance[1, 1:] > 0)  # run 1 was fed run 0's path
    np.testing.assert_array_equal(np.asarray(res.final_x), np.asarray(own.state.x))


def test_class_variance_excluded_or_unlabelled_particles_do_not_poison_other_classes():
    # an excluded particle at NaN (a diverged attacker) made every class NaN: 0 * NaN in the class sums
    x = np.array([[0.0, 0.0], [1.0, 1.0], [np.nan, np.nan]])
    centers = np.zeros((2, 2))
    got = np.asarray(meanfield.class_variance(x, np.array([0, 1, 1]), centers, include=np.array([True, True, False])))
    np.testing.assert_allclose(got, [0.0, 1.0])
    # a label outside [0, K) counted in no class but made every class NaN; refused when it is known
    with pytest.raises(ValueError, match=r"label must lie in \[0, 2\).*particle 2 has 5"):
        meanfield.class_variance(np.array([[0.0, 0], [1, 1], [2, 2]]), np.array([0, 1, 5]), centers)
    traced = jax.jit(meanfield.class_variance)(np.array([[0.0, 0], [1, 1], [2, 2]]), np.array([0, 1, 5]), centers)
    np.testing.assert_allclose(np.asarray(traced), [0.0, 1.0])


@pytest.mark.parametrize("call,match", [
    (lambda: meanfield.fit_loglog_slope([1, 2, 3], [1.0, np.nan, 0.3]), "finite"),
    (lambda: meanfield.fit_loglog_slope([1, 2, np.inf], [1.0, 0.5, 0.3]), "finite"),
    (lambda: meanfield.fit_loglog_slope([10, 10], [0.6, 0.7]), "2 different n"),
    (lambda: meanfield.fit_decay_rate([], []), "at least 3 points"),
    (lambda: meanfield.predicted_decay_rate(1, 0, 1, 0, d=3, lipschitz=0, noise="isotropc"), "noise must be one of"),
    (lambda: meanfield.ideal_quadratic_rate(1, 0, 1, 0, d=3, noise="none"), "noise must be one of"),
    (lambda: meanfield.ideal_quadratic_rate(1, 0, 1, 0, d=0), "d must be >= 1"),
    (lambda: meanfield.sliced_wasserstein(np.ones((3, 2)), np.ones((0, 2)), 0), "y must hold at least one sample"),
])
def test_fits_and_rates_refuse_what_they_cannot_use(call, match):
    # were: NaN slope (or numpy's LinAlgError), IndexError, a typo silently taken as anisotropic noise, d = 0
    # accepted, a TypeError from inside a jitted gather
    with pytest.raises(ValueError, match=match):
        call()


def test_class_variance_of_stacked_runs_names_the_vmap():
    x, label, centers = np.zeros((3, 8, 2)), np.arange(8) % 2, np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"x looks like 3 runs stacked.*jax.vmap\(class_variance"):
        meanfield.class_variance(x, label, centers)
    assert jax.vmap(meanfield.class_variance, in_axes=(0, None, None))(x, label, centers).shape == (3, 2)


@pytest.mark.parametrize("label,centers,include,match", [
    (np.zeros(5, int), np.zeros((2, 2)), None, r"label must have shape \(6,\)"),
    (np.zeros(6, int), np.zeros((2, 3)), None, r"centers must be K points shaped like one particle"),
    (np.zeros(6, int), np.zeros((2, 2)), np.ones(4, bool), r"include must have shape \(6,\)"),
    (np.zeros(6), np.zeros((2, 2)), None, "label must hold integers"),
])
def test_class_variance_shape_mismatches_are_named(label, centers, include, match):
    """These were TypeErrors from jnp's broadcasting ("sub got incompatible shapes")."""
    with pytest.raises(ValueError, match=match):
        meanfield.class_variance(jnp.ones((6, 2)), label, centers, include=include)


def test_class_variance_closed_form():
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [1.0, 1.0]])
    got = np.asarray(meanfield.class_variance(x, np.array([0, 0, 1, 1]), np.array([[0.0, 0.0], [1.0, 1.0]])))
    np.testing.assert_allclose(got, [0.5 * (1 + 4) / 2, 0.5 * (8 + 0) / 2], rtol=1e-6)


def test_predicted_decay_rate_is_elementwise_in_the_lipschitz_constant_too():
    """Documented as elementwise on arrays, but float(lipschitz) refused an array."""
    got = meanfield.predicted_decay_rate(1.0, 0.5, 0.1, 0.2, 2, np.array([0.0, 1.0, 2.0]))
    want = [2 * 1.0 - 2 * 0.5 * m - 2 * 0.01 - 2 * 0.04 * m ** 2 for m in (0.0, 1.0, 2.0)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert meanfield.predicted_decay_rate(1.0, 0.5, 0.1, 0.2, 2, 1.0) == pytest.approx(want[1], rel=1e-12)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_sliced_wasserstein_p2_of_a_translation_in_one_dimension_is_the_shift():
    """Guards the final ``** (1/p)`` of SW_p: in 1-D (directions ±1, so every projection is
    exact) a sample and its translate by ``v`` are ``W_p = |v|`` apart for every ``p``; the
    suite only used ``p = 1``, where the root is the identity."""
    x = np.random.default_rng(0).standard_normal((9, 1))
    for p in (2.0, 3.0):
        got = float(meanfield.sliced_wasserstein(x, x + 3.0, jax.random.key(0), num_projections=5, p=p))
        assert got == pytest.approx(3.0, rel=1e-5)


@pytest.mark.reference
def test_ideal_quadratic_rate_closed_form():
    """Guards ``2(λ1 + λ2) - c σ1² - d σ2²`` (``c = d`` isotropic, ``1`` anisotropic)."""
    assert meanfield.ideal_quadratic_rate(1.0, 0.5, 0.3, 0.2, d=3) == pytest.approx(3.0 - 3 * 0.09 - 3 * 0.04)
    assert meanfield.ideal_quadratic_rate(1.0, 0.5, 0.3, 0.2, d=3, noise="anisotropic") == pytest.approx(
        3.0 - 0.09 - 3 * 0.04)


@pytest.mark.reference
def test_coupling_distance_is_averaged_over_the_benign_particles_only():
    """Guards the benign mean of ``|θ_i - θ̄_i|²`` in :func:`meanfield.coupling` (dividing by
    all ``N`` went unnoticed: the suite's coupling tests had no malicious particles). Noise
    off, copies driven to the own consensus shifted by ``δ``: for each benign particle
    ``|d_t|² = |δ|² (1 - (1 - λ1 dt)^t)²``, so their mean is that too."""
    from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, clustered, particles

    rng = np.random.default_rng(4)
    delta = np.array([0.3, -0.4])
    n = 10
    with enable_x64(True):
        cfg = ClusteredConfig(lambda1=0.8, sigma1=0.5, dt=0.02, alpha=10.0, noise="none", dtype="float64")
        attack = Malicious(drift=lambda t, x: -(x + 1.0))
        dyn = clustered([objectives.Quadratic(shift=c) for c in ([1.0, 1.0], [-1.0, -1.0])], cfg, malicious=attack)
        p = particles(rng.uniform(-2, 2, (n, 2)), np.arange(n) % 2, malicious=np.arange(n) % 5 == 0)
        own = cj.simulate(dyn, p, 1, 12, record_consensus=True)
        res = meanfield.coupling(dyn, p, 1, own.history["consensus"] + delta)
    t = np.arange(13)
    expected = np.sum(delta ** 2) * (1 - (1 - 0.8 * 0.02) ** t) ** 2
    np.testing.assert_allclose(res.sq_distance, expected, rtol=1e-10, atol=1e-15)
