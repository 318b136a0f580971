"""The consensus kernel shared by FedCBO and FedCB²O, against a float64 NumPy reference.

The energies are given directly (no model, no training), so every branch of
``consensus_downloads`` is checked in milliseconds: the weights exp(-α E) normalised, the
agent's own model with ``include_self``, downloads with non-finite parameters or energies
at weight zero, the fallback to the agent's own model, and the local and chunked gathers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated.aggregation import Energy, consensus_downloads

from _stack import enable_x64


def energy_fn(models, theta, e, own_e):
    # the downloads' energies are data; their "loss" is the energy plus one, to tell them apart
    return Energy(e, e + 1.0, own_e, own_e + 1.0)


def reference(params, idx, e, own_e, alpha, include_self):
    params, e = np.asarray(params, np.float64), np.asarray(e, np.float64)
    r = idx.shape[0]
    out = np.zeros((r, params.shape[1]))
    weights, self_w, fallback = np.zeros(idx.shape), np.zeros(r), np.zeros(r, bool)
    for j in range(r):
        down = params[idx[j]]
        ok = np.isfinite(down).all(axis=1) & np.isfinite(e[j])
        energies = list(np.where(ok, e[j], np.inf)) + ([own_e[j]] if include_self else [])
        energies = np.asarray(energies)
        good = np.isfinite(energies)
        if not good.any():
            fallback[j], self_w[j] = True, 1.0
            out[j] = params[j]
            continue
        w = np.where(good, np.exp(-alpha * (energies - energies[good].min())), 0.0)
        w /= w.sum()
        weights[j] = w[: idx.shape[1]]
        self_w[j] = w[-1] if include_self else 0.0
        out[j] = np.tensordot(weights[j], np.where(ok[:, None], down, 0.0), 1) + self_w[j] * params[j]
    return out, weights, self_w, fallback


@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("chunk", [1, 3])
def test_weights_and_consensus_match_numpy(include_self, chunk):
    rng = np.random.default_rng(0)
    n, m, d, alpha = 6, 3, 4, 2.5
    params = rng.normal(size=(n, d)).astype(np.float32)
    params[4, 1] = np.nan  # a broken model: weight zero wherever it is downloaded
    idx = np.stack([rng.choice(np.delete(np.arange(n), j), m, replace=False) for j in range(n)]).astype(np.int32)
    idx[0] = [4, 4, 4]
    e = rng.uniform(0, 2, (n, m)).astype(np.float32)
    e[1, 0] = np.inf  # a non-finite energy: weight zero too
    own_e = rng.uniform(0, 2, n).astype(np.float32)
    res = consensus_downloads(energy_fn, jnp.asarray(params), jnp.asarray(idx), jnp.asarray(params),
                              (jnp.asarray(e), jnp.asarray(own_e)), alpha=alpha, include_self=include_self, chunk=chunk)
    m_ref, w_ref, s_ref, f_ref = reference(params, idx, e, own_e, alpha, include_self)
    np.testing.assert_allclose(np.asarray(res.weights), w_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(res.self_weight), s_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(res.fallback), f_ref)
    rows = [j for j in range(n) if j != 4]  # agent 4's own model is broken
    np.testing.assert_allclose(np.asarray(res.consensus)[rows], m_ref[rows], rtol=1e-5, atol=1e-6)
    # losses: the energy-based loss of usable downloads, inf for the broken ones
    want_loss = np.where(np.isfinite(params[idx]).all(axis=2), e + 1.0, np.inf)
    np.testing.assert_allclose(np.asarray(res.loss), want_loss, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.own_loss), own_e + 1.0, rtol=1e-6)
    assert bool(res.fallback[0]) != include_self  # agent 0 downloaded only the broken model


def test_large_alpha_picks_the_lowest_energy_and_zero_alpha_averages():
    params = jnp.arange(12.0).reshape(4, 3)
    idx = jnp.asarray([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]], jnp.int32)
    e = jnp.asarray([[0.3, 0.1, 0.2]] * 4)
    own = jnp.zeros(4)
    hot = consensus_downloads(energy_fn, params, idx, params, (e, own), alpha=1e12)
    np.testing.assert_array_equal(np.asarray(hot.consensus), np.asarray(params)[np.asarray(idx)[:, 1]])
    flat = consensus_downloads(energy_fn, params, idx, params, (e, own), alpha=0.0)
    np.testing.assert_allclose(np.asarray(flat.consensus), np.asarray(params)[np.asarray(idx)].mean(axis=1), rtol=1e-6)


def test_two_pass_step_equals_the_fused_step_bitwise():
    """The in-memory gather runs two passes (weights, then the contraction); a map without
    ``cheap_refetch`` runs the single fused pass. Every output is bitwise equal, with a real
    model's loss as the energy, a broken model, an agent's own broken model and empty slots."""
    from cbo_jax.federated.aggregation import local_downloads
    from cbo_jax.federated.local import agent_loss
    from cbo_jax.models import init_population, mlp_mnist

    model = mlp_mnist(hidden=(6,), num_classes=3, input_shape=(8,))
    rng = np.random.default_rng(1)
    n, m, s, chunk = 7, 3, 10, 3  # 7 agents in chunks of 3: a ragged last chunk
    params = init_population(model, jax.random.key(0), n)
    params = jax.tree_util.tree_map(lambda a: a.at[2].set(jnp.nan) if a.ndim == 3 else a, params)
    own = jax.tree_util.tree_map(lambda a: 0.5 * a, params)  # the selecting agents' own models differ
    idx = jnp.asarray(np.stack([rng.choice(np.delete(np.arange(n), j), m, replace=False) for j in range(n)]), jnp.int32)
    valid = jnp.asarray(rng.random((n, m)) < 0.8)
    x = jnp.asarray(rng.normal(size=(n, s, 8)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, (n, s)), jnp.int32)
    c = jnp.asarray(rng.integers(3, s + 1, n), jnp.int32)

    def energy(models, theta, xj, yj, cj):
        loss = jax.vmap(lambda p: agent_loss(model, p, xj, yj, cj))(models)
        own = agent_loss(model, theta, xj, yj, cj)
        return Energy(loss, loss, own, own)

    def step(downloads):
        return jax.jit(lambda p, o: consensus_downloads(energy, p, idx, o, (x, y, c), alpha=7.0, chunk=chunk,
                                                        include_self=True, valid=valid,
                                                        downloads=downloads))(params, own)

    assert local_downloads.cheap_refetch
    two_pass, fused = step(None), step(lambda *a: local_downloads(*a))
    for a, b in zip(jax.tree_util.tree_leaves(two_pass), jax.tree_util.tree_leaves(fused)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.isfinite(np.asarray(two_pass.loss)).sum() < n * m  # the broken model and empty slots were seen


# ----------------------------------------------------------------------------- model by model


def test_pair_schedule_covers_every_valid_pair_once_in_groups_of_one_model():
    from cbo_jax.federated.aggregation import group_sizes, pair_schedule

    assert group_sizes(1) == (1,) and group_sizes(4) == (4, 1) and group_sizes(16) == (16, 4, 1)
    assert group_sizes(8) == (8, 2, 1) and group_sizes(3) == (3, 1)
    for bad in (0, -4, 2.5):  # group=0 failed later, in a message about pair_schedule's sizes
        with pytest.raises(ValueError, match="group must be"):
            group_sizes(bad)
    rng = np.random.default_rng(3)
    n, q = 9, 57
    models = rng.integers(0, n, q)
    models[:12] = 4  # one model downloaded often: several full groups and a partial one
    valid = rng.random(q) < 0.85
    per_model = np.bincount(models[valid], minlength=n)
    for sizes in ((1,), (2,), (5,), (64,), (4, 1), (16, 4, 1), (8, 2, 1), (5, 2)):
        levels = jax.jit(pair_schedule, static_argnums=(2, 3))(jnp.asarray(models), jnp.asarray(valid), n, sizes)
        assert len(levels) == len(sizes)
        seen, left = [], per_model.copy()
        for level, (s_, (table, group_model, num_groups)) in enumerate(zip(sizes, levels)):
            table, group_model, g = np.asarray(table), np.asarray(group_model), int(num_groups)
            last = level == len(sizes) - 1
            expected = -(-left // s_) if last else left // s_
            assert g == int(expected.sum()), sizes
            left = left - np.minimum(expected * s_, left)
            for row, mdl in zip(table[:g], group_model[:g]):
                members = row[row < q]
                assert np.all(models[members] == mdl)
                assert len(members) == s_ or (last and 1 <= len(members) < s_), sizes  # only the last level pads
                seen.extend(members.tolist())
            assert np.all(table[g:] == q)  # rows past num_groups are empty
        assert sorted(seen) == sorted(np.flatnonzero(valid).tolist()), sizes  # each valid pair once
    with pytest.raises(ValueError, match="largest first"):
        pair_schedule(jnp.asarray(models), jnp.asarray(valid), n, (1, 4))


@pytest.mark.parametrize("group,unroll", [(1, 4), (2, 4), (16, 4), (2, 1), (1, 3)])
def test_by_model_matches_numpy(group, unroll):
    """``consensus_by_model`` against the float64 reference: the energy of a (model, agent)
    pair is a table entry, so the pair bookkeeping, the weights and the dense contraction
    are checked exactly, with a broken model, empty slots and repeated downloads, and with
    group counts that ``unroll`` does not divide."""
    from cbo_jax.federated.aggregation import consensus_by_model

    rng = np.random.default_rng(0)
    n, m, d, alpha = 8, 4, 5, 3.0
    w = rng.normal(size=(n, d))
    w[2, 1] = np.nan  # a broken model: weight zero wherever it is downloaded
    E = rng.normal(size=(n, n))  # E[j, i]: energy of model i on agent j's data
    E[5, 0] = np.nan  # a non-finite energy of one pair
    idx = rng.integers(0, n, (n, m))
    idx[1] = [2, 2, 2, 2]  # agent 1 downloaded only the broken model: it keeps its own
    idx[0] = [6, 6, 7, 0]  # a model downloaded twice counts twice
    valid = rng.random((n, m)) < 0.8
    valid[:2] = True
    with enable_x64(True):
        params = {"w": jnp.asarray(w), "id": jnp.arange(n, dtype=jnp.float64)}

        def group_energy(theta, agents):
            return jnp.asarray(E)[agents, theta["id"].astype(jnp.int32)]

        res = consensus_by_model(group_energy, params, jnp.asarray(idx), (jnp.arange(n),), alpha=alpha,
                                 group=group, valid=jnp.asarray(valid), unroll=unroll)
        e = np.where(valid, E[np.arange(n)[:, None], idx], np.inf)
        out, weights, self_w, fallback = reference(w, idx, e, None, alpha, False)
        np.testing.assert_allclose(np.asarray(res.weights), weights, rtol=1e-12, atol=1e-300)
        np.testing.assert_array_equal(np.asarray(res.fallback), fallback)
        np.testing.assert_array_equal(np.asarray(res.self_weight), self_w)
        np.testing.assert_allclose(np.asarray(res.consensus["w"])[~np.isnan(w).any(1)], out[~np.isnan(w).any(1)],
                                   rtol=1e-12, atol=1e-12)
        assert fallback[1] and not fallback.all()
        np.testing.assert_array_equal(np.asarray(res.loss)[1], np.inf)  # the broken model's loss
        own = np.asarray(res.own_loss)
        np.testing.assert_array_equal(np.isnan(own), np.isnan(w).any(1) | np.isnan(np.diag(E)))
        np.testing.assert_allclose(own[~np.isnan(own)], np.diag(E)[~np.isnan(own)], rtol=1e-15)


@pytest.mark.parametrize("reduction", ["mean", pytest.param("sum_of_batch_means", marks=pytest.mark.slow)])
def test_fedcbo_by_model_equals_by_agent_up_to_rounding(reduction):
    """FedCBO's two evaluation orders give the same step up to float32 rounding: the
    losses, the weights, the fallbacks and the consensus points, with a broken agent and
    empty slots (ragged sample counts, a last mini-batch shorter than the batch)."""
    from cbo_jax.federated.aggregation import consensus_by_model
    from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, group_loss, loss_energy
    from cbo_jax.federated.local import LocalSGDConfig
    from cbo_jax.models import init_population, mlp_mnist

    model = mlp_mnist(hidden=(6,), num_classes=3, input_shape=(8,))
    rng = np.random.default_rng(2)
    n, m, s = 9, 4, 11
    params = init_population(model, jax.random.key(0), n)
    params = jax.tree_util.tree_map(lambda a: a.at[3].set(jnp.nan) if a.ndim == 3 else a, params)
    idx = jnp.asarray(np.stack([rng.choice(np.delete(np.arange(n), j), m, replace=False) for j in range(n)]), jnp.int32)
    valid = jnp.asarray(rng.random((n, m)) < 0.8)
    x = jnp.asarray(rng.normal(size=(n, s, 8)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, (n, s)), jnp.int32)
    c = jnp.asarray(rng.integers(0, s + 1, n), jnp.int32)
    cfg = FedCBOConfig(M=m, alpha=5.0, loss_reduction=reduction, local=LocalSGDConfig(batch_size=4))
    a = jax.jit(lambda p: consensus_downloads(loss_energy(model, cfg), p, idx, p, (x, y, c), alpha=cfg.alpha,
                                              chunk=2, valid=valid))(params)
    for group in (1, 3):
        b = jax.jit(lambda p: consensus_by_model(group_loss(model, cfg), p, idx, (x, y, c), alpha=cfg.alpha,
                                                 group=group, valid=valid))(params)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            u, v = np.asarray(u), np.asarray(v)
            np.testing.assert_array_equal(np.isnan(u), np.isnan(v))
            np.testing.assert_array_equal(np.isinf(u), np.isinf(v))
            ok = np.isfinite(u)
            np.testing.assert_allclose(v[ok], u[ok], rtol=2e-5, atol=2e-6)
        assert np.isinf(np.asarray(a.loss)).any() and np.isnan(np.asarray(a.own_loss)[3])


def test_by_model_rejects_a_bad_unroll():
    from cbo_jax.federated.aggregation import consensus_by_model

    params = {"w": jnp.zeros((3, 2))}
    with pytest.raises(ValueError, match="unroll must be >= 1"):
        consensus_by_model(lambda t, a: jnp.zeros(a.shape[0]), params, jnp.zeros((3, 1), jnp.int32),
                           (jnp.arange(3),), alpha=1.0, unroll=0)


@pytest.mark.parametrize("candidates, match", [((), "non-empty"), ((0, -2), ">= 1"), ((4, 2.5), "integers"),
                                               ((True,), "integers")])
def test_eval_chunk_for_budget_refuses_bad_candidates(candidates, match):
    """``candidates=()`` or only chunks below 1 failed with Python's "min() arg is an empty
    sequence" after the loop (0 and negatives were skipped without a word), and 2.5 was
    silently tried as 2. Checked before anything is built or compiled."""
    from cbo_jax import models
    from cbo_jax.federated.algorithms import FedCBOConfig
    from cbo_jax.federated.algorithms.base import AgentData
    from cbo_jax.federated.memory import eval_chunk_for_budget

    data = AgentData(jnp.zeros((4, 3, 2)), jnp.zeros((4, 3), jnp.int32), jnp.full((4,), 3, jnp.int32))
    model = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2,))
    with pytest.raises(ValueError, match=f"candidates.*{match}"):
        eval_chunk_for_budget(model, FedCBOConfig(M=2), data, 1e9, candidates=candidates)


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).
#
# Mutation-testing gaps in the consensus kernel (cbo_jax.federated.aggregation).
#
# Each test checks one branch of :func:`consensus_downloads` against a float64 NumPy reference
# on a toy energy (no network), so it runs in well under a second.

def _toy_energy(models, theta_j, target, own_e):
    """E_j^i = ||θ_i - target_j||², the agent's own energy given as data (own_e)."""
    e = jnp.sum((models["w"] - target[None, :]) ** 2, axis=1)
    return Energy(e, e, own_e, own_e)


