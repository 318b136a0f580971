"""Populations as stacked pytrees (cbo_jax.population): padding, resizing, finiteness, weighted averages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import population as pop


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_pad_agents_mask_marks_exactly_the_real_agents():
    """Guards ``mask = arange(N_padded) < N`` (``<=`` marked the first padding row as real)."""
    x = {"a": jnp.ones((5, 2)), "b": jnp.ones((5,))}
    padded, mask = pop.pad_agents(x, 4)
    assert padded["a"].shape == (8, 2) and padded["b"].shape == (8,)
    np.testing.assert_array_equal(np.asarray(mask), np.arange(8) < 5)
    np.testing.assert_array_equal(np.asarray(padded["a"][5:]), 0.0)


@pytest.mark.reference
def test_resize_rows_fills_floats_with_fill_and_repeats_the_last_key():
    """Guards ``resize_rows``'s new rows: ``fill`` for floating leaves (not ``0``), ``False`` /
    ``0`` for bool / int, the last key repeated for key leaves."""
    keys = jax.random.split(jax.random.key(0), 3)
    tree = {"x": jnp.arange(6.0).reshape(3, 2), "b": jnp.ones(3, bool), "i": jnp.arange(3), "k": keys}
    out = pop.resize_rows(tree, 5, fill=np.nan)
    assert np.isnan(np.asarray(out["x"][3:])).all() and np.asarray(out["x"][:3]).tolist() == [[0, 1], [2, 3], [4, 5]]
    np.testing.assert_array_equal(np.asarray(out["b"]), [True] * 3 + [False] * 2)
    np.testing.assert_array_equal(np.asarray(out["i"]), [0, 1, 2, 0, 0])
    data = np.asarray(jax.random.key_data(out["k"]))
    last = np.asarray(jax.random.key_data(keys))[-1]
    np.testing.assert_array_equal(data[3], last)
    np.testing.assert_array_equal(data[4], last)


@pytest.mark.reference
def test_isfinite_rows_needs_every_leaf_finite():
    """Guards the ``&`` over leaves in ``tree_isfinite_rows`` / ``zero_nonfinite_rows``: a
    particle with a NaN in one leaf is non-finite even when another leaf is finite."""
    tree = {"a": jnp.array([[np.nan], [1.0], [2.0]]), "b": jnp.array([[1.0, 2.0], [np.inf, 0.0], [3.0, 4.0]])}
    np.testing.assert_array_equal(np.asarray(pop.tree_isfinite_rows(tree)), [False, False, True])
    clean, ok = pop.zero_nonfinite_rows(tree)
    np.testing.assert_array_equal(np.asarray(clean["b"]), [[0, 0], [0, 0], [3, 4]])


@pytest.mark.reference
def test_weighted_average_normalises_and_gives_zero_for_zero_weights():
    """Guards ``Σ w_i x_i / Σ w_i`` (rows of zero total give zeros)."""
    x = jnp.array([[1.0, 2.0], [3.0, 6.0]])
    got = np.asarray(pop.weighted_average(x, jnp.array([[1.0, 3.0], [0.0, 0.0]])))
    np.testing.assert_allclose(got, [[2.5, 5.0], [0.0, 0.0]], rtol=1e-6)
