"""Clustered (FedCBO eq. (4)) and CB²O particle systems."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import objectives, schedules
from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, cb2o, clustered, particles

from _stack import enable_x64


def _np_consensus(x, energy, alpha, mask=None):
    """float64 NumPy reference of m_k = Σ θ exp(-α E_k) / Σ exp(-α E_k) over all particles."""
    x = np.asarray(x, np.float64)
    out = []
    for k in range(energy.shape[0]):
        e = np.asarray(energy[k], np.float64)
        keep = np.ones_like(e, bool) if mask is None else mask[k]
        w = np.where(keep, np.exp(-alpha * (e - e[keep].min())), 0.0)
        out.append((w[:, None] * x).sum(0) / w.sum())
    return np.stack(out)


def _quadratics(centers):
    return [objectives.Quadratic(shift=c) for c in centers]


def test_class_consensus_matches_numpy_float64():
    rng = np.random.default_rng(0)
    centers = rng.uniform(-2, 2, (3, 4))
    x = rng.uniform(-3, 3, (50, 4))
    label = rng.integers(0, 3, 50)
    with enable_x64(True):
        dyn = clustered(_quadratics(centers), alpha=2.0, dtype="float64")
        st = dyn.init(particles(x, label), jax.random.key(0))
        loss = np.stack([0.5 * np.sum((x - c) ** 2, -1) for c in centers])
        np.testing.assert_allclose(np.asarray(st.loss), loss, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(st.consensus), _np_consensus(x, loss, 2.0), rtol=1e-10, atol=1e-12)


def test_label_enters_consensus_only_through_loss():
    """Relabelling particles changes nothing about m_k: m_k is over ALL particles,
    weighted by class k's loss, whatever their own class."""
    rng = np.random.default_rng(1)
    centers = rng.uniform(-2, 2, (2, 3))
    x = rng.uniform(-3, 3, (40, 3)).astype(np.float32)
    dyn = clustered(_quadratics(centers), alpha=5.0)
    a = dyn.init(particles(x, np.zeros(40, int)), jax.random.key(0))
    b = dyn.init(particles(x, rng.integers(0, 2, 40)), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(a.consensus), np.asarray(b.consensus))
    # One step: the noise-free move of a particle depends on its label only via which m_k it follows.
    dyn0 = clustered(_quadratics(centers), alpha=5.0, noise="none", lambda1=1.0, dt=0.1)
    lab = rng.integers(0, 2, 40)
    s = dyn0.step(dyn0.init(particles(x, lab), jax.random.key(0)))
    m = np.asarray(s.consensus)
    np.testing.assert_allclose(np.asarray(s.x), x - 0.1 * (x - m[lab]), rtol=1e-5, atol=1e-6)