@pytest.mark.reference
@pytest.mark.parametrize("self_largest", [False, True])
def test_include_self_with_self_largest_caps_the_own_energy_at_the_lowest_download(self_largest):
    """FedCB²O reference-code form (FedCB2OConfig.self_largest): with
    ``include_self`` the own model enters eq. (3.13)'s average with energy
    ``min(min_i E_j^i, E_j^own)`` when ``self_largest`` (so it gets the largest weight), else
    with ``E_j^own``. Guards the ``jnp.minimum`` in ``_weigh`` (a mutant dropping it survived
    the default suite)."""
    rng = np.random.default_rng(0)
    n, m, d, alpha = 5, 3, 2, 1.5
    w = rng.normal(size=(n, d))
    target = rng.normal(size=(n, d))
    own_e = np.full(n, 4.0)  # larger than every download's energy below: the cap matters
    idx = np.array([[(j + k + 1) % n for k in range(m)] for j in range(n)])
    params = {"w": jnp.asarray(w, jnp.float32)}
    res = jax.jit(lambda p, t, o: consensus_downloads(
        _toy_energy, p, jnp.asarray(idx, jnp.int32), p, (t, o), alpha=alpha, include_self=True, chunk=2,
        self_largest=self_largest))(params, jnp.asarray(target, jnp.float32), jnp.asarray(own_e, jnp.float32))
    for j in range(n):
        e = np.sum((w[idx[j]] - target[j]) ** 2, axis=1)
        assert e.min() < own_e[j]
        e_self = min(e.min(), own_e[j]) if self_largest else own_e[j]
        all_e = np.append(e, e_self)
        mu = np.exp(-alpha * (all_e - all_e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(res.weights[j]), mu[:-1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(res.self_weight[j]), mu[-1], rtol=1e-5, atol=1e-7)
        ref = mu[:-1] @ w[idx[j]] + mu[-1] * w[j]
        np.testing.assert_allclose(np.asarray(res.consensus["w"][j]), ref, rtol=1e-5, atol=1e-6)
        if self_largest:
            assert float(res.self_weight[j]) >= float(np.max(np.asarray(res.weights[j]))) - 1e-7


@pytest.mark.reference
def test_model_by_model_consensus_gives_empty_slots_no_weight():
    """consensus_by_model (FedCBO ``eval_by="model"``): a slot with ``valid`` False (fewer
    than M participants, ProbSampling's unfilled slots) holds some other agent and must weigh
    nothing in eq. (19): m_j is the Gibbs average over the filled slots only, as in
    consensus_downloads. Float64 NumPy reference on a toy energy; a mutant dropping the
    ``valid`` mask in this path survived the default suite."""
    from cbo_jax.federated.aggregation import consensus_by_model

    rng = np.random.default_rng(1)
    n, m, d, alpha = 5, 3, 2, 2.0
    w = rng.normal(size=(n, d))
    target = rng.normal(size=(n, d))
    idx = np.array([[(j + k + 1) % n for k in range(m)] for j in range(n)])
    valid = np.ones((n, m), bool)
    valid[0, 1:] = False
    valid[2, 2] = False
    valid[3, 0] = False

    def group_energy(theta, t):  # one model's energy on a group of agents' data
        return jnp.sum((theta["w"][None, :] - t) ** 2, axis=1)

    res = jax.jit(lambda p, t, v: consensus_by_model(group_energy, p, jnp.asarray(idx, jnp.int32), (t,), alpha=alpha,
                                                     group=2, valid=v))(
        {"w": jnp.asarray(w, jnp.float32)}, jnp.asarray(target, jnp.float32), jnp.asarray(valid))
    for j in range(n):
        rows = idx[j][valid[j]]
        e = np.sum((w[rows] - target[j]) ** 2, axis=1)
        mu = np.exp(-alpha * (e - e.min()))
        mu /= mu.sum()
        np.testing.assert_allclose(np.asarray(res.weights[j])[valid[j]], mu, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(res.weights[j])[~valid[j]], 0.0)
        np.testing.assert_allclose(np.asarray(res.consensus["w"][j]), mu @ w[rows], rtol=1e-5, atol=1e-6)
