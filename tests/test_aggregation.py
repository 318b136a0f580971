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
