"""Robust aggregation rules (cbo_jax.federated.robust) against float64 NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax.federated as fl
from cbo_jax.federated import robust

M = 9
RNG = np.random.default_rng(0)
TREE = {"w": RNG.normal(size=(M, 3, 4)), "b": RNG.normal(size=(M, 5))}
VALID = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1], bool)
EVEN = np.array([1, 0, 0, 1, 1, 1, 1, 0, 1], bool)  # six valid rows: the median averages two


def _ref_rows(tree, valid):
    flat = np.concatenate([tree["w"].reshape(M, -1), tree["b"]], axis=1).astype(np.float64)
    return flat[valid]


def _flat(tree):
    return np.concatenate([np.asarray(tree["w"]).reshape(-1), np.asarray(tree["b"]).reshape(-1)])


def _ref_krum(rows, f, m_select):
    v = len(rows)
    d2 = ((rows[:, None, :] - rows[None, :, :]) ** 2).sum(-1)
    near = max(v - f - 2, 1)
    score = [np.sort(np.delete(d2[i], i))[:near].sum() for i in range(v)]
    return rows[np.argsort(score)[:m_select]].mean(0)


def _ref_trimmed(rows, beta):
    k = int(np.floor(beta * len(rows)))
    s = np.sort(rows, axis=0)
    return s[k:len(rows) - k].mean(0)


def _f32(tree):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), tree)


@pytest.mark.parametrize("valid", [None, VALID, EVEN])
def test_median_and_trimmed_mean_match_numpy(valid):
    v = np.ones(M, bool) if valid is None else valid
    rows = _ref_rows(TREE, v)
    np.testing.assert_allclose(_flat(robust.median(_f32(TREE), valid)), np.median(rows, axis=0), rtol=1e-5, atol=1e-6)
    for beta in (0.0, 0.1, 0.25, 0.4):
        np.testing.assert_allclose(_flat(robust.trimmed_mean(_f32(TREE), beta, valid)), _ref_trimmed(rows, beta),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("f, m_select", [(0, 1), (2, 1), (2, 3), (5, 1)])
def test_krum_matches_numpy(f, m_select):
    rows = _ref_rows(TREE, VALID)
    np.testing.assert_allclose(_flat(robust.krum(_f32(TREE), f, VALID, m_select)), _ref_krum(rows, f, m_select),
                               rtol=1e-5, atol=1e-5)


def test_outliers_and_nonfinite_rows():
    """A far-away attacker moves the mean but neither the median nor Krum; a NaN row is left out."""
    honest = RNG.normal(size=(8, 6))
    tree = {"p": jnp.asarray(np.concatenate([honest, np.full((2, 6), 100.0), np.full((1, 6), np.nan)]), jnp.float32)}
    med = np.asarray(robust.median(tree)["p"])
    np.testing.assert_allclose(med, np.median(np.concatenate([honest, np.full((2, 6), 100.0)]), axis=0), rtol=1e-5)
    assert np.abs(med).max() < 3
    chosen = np.asarray(robust.krum(tree, f=2)["p"])
    assert any(np.allclose(chosen, h) for h in honest)
    mean, ok = robust.aggregate("mean", tree)
    assert bool(ok) and np.all(np.asarray(mean["p"]) > 15)  # the mean is dragged away
    none, ok = robust.aggregate("median", tree, valid=np.zeros(11, bool))
    assert not bool(ok) and np.all(np.asarray(none["p"]) == 0)


def test_rules_jit_and_vmap_over_agents():
    stacked = {"p": jnp.asarray(RNG.normal(size=(4, M, 3)), jnp.float32)}
    out = jax.jit(jax.vmap(lambda t: robust.aggregate("trimmed_mean", t, beta=0.2)[0]))(stacked)
    for j in range(4):
        np.testing.assert_allclose(np.asarray(out["p"][j]), _ref_trimmed(np.asarray(stacked["p"][j], np.float64), 0.2),
                                   rtol=1e-5, atol=1e-6)


def test_exported_and_bad_input():
    assert fl.median is robust.median and fl.trimmed_mean is robust.trimmed_mean and fl.krum is robust.krum
    with pytest.raises(ValueError, match="beta"):
        robust.trimmed_mean(_f32(TREE), 0.5)
    with pytest.raises(ValueError, match="f"):
        robust.krum(_f32(TREE), -1)
    with pytest.raises(ValueError, match="rule"):
        robust.aggregate("mode", _f32(TREE))


@pytest.mark.parametrize("m", [5, robust.RANK_MAX, robust.RANK_MAX + 3])
def test_ranks_and_sort_give_the_same_order_statistics(m):
    """Up to RANK_MAX rows the order statistics come from pairwise ranks, above it from a sort:
    both equal NumPy's, with repeated values (ties) and invalid rows."""
    rng = np.random.default_rng(m)
    a = rng.integers(-3, 4, size=(m, 7)).astype(np.float32)  # many ties
    valid = rng.random(m) > 0.3
    valid[:2] = True
    rows = a[valid].astype(np.float64)
    np.testing.assert_allclose(np.asarray(robust.median(jnp.asarray(a), valid)), np.median(rows, axis=0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(robust.trimmed_mean(jnp.asarray(a), 0.2, valid)), _ref_trimmed(rows, 0.2),
                               rtol=1e-6, atol=1e-6)
