"""The random batch method (cbo_jax.batching) for CBO, the clustered system and CB²O."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import batching, objectives, schedules
from cbo_jax.dynamics.clustered import ClusteredConfig, Malicious, cb2o, particles

from _stack import enable_x64


N = 12


def _cbo(**kw):
    cfg = cj.CBOConfig(lambda1=0.9, sigma1=0.8, dt=0.03, noise="anisotropic", lambda2=0.2, dtype="float64",
                       alpha=schedules.EffectiveSampleSize(eta=0.5), **kw)
    return cj.cbo(objectives.Ackley(shift=0.4), cfg)


def _cb2o(**kw):
    lower = lambda x: jnp.sum((x - 1.0) ** 2, -1) * jnp.sum((x + 1.0) ** 2, -1)  # noqa: E731
    upper = lambda x: jnp.sum((x - 1.0) ** 2, -1)  # noqa: E731
    attack = Malicious(drift=lambda t, x: -(x + 1.0))
    cfg = ClusteredConfig(lambda1=1.0, sigma1=0.6, dt=0.03, alpha=30.0, beta=0.5, noise="isotropic", dtype="float64",
                          **kw)
    return cb2o(lower, upper, cfg, malicious=attack)


# CBO with partial update in the default run; the full update and CB²O (quantile set, attackers) under `slow`.
@pytest.mark.parametrize("system,partial", [("cbo", True), pytest.param("cbo", False, marks=pytest.mark.slow),
                                            pytest.param("cb2o", True, marks=pytest.mark.slow)])
def test_batch_of_all_particles_equals_the_full_system_exactly(system, partial):
    x = np.random.default_rng(0).uniform(-2, 2, (N, 3))
    with enable_x64(True):
        if system == "cbo":
            full, batched, x0 = _cbo(), _cbo(batch_size=N, batch_partial=partial), x
        else:
            full, batched = _cb2o(), _cb2o(batch_size=N, batch_partial=partial)
            x0 = particles(x, malicious=np.arange(N) % 4 == 0)
        a = cj.simulate(full, x0, 3, 30)
        b = cj.simulate(batched, x0, 3, 30)
        np.testing.assert_array_equal(np.asarray(b.state.x), np.asarray(a.state.x))
        np.testing.assert_array_equal(np.asarray(b.state.alpha), np.asarray(a.state.alpha))
        assert int(b.state.batch.pos) == N  # a fresh permutation was drawn at every step


def _np_consensus(x, e, alpha, keep):
    w = np.where(keep, np.exp(-alpha * (e - e[keep].min())), 0.0)
    return (w[:, None] * x).sum(0) / w.sum()


@pytest.mark.parametrize("partial", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_consensus_runs_over_the_batch_and_partial_update_moves_only_it(partial):
    b = 4
    x0 = np.random.default_rng(1).uniform(-2, 2, (N, 2))
    with enable_x64(True):
        cfg = cj.CBOConfig(lambda1=1.0, sigma1=0.5, dt=0.05, alpha=3.0, dtype="float64", batch_size=b,
                           batch_partial=partial)
        dyn = cj.cbo(objectives.Rastrigin(), cfg)
        step = jax.jit(dyn.step)
        state = dyn.init(x0, jax.random.key(0))
        seen = []
        for _ in range(2 * N // b):  # two epochs
            new = step(state)
            mask = np.asarray(new.in_batch)
            assert mask.sum() == b
            x, e = np.asarray(state.x), np.asarray(state.energy)
            np.testing.assert_allclose(np.asarray(new.consensus), _np_consensus(x, e, 3.0, mask), rtol=1e-12)
            moved = np.any(np.asarray(new.x) != x, axis=1)
            # Outside the batch: frozen (partial) or moving toward the batch's consensus (full).
            assert not moved[~mask].any() if partial else moved[~mask].all()
            seen.append(mask)
            state = new
    # Batches walk through a permutation: within an epoch they are disjoint and cover every particle.
    for epoch in (seen[: N // b], seen[N // b:]):
        np.testing.assert_array_equal(np.sum(epoch, axis=0), np.ones(N))
    assert not all(np.array_equal(s, t) for s, t in zip(seen[: N // b], seen[N // b:]))  # new permutation


def test_bad_batch_settings():
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        cj.CBOConfig(batch_size=2.5)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ClusteredConfig(batch_size=0)
    with pytest.raises(ValueError, match="batch_partial"):
        cj.CBOConfig(batch_size=3, batch_partial="yes")
    dyn = cj.cbo(objectives.Sphere(), batch_size=20)
    with pytest.raises(ValueError, match="batch_size=20 exceeds the number of particles N=10"):
        cj.simulate(dyn, np.zeros((10, 2), np.float32), 0, 5)


@pytest.mark.parametrize("bad", [2.5, True, np.float32(2.0)])
def test_next_batch_refuses_a_batch_size_that_is_not_an_integer(bad):
    """next_batch(state, key, 2.5) passed its range check and failed in dynamic_slice with
    JAX's "Shapes must be 1D sequences of concrete values of integer type"; True was a batch of 1."""
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        batching.next_batch(batching.init(5), jax.random.key(0), bad)
    mask, _ = batching.next_batch(batching.init(5), jax.random.key(0), np.int64(2))
    assert int(mask.sum()) == 2


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_first_batch_comes_from_a_fresh_permutation_on_the_batch_stream():
    """Guards: ``init`` puts ``pos = N`` so the first step draws a permutation (``pos = 0``
    walked the identity permutation, the first epoch's batches were ``0..b-1, b..2b-1, ...``),
    and the permutation's key is ``fold_in(step_key, BATCH_STREAM)`` (documented; the key
    itself is the one the noise is split from)."""
    n, b = 10, 3
    firsts = set()
    for seed in range(4):
        key = jax.random.key(seed)
        mask, state = batching.next_batch(batching.init(n), key, b)
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, batching.BATCH_STREAM), n))
        want = np.zeros(n, bool)
        want[perm[:b]] = True
        np.testing.assert_array_equal(np.asarray(mask), want)
        np.testing.assert_array_equal(np.asarray(state.perm), perm)
        assert int(state.pos) == b
        firsts.add(tuple(np.flatnonzero(np.asarray(mask))))
    assert len(firsts) > 1  # not the same first batch for every key