def test_permutation_invariance_same_key_per_particle():
    rng = np.random.default_rng(2)
    centers = rng.uniform(-2, 2, (3, 5))
    n = 60
    x = rng.uniform(-3, 3, (n, 5))
    label = rng.integers(0, 3, n)
    mal = rng.random(n) < 0.2
    perm = rng.permutation(n)
    attack = Malicious(drift=lambda t, th: -(th - 1.0), diffusion=lambda t, th: 0.1 * jnp.ones(th.shape[0], th.dtype))
    with enable_x64(True):
        dyn = clustered(_quadratics(centers), ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.02, alpha=20.0,
                                                                lambda2=0.5, sigma2=0.1, dtype="float64",
                                                                rng="per-particle"), malicious=attack)
        p = particles(x, label, mal)
        q = particles(x[perm], label[perm], mal[perm], np.arange(n)[perm])
        a = cj.simulate(dyn, p, jax.random.key(3), 30)
        b = cj.simulate(dyn, q, jax.random.key(3), 30)
        np.testing.assert_allclose(np.asarray(b.state.x), np.asarray(a.state.x)[perm], rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(np.asarray(b.state.consensus), np.asarray(a.state.consensus), rtol=1e-9, atol=1e-11)


def test_four_classes_find_their_minimisers_unlabelled():
    rng = np.random.default_rng(3)
    centers = rng.uniform(-2, 2, (4, 6))
    objs = [objectives.Rastrigin(shift=c) for c in centers]
    cfg = ClusteredConfig(lambda1=1.0, sigma1=10.1, dt=0.01, noise="anisotropic",
                          alpha=cj.schedules.Multiplicative(30.0, 1.05, 1e5))
    n = 800
    x = rng.uniform(-3, 3, (n, 6))
    res = cj.simulate(clustered(objs, cfg), particles(x, np.arange(n) % 4), jax.random.key(0), 1500)
    dist = np.linalg.norm(np.asarray(res.state.consensus) - centers, axis=-1)
    assert np.all(dist < 1e-2), dist
    assert res.history["min_energy"].shape == (1500, 4)


def test_cb2o_ignores_lower_level_minimiser_g_dislikes_and_malicious_particles():
    """Two global minimisers of L; G prefers a. 20 % attackers sit on b. CB²O's benign
    consensus stays at a; plain CBO (weights exp(-α L), β=1) is dragged to b."""
    d = 3
    a, b = np.full(d, 1.0), np.full(d, -1.0)

    def lower(x):
        return jnp.sum((x - a) ** 2, -1) * jnp.sum((x - b) ** 2, -1)

    def upper(x):
        return jnp.sum((x - a) ** 2, -1)

    rng = np.random.default_rng(4)
    n = 500
    x = rng.uniform(-2, 2, (n, d))
    mal = np.arange(n) < n // 5
    x[mal] = b + 0.01 * rng.standard_normal((mal.sum(), d))
    attack = Malicious(drift=lambda t, th: -5.0 * (th - jnp.asarray(b, th.dtype)))
    cfg = ClusteredConfig(lambda1=1.0, sigma1=0.5, dt=0.01, alpha=1e3, beta=0.5)
    res = cj.simulate(cb2o(lower, upper, cfg, malicious=attack), particles(x, malicious=mal), jax.random.key(0), 1500)
    assert np.linalg.norm(np.asarray(res.state.consensus)[0] - a) < 1e-2
    plain = cj.simulate(clustered([lower], cfg, malicious=attack), particles(x, malicious=mal), jax.random.key(0), 1500)
    assert np.linalg.norm(np.asarray(plain.state.consensus)[0] - a) > 0.5


def test_nan_attacker_never_poisons_benign():
    d = 2
    rng = np.random.default_rng(5)
    n = 100
    x = rng.uniform(-1, 1, (n, d))
    mal = np.arange(n) < 10
    attack = Malicious(drift=lambda t, th: jnp.full_like(th, jnp.nan))
    dyn = clustered([objectives.Quadratic()], ClusteredConfig(sigma1=0.3, alpha=10.0), malicious=attack)
    res = cj.simulate(dyn, particles(x, malicious=mal), jax.random.key(0), 200)
    xb = np.asarray(res.state.x)[~mal]
    assert np.all(np.isfinite(xb))
    assert np.all(np.isfinite(np.asarray(res.state.consensus)))
    assert np.all(np.isnan(np.asarray(res.state.x)[mal]))


def test_vmapped_parameter_sweep_equals_separate_runs():
    from cbo_jax.dynamics.clustered import SDEParams

    centers = np.array([[1.0, 1.0], [-1.0, -1.0]])
    cfg = ClusteredConfig(lambda1=1.0, sigma1=0.3, lambda2=0.5, sigma2=0.1, dt=0.01, alpha=50.0)
    dyn = clustered(_quadratics(centers), cfg)
    x = np.random.default_rng(6).uniform(-2, 2, (64, 2)).astype(np.float32)
    p = particles(x, np.arange(64) % 2)
    grid = SDEParams(*(jnp.asarray(v, jnp.float32) for v in ([1.0, 2.0], [0.3, 0.1], [0.5, 0.0], [0.1, 0.2])))
    key = jax.random.key(1)

    def run(params):
        st = dyn.init(p, key, params)
        return jax.lax.fori_loop(0, 20, lambda i, s: dyn.step(s), st).x

    swept = jax.jit(jax.vmap(run))(grid)
    for j in range(2):
        one = jax.jit(run)(SDEParams(*(v[j] for v in grid)))
        np.testing.assert_allclose(np.asarray(swept[j]), np.asarray(one), rtol=1e-5, atol=1e-6)


def test_bad_input():
    objs = _quadratics(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="beta"):
        ClusteredConfig(beta=0.0)
    with pytest.raises(ValueError, match="dt"):
        ClusteredConfig(dt=-1.0)
    with pytest.raises(ValueError, match="sigma1"):
        ClusteredConfig(sigma1=-0.1)
    with pytest.raises(ValueError, match="rng"):
        ClusteredConfig(rng="mt19937")
    dyn = clustered(objs)
    x = np.zeros((10, 3), np.float32)
    with pytest.raises(ValueError, match="label must lie"):
        cj.simulate(dyn, particles(x, np.full(10, 2)), jax.random.key(0), 1)
    with pytest.raises(ValueError, match="label must have shape"):
        particles(x, np.zeros(9, int))
    with pytest.raises(ValueError, match="Particles"):
        cj.simulate(dyn, x, jax.random.key(0), 1)
    with pytest.raises(ValueError, match="finite"):
        cj.simulate(dyn, particles(np.full((10, 3), np.nan, np.float32)), jax.random.key(0), 1)
    with pytest.raises(ValueError, match="upper"):
        clustered(objs, upper=[objectives.Sphere()] * 3)
    # every objective is traced on the particles' shapes, the upper ones and the K-th lower one too:
    # an objective of ONE particle ((d,) -> ()) would broadcast one energy to all particles
    one_particle = lambda th: jnp.sum((th - 1.0) ** 2)  # noqa: E731
    with pytest.raises(ValueError, match="upper objective 0 must return one energy per particle.*ONE particle"):
        cj.simulate(cb2o(objectives.Sphere(), one_particle), particles(x), jax.random.key(0), 1)
    with pytest.raises(ValueError, match="lower objective 1 must return one energy per particle"):
        cj.simulate(clustered([objs[0], one_particle]), particles(x), jax.random.key(0), 1)


def test_cb2o_consensus_matches_numpy_quantile_reference():
    """m = Σ_{Q_β} θ e^{-αG} / Σ_{Q_β} e^{-αG}, Q_β = {L <= numpy.quantile(L, β)} (eq. 1.3-1.4)."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (41, 3))
    lower = lambda z: jnp.sum(z**2, -1)  # noqa: E731
    upper = lambda z: jnp.sum((z - 1.0) ** 2, -1)  # noqa: E731
    with enable_x64(True):
        for beta in (0.3, 0.5, 1.0):
            st = cb2o(lower, upper, alpha=3.0, beta=beta, dtype="float64").init(particles(x), jax.random.key(0))
            lo, g = np.sum(x**2, -1), np.sum((x - 1.0) ** 2, -1)
            mask = lo <= np.quantile(lo, beta)
            ref = _np_consensus(x, g[None], 3.0, mask[None])
            np.testing.assert_allclose(np.asarray(st.consensus), ref, rtol=1e-10)


@pytest.mark.parametrize("rng", ["fast", "per-particle"])
def test_noise_draw_is_a_kernel_of_its_own_on_cpu(rng):
    """The clustered step keeps the draw's conditional (_xla_cpu.written_out): fused into the
    gather-and-update, the per-particle draw made the step 1.7x slower on XLA:CPU."""
    if jax.default_backend() != "cpu":
        pytest.skip("the boundary is only placed on XLA:CPU")
    centers = np.array([[1.0, 0.0], [-1.0, 0.0]])
    dyn = clustered(_quadratics(centers), ClusteredConfig(lambda1=1.0, sigma1=0.7, dt=0.02, alpha=20.0, rng=rng))
    x0 = np.random.default_rng(0).normal(size=(32, 2)).astype(np.float32)
    state = dyn.init(particles(x0, np.arange(32) % 2), jax.random.key(0))
    assert " conditional(" in jax.jit(dyn.step).lower(state).compile().as_text()


def test_time_is_step_times_dt():
    """``time = step * dt`` (the state's docstring), not a float32 running sum that drifts."""
    dyn = clustered(_quadratics(np.array([[0.0, 0.0]])), alpha=1.0, sigma1=0.0, dt=0.01)
    s = dyn.init(particles(np.zeros((2, 2), np.float32), np.zeros(2, int)), jax.random.key(0))
    s = jax.jit(lambda s: jax.lax.fori_loop(0, 3000, lambda i, s: dyn.step(s), s))(s)
    assert int(s.step) == 3000
    assert float(s.time) == float(np.float32(3000) * np.float32(0.01))


def test_particles_refuse_fractional_ids_and_masks_and_marks_without_attackers():
    """``particles`` truncated ids 1.9 to 1 and took 0.5 and 2 as malicious; particles marked
    malicious in dynamics without an attackers' SDE moved as benign ones, without a word;
    stacked runs got "label must have shape (2,)" with no hint."""
    x = np.random.default_rng(0).uniform(-3, 3, (6, 2)).astype(np.float32)
    with pytest.raises(ValueError, match="pid must hold integers, got dtype float64"):
        particles(x, pid=[0.5, 1.9, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="malicious must be a boolean mask, got dtype float64$"):
        particles(x, malicious=[0.5, 0, 0, 0, 0, 2])
    with pytest.raises(ValueError, match=r"malicious must be a boolean mask.*malicious.astype\(bool\)"):
        particles(x, malicious=[1, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"x has 2 rows: for runs stacked"):
        particles(np.stack([x, x]), label=np.zeros(6, int))
    dyn = clustered([objectives.Rastrigin()], ClusteredConfig(alpha=10.0))
    with pytest.raises(ValueError, match="marks 1 particles malicious, but these dynamics have no attackers' SDE"):
        cj.simulate(dyn, particles(x, malicious=[True] + [False] * 5), 0, 2)


def test_every_run_needs_a_benign_particle():
    """The check looked at all runs together: a run of attackers only passed when another run
    had benign particles (alone, the same run was refused)."""
    f1, f2 = (lambda z: jnp.sum((z - 1) ** 2, 1)), (lambda z: jnp.sum((z + 1) ** 2, 1))
    dyn = clustered([f1, f2], malicious=Malicious(drift=lambda t, z: z * 0))
    x = jax.random.uniform(jax.random.key(0), (2, 8, 2), minval=-3, maxval=3)
    label = jnp.asarray([[0, 1] * 4] * 2, jnp.int32)
    mal = np.zeros((2, 8), bool)
    mal[1] = True
    pid = jnp.tile(jnp.arange(8, dtype=jnp.int32), (2, 1))
    bundle = cj.Particles(x=x, label=label, malicious=jnp.asarray(mal), pid=pid)
    with pytest.raises(ValueError, match="has no benign particle in run 1"):
        cj.simulate(dyn, bundle, 0, 3, num_runs=2)
    mal[1, 0] = False
    assert cj.simulate(dyn, bundle._replace(malicious=jnp.asarray(mal)), 0, 3, num_runs=2).steps == 3


def test_particles_for_stacked_runs_repeat_one_runs_fields():
    """A stack of runs for simulate(..., num_runs=M) needed each field tiled by hand, and a
    Particles with (M, N, d) positions but (N,) labels was refused with "x0.label must have one
    entry per particle (40), got shape (40,)", a message at odds with itself."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (3, 8, 2)).astype(np.float32)
    label = np.arange(8) % 2
    p = particles(x, label, num_runs=3)
    assert p.label.shape == p.malicious.shape == p.pid.shape == (3, 8) and p.label.dtype == jnp.int32
    np.testing.assert_array_equal(p.label, np.stack([label] * 3))
    np.testing.assert_array_equal(p.pid, np.stack([np.arange(8)] * 3))
    per_run = particles(x, np.stack([label, 1 - label, label]), num_runs=3)  # (M, N) fields: one row per run
    np.testing.assert_array_equal(per_run.label[1], 1 - label)
    dyn = clustered([objectives.Quadratic(shift=1.0), objectives.Quadratic(shift=-1.0)])
    res = cj.simulate(dyn, p, 0, 4, num_runs=3)
    one = cj.simulate(dyn, particles(x[1], label), jax.random.split(jax.random.key(0), 3)[1], 4)
    np.testing.assert_allclose(np.asarray(res.state.x[1]), np.asarray(one.state.x), rtol=1e-5, atol=1e-6)
    unstacked = cj.Particles(x, *particles(x[0], label)[1:])
    with pytest.raises(ValueError, match=r"x0.label must have shape \(3, 8\) .*particles\(x, label, ..., num_runs=M\)"):
        cj.simulate(dyn, unstacked, 0, 2, num_runs=3)
    for call, match in [
        (lambda: particles(x, np.zeros((2, 8), int), num_runs=3), r"label must have shape \(N,\) .* or \(3, N\)"),
        (lambda: particles(x, np.zeros(7, int), num_runs=3), r"label must have shape \(8,\)"),
        (lambda: particles(x, np.zeros(8), num_runs=3), "label must hold integers"),
        (lambda: particles(x[:2], label, num_runs=3), "leading run axis of 3"),
        (lambda: particles(x, label), r"pass num_runs=M"),
        (lambda: particles(x, np.stack([label] * 3)), r"got \(3, 8\) \(x has 3 rows: .*pass num_runs=M\)"),  # per run
    ]:
        with pytest.raises(ValueError, match=match):
            call()


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Clustered system: what the default suite left unchecked (found by mutation testing).
#
# * The α schedule of each class reads that class's energies *of the step just taken's
#   consensus* (the energies before the move, CBXpy's order). Only the effective-sample-size
#   schedule reads energies at all, and no default test ran it on the clustered system, so
#   feeding it the new energies went unnoticed.
# * The gradient terms use ``∇L_{k_i}`` of each particle's *own* class; the pinned
#   gradient case is slow-only.
# * With ``particle_chunk`` and a fast RNG layout each chunk draws its own noise
#   (``fold_in(key, c)``); without the fold every chunk repeats chunk 0's draw.

def _np_ess(e, alpha):
    """float64 NumPy reference of J_eff(α) = (Σ w)² / Σ w², w = e^{-α (E - E_min)}."""
    w = np.exp(-alpha * (e - e.min()))
    return w.sum() ** 2 / (w ** 2).sum()


@pytest.mark.reference
def test_ess_schedule_of_each_class_reads_the_pre_step_energies():
    """After one step, class k's α solves J_eff(α; E_k before the step) = η N (float64 NumPy ESS)."""
    rng = np.random.default_rng(0)
    centers = np.array([[1.0, 0.0], [-1.0, 0.5]])
    x0 = rng.uniform(-2, 2, (16, 2))
    eta = 0.5
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=c) for c in centers], lambda1=1.0, sigma1=1.0, dt=0.1,
                        alpha=schedules.EffectiveSampleSize(eta=eta, alpha0=1.0, iterations=60), dtype="float64")
        s0 = dyn.init(particles(x0, np.arange(16) % 2), jax.random.key(0))
        s1 = jax.jit(dyn.step)(s0)
    e0, e1 = np.asarray(s0.energy), np.asarray(s1.energy)
    assert np.max(np.abs(e1 - e0)) > 0.1  # the step moved the energies: the two conventions differ
    for k in range(2):
        a = float(s1.alpha[k])
        np.testing.assert_allclose(_np_ess(e0[k], a), eta * 16, rtol=1e-6)
        assert abs(_np_ess(e1[k], a) - eta * 16) > 1e-3


@pytest.mark.reference
def test_gradient_drift_uses_each_particle_own_class():
    """Noise off, α = 0, λ1 = 0: one step is plain gradient descent on L_{k_i}, x - λ2 dt (x - c_{k_i})."""
    centers = np.array([[1.0, 2.0], [-3.0, 0.5]])
    x0 = np.random.default_rng(1).normal(size=(6, 2))
    label = np.array([0, 1, 1, 0, 1, 0])
    lam2, dt = 2.0, 0.1
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=c) for c in centers], lambda1=0.0, sigma1=0.0, lambda2=lam2,
                        dt=dt, alpha=0.0, noise="none", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(particles(x0, label), jax.random.key(0)))
    want = x0 - lam2 * dt * (x0 - centers[label])  # Quadratic: L(x) = |x - c|² / 2
    np.testing.assert_allclose(np.asarray(s.x), want, rtol=1e-13, atol=1e-13)


@pytest.mark.reference
def test_chunks_draw_independent_noise():
    """Two identical halves of a population, processed as two chunks: with the fast layout the
    chunks draw different normals, so the halves must not stay identical after a step."""
    half = np.random.default_rng(2).uniform(-2, 2, (8, 3))
    x0 = np.concatenate([half, half])
    with enable_x64(True):
        dyn = clustered([objectives.Quadratic(shift=0.3)], lambda1=1.0, sigma1=1.0, dt=0.1, alpha=1.0,
                        noise="anisotropic", particle_chunk=8, rng="fast", dtype="float64")
        s = jax.jit(dyn.step)(dyn.init(particles(x0), jax.random.key(0)))
    x = np.asarray(s.x)
    assert np.min(np.abs(x[:8] - x[8:])) > 0  # every coordinate got its own draw
