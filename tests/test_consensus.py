"""Consensus kernels against float64 NumPy references and their limits."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj
from cbo_jax import consensus

# Not from _stack: this module runs against the installed wheel without the test helpers (.ci/wheel_check.sh).
if hasattr(jax, "enable_x64"):
    enable_x64 = jax.enable_x64
else:  # pragma: no cover - JAX < 0.8
    from jax.experimental import enable_x64


def np_consensus(x, e, alpha):
    """Float64 reference: exp(-α E) normalised, with the usual max-shift."""
    x = np.asarray(x, np.float64)
    e = np.asarray(e, np.float64)
    logw = -alpha * (e - e.min())
    w = np.exp(logw - logw.max())
    w /= w.sum()
    return w @ x, w


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alpha", [0.0, 0.3, 3.0, 30.0])
def test_consensus_point_matches_float64_numpy(seed, alpha):
    rng = np.random.default_rng(seed)
    n, d = rng.integers(2, 200), rng.integers(1, 12)
    x = rng.normal(size=(n, d)) * 3
    e = rng.exponential(size=n) * 2
    ref, wref = np_consensus(x, e, alpha)
    m = cj.consensus_point(jnp.asarray(x, jnp.float32), jnp.asarray(e, jnp.float32), alpha)
    w = cj.consensus_weights(jnp.asarray(e, jnp.float32), alpha)
    np.testing.assert_allclose(np.asarray(w), wref, rtol=2e-4, atol=1e-7)
    np.testing.assert_allclose(np.asarray(m), ref, rtol=1e-4, atol=1e-5)


def test_alpha_zero_is_plain_mean_and_large_alpha_is_argmin():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 4)).astype(np.float32)
    e = rng.uniform(0.0, 10.0, size=50).astype(np.float32)
    np.testing.assert_allclose(cj.consensus_point(x, e, 0.0), x.mean(0), rtol=1e-5, atol=1e-6)
    for alpha in (1e6, 1e9, 1e12):
        np.testing.assert_array_equal(np.asarray(cj.consensus_point(x, e, alpha)), x[np.argmin(e)])


def test_extreme_alpha_and_energy_range_stay_finite_and_exact():
    # Energies spanning 1e-8 .. 1e8; alpha up to 1e12: the naive exp(-αE) underflows to
    # 0/0 for every particle, the log-space kernel must not.
    e64 = np.logspace(-8, 8, 33)
    rng = np.random.default_rng(2)
    rng.shuffle(e64)
    x64 = rng.normal(size=(33, 3))
    for alpha in (1.0, 1e4, 1e8, 1e12):
        with np.errstate(under="ignore", over="ignore", invalid="ignore"):
            naive = np.exp(-alpha * e64.astype(np.float32))
        w = np.asarray(cj.consensus_weights(jnp.asarray(e64, jnp.float32), alpha))
        m = np.asarray(cj.consensus_point(jnp.asarray(x64, jnp.float32), jnp.asarray(e64, jnp.float32), alpha))
        assert np.all(np.isfinite(w)) and np.all(np.isfinite(m))
        ref_m, ref_w = np_consensus(x64, e64, alpha)
        np.testing.assert_allclose(w, ref_w, atol=1e-6)
        np.testing.assert_allclose(m, ref_m, rtol=1e-5, atol=1e-6)
        if alpha == 1e12:
            assert naive.sum() == 0.0  # the raw form would divide 0 by 0 here
    # Large energies times large alpha overflow float32 products: still exact.
    e = jnp.asarray([1e8, 3e7, 5e7], jnp.float32)
    w = cj.consensus_weights(e, 1e12)
    np.testing.assert_array_equal(np.asarray(w), [0.0, 1.0, 0.0])


def test_nonfinite_and_masked_agents_get_zero_weight():
    x = jnp.asarray([[1.0, 1.0], [np.nan, 5.0], [3.0, 3.0], [100.0, 100.0]])
    e = jnp.asarray([1.0, np.nan, 1.0, -np.inf])  # -inf energy would win naively
    m = cj.consensus_point(x, e, 1.0, mask=jnp.asarray([True, True, True, True]))
    np.testing.assert_allclose(np.asarray(m), [2.0, 2.0])
    m2 = cj.consensus_point(x, jnp.asarray([1.0, 0.0, 1.0, 0.0]), 1.0, mask=jnp.asarray([True, False, True, False]))
    np.testing.assert_allclose(np.asarray(m2), [2.0, 2.0])


def test_batched_energies_give_one_consensus_per_row():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 5)).astype(np.float32)
    e = rng.uniform(size=(4, 30)).astype(np.float32)
    alphas = np.array([0.0, 1.0, 10.0, 100.0], np.float32)
    m = np.asarray(cj.consensus_point(x, e, alphas))
    for k in range(4):
        np.testing.assert_allclose(m[k], np_consensus(x, e[k], alphas[k])[0], rtol=1e-4, atol=1e-5)


def test_pytree_population_consensus_matches_flat():
    rng = np.random.default_rng(4)
    tree = {"w": rng.normal(size=(20, 3, 2)).astype(np.float32), "b": rng.normal(size=(20, 2)).astype(np.float32)}
    e = rng.uniform(size=20).astype(np.float32)
    m = cj.consensus_point(tree, e, 2.0)
    flat, unravel = cj.population.ravel(tree)
    mf = cj.consensus_point(flat, e, 2.0)
    back = unravel(mf[None])
    np.testing.assert_allclose(np.asarray(m["w"]), np.asarray(back["w"][0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m["b"]), np.asarray(back["b"][0]), rtol=1e-6)


@pytest.mark.parametrize("method", ["dense", "gather"])
def test_subset_consensus_matches_numpy(method):
    rng = np.random.default_rng(5)
    n, m_sel, d = 12, 4, 3
    x = rng.normal(size=(n, d))
    idx = np.stack([rng.choice(np.delete(np.arange(n), j), m_sel, replace=False) for j in range(n)])
    loss = rng.uniform(size=(n, m_sel))
    alpha = 5.0
    ref = np.stack([np_consensus(x[idx[j]], loss[j], alpha)[0] for j in range(n)])
    out = consensus.subset_consensus(jnp.asarray(x, jnp.float32), jnp.asarray(idx), jnp.asarray(loss, jnp.float32), alpha, method=method)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


def test_subset_consensus_large_alpha_picks_best_download():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(8, 2)).astype(np.float32)
    idx = np.array([[j for j in range(8) if j != i] for i in range(8)])
    loss = rng.uniform(size=(8, 7)).astype(np.float32)
    out = np.asarray(consensus.subset_consensus(x, idx, loss, 1e12))
    np.testing.assert_array_equal(out, x[idx[np.arange(8), loss.argmin(1)]])


def _paper_quantile(e, beta):
    """CB²O eq. (1.5) for the empirical measure, in exact arithmetic: the k-th smallest
    finite energy, k the least integer with k / n >= β (β read as the decimal it is written as)."""
    from fractions import Fraction

    e = np.sort(e[np.isfinite(e)])
    k = max(1, -(-Fraction(str(beta)) * len(e) // 1))
    return e[int(k) - 1]


@pytest.mark.parametrize("beta", [0.1, 0.25, 0.3, 0.32, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("n", [4, 10, 101])
def test_quantile_mask_is_eq_1_5s_quantile(beta, n):
    rng = np.random.default_rng(7)
    e = rng.normal(size=(3, n)).astype(np.float32)
    mask = np.asarray(cj.quantile_mask(jnp.asarray(e), beta))
    want = np.stack([row <= _paper_quantile(row, beta) for row in e])
    np.testing.assert_array_equal(mask, want)
    k = int(np.ceil(round(beta * n, 9)))
    assert (mask.sum(-1) == k).all()  # at least ⌈β n⌉, exactly without ties
    e2 = e[0].copy()
    e2[:2] = np.nan
    mask2 = np.asarray(cj.quantile_mask(jnp.asarray(e2), beta))
    assert not mask2[:2].any()
    np.testing.assert_array_equal(mask2[2:], e2[2:] <= _paper_quantile(e2, beta))
    if beta == 0.5:  # where the pinned CB²O runs sit: the same set as NumPy's linear interpolation
        np.testing.assert_array_equal(mask, e <= np.quantile(e, 0.5, axis=-1, keepdims=True))


def test_quantile_mask_counts_of_the_paper_not_of_linear_interpolation():
    """N = 4, β = 0.3: eq. (1.5) keeps ⌈1.2⌉ = 2 particles (linear interpolation kept 1);
    N = 10, β = 0.3 keeps 3 (β n = 3 despite β's float32 rounding), β = 0.32 keeps 4."""
    for n, beta, k in ((4, 0.3, 2), (10, 0.3, 3), (10, 0.32, 4), (1_000_000, 0.3, 300_000)):
        e = jnp.asarray(np.random.default_rng(n).permutation(n), jnp.float32)
        assert int(jnp.sum(cj.quantile_mask(e, beta))) == k, (n, beta)
    assert not np.asarray(cj.quantile_mask(jnp.asarray([np.nan, np.inf]), 0.5)).any()


def test_effective_sample_size_limits():
    e = jnp.asarray(np.random.default_rng(8).uniform(size=64), jnp.float32)
    assert float(consensus.effective_sample_size(e, 0.0)) == pytest.approx(64.0, rel=1e-5)
    assert float(consensus.effective_sample_size(e, 1e9)) == pytest.approx(1.0, rel=1e-5)


def test_quantile_mask_respects_its_mask_argument():
    """The quantile is taken over the masked-in agents only, and masked-out agents are never in
    the set (a mask that were ignored would change both)."""
    e = jnp.asarray([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 200.0])
    keep = jnp.asarray([False, False, True, True, True, True, True, True])
    got = np.asarray(cj.quantile_mask(e, 0.5, keep))
    q = np.quantile(np.asarray(e)[np.asarray(keep)], 0.5)  # 4.5 over the kept agents, not 3.5 over all
    np.testing.assert_array_equal(got, np.asarray(keep) & (np.asarray(e) <= q))
    assert got.tolist() == [False, False, True, True, True, False, False, False]


def _np_subset(x, idx, loss, alpha, keep):
    """Float64 reference for subset_consensus: only the downloads with ``keep`` count."""
    out = []
    for j in range(idx.shape[0]):
        k = keep[j]
        out.append(np_consensus(x[idx[j][k]], loss[j][k], alpha)[0])
    return np.stack(out)


@pytest.mark.parametrize("method", ["dense", "gather"])
def test_subset_consensus_mask_and_nonfinite_models_in_float64(method):
    """Both exclusions at once, in float64 to 1e-12: a non-finite model (row 3) weighs nothing
    wherever it was downloaded, and ``mask=False`` drops a download; the weights are not
    rounded through float32 on the way (mutation testing found both unguarded)."""
    rng = np.random.default_rng(11)
    n, m_sel, d = 10, 4, 3
    x = rng.normal(size=(n, d))
    x[3, 1] = np.nan
    idx = np.stack([np.r_[3, rng.choice(np.setdiff1d(np.arange(n), [j, 3]), m_sel - 1, replace=False)]
                    for j in range(n)])
    loss = rng.uniform(size=(n, m_sel))
    mask = np.ones((n, m_sel), bool)
    mask[:, 1] = False
    keep = mask & np.isfinite(x[idx]).all(-1)
    ref = _np_subset(x, idx, loss, 2.0, keep)
    with enable_x64():
        out = consensus.subset_consensus(jnp.asarray(x), jnp.asarray(idx), jnp.asarray(loss), 2.0,
                                         mask=jnp.asarray(mask), method=method)
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)
        no_mask = consensus.subset_consensus(jnp.asarray(x), jnp.asarray(idx), jnp.asarray(loss), 2.0, method=method)
        np.testing.assert_allclose(np.asarray(no_mask), _np_subset(x, idx, loss, 2.0, np.isfinite(x[idx]).all(-1)),
                                   rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="dense.*gather"):
        consensus.subset_consensus(jnp.asarray(x, jnp.float32), jnp.asarray(idx), jnp.asarray(loss, jnp.float32),
                                   2.0, method="sparse")


def test_effective_sample_size_mask_and_batch():
    """With a mask, J_eff counts the masked-in agents only; a batch of rows gives one J_eff per row."""
    e = jnp.zeros((2, 6))
    mask = jnp.asarray([[True] * 6, [True, True, False, False, False, False]])
    np.testing.assert_allclose(np.asarray(consensus.effective_sample_size(e, 1.0, mask)), [6.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(consensus.effective_sample_size(e, 1.0)), [6.0, 6.0], rtol=1e-6)


def test_weights_at_the_limits_of_alpha_are_finite():
    """α = ∞ (a Multiply schedule without a maximum overflows float32) is the arg-min, ties
    shared; α = 0 is uniform also when the energy spread overflows float32 (∞ · 0 and 0 · ∞
    are NaN in a plain product). The streaming kernel agrees."""
    e = jnp.asarray([1.0, 0.0, 3.0, 0.0], jnp.float32)
    np.testing.assert_array_equal(np.asarray(cj.consensus_weights(e, jnp.inf)), [0, 0.5, 0, 0.5])
    huge = jnp.asarray([-3e38, 3e38], jnp.float32)  # E - E_min = inf in float32
    np.testing.assert_array_equal(np.asarray(cj.consensus_weights(huge, 0.0)), [0.5, 0.5])
    x = jnp.arange(8.0, dtype=jnp.float32).reshape(4, 2)
    for alpha, energy, want in ((jnp.inf, e, [4.0, 5.0]), (0.0, jnp.concatenate([huge, huge]), [3.0, 4.0])):
        np.testing.assert_array_equal(np.asarray(cj.consensus_point(x, energy, alpha)), want)
        np.testing.assert_array_equal(np.asarray(consensus.streaming_consensus_point(x, energy, alpha, chunk=2)), want)


def test_weighted_average_normalises_any_positive_total():
    """``Σ w_i x_i / Σ w_i`` for tiny weights too (a clamp of the total at 1e-30 scaled the
    result down); all-zero weights give zeros."""
    from cbo_jax import population as pop
    x = jnp.asarray([[1.0], [3.0]], jnp.float32)
    np.testing.assert_allclose(np.asarray(pop.weighted_average(x, jnp.asarray([1e-33, 1e-33], jnp.float32))), [2.0])
    np.testing.assert_array_equal(np.asarray(pop.weighted_average(x, jnp.zeros(2, jnp.float32))), [0.0])
    rows = pop.weighted_average(x, jnp.asarray([[1e-36, 0.0], [0.0, 0.0]], jnp.float32))  # (K, N) weights
    np.testing.assert_allclose(np.asarray(rows), [[1.0], [0.0]])


def test_quantile_mask_refuses_a_beta_outside_its_range_or_one_per_row():
    e = jnp.arange(6.0)
    for bad in (0.0, 2.0, -0.5):
        with pytest.raises(ValueError, match=r"beta must lie in \(0, 1\]"):
            cj.quantile_mask(e, bad)
    with pytest.raises(ValueError, match="one number for every row"):
        cj.quantile_mask(jnp.stack([e, e]), jnp.asarray([0.5, 0.5]))
    np.testing.assert_array_equal(np.asarray(cj.quantile_mask(e, 0.5)), [True, True, True, False, False, False])


def test_integer_energies_keep_a_fractional_alpha():
    """Integer energies (an objective that counts) cast α to their integer dtype: α = 0.5 became 0
    and the weights uniform; the streaming kernel failed with a scan carry dtype error."""
    e = jnp.array([0, 1, 2])
    ef = e.astype(jnp.float32)
    np.testing.assert_allclose(consensus.consensus_weights(e, 0.5), consensus.consensus_weights(ef, 0.5), rtol=1e-6)
    np.testing.assert_allclose(consensus.effective_sample_size(e, 0.5), consensus.effective_sample_size(ef, 0.5),
                               rtol=1e-6)
    x = jnp.eye(3)
    want = consensus.consensus_point(x, ef, 0.5)
    np.testing.assert_allclose(consensus.consensus_point(x, e, 0.5), want, rtol=1e-6)
    np.testing.assert_allclose(consensus.streaming_consensus_point(x, e, 0.5, chunk=1), want, rtol=1e-6)
    # a CBO run on an integer-valued objective sees the same α
    f = lambda z: jnp.floor(10 * jnp.sum(z ** 2, axis=-1)).astype(jnp.int32)  # noqa: E731
    x0 = np.random.default_rng(0).normal(size=(6, 2)).astype(np.float32)
    dyn = cj.cbo(f, alpha=0.5, sigma1=0.0)
    st = dyn.init(jnp.asarray(x0), jax.random.key(0))
    wf = consensus.consensus_point(jnp.asarray(x0), f(jnp.asarray(x0)).astype(jnp.float32), 0.5)
    np.testing.assert_allclose(st.consensus, wf, rtol=1e-5)


def test_low_precision_energies_and_integer_rows():
    """bfloat16 energies were weighed in bfloat16: at N = 1024 equal energies the streaming
    denominator stopped at 256 (consensus 3.98 for rows near 1) and the plain weights did not
    sum to one; they are promoted to float32. Integer rows gave a truncated mean (weights cast
    to int: 0) and are refused."""
    from cbo_jax import population as pop
    from cbo_jax.consensus import consensus_point, streaming_consensus_point

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(1.0, 0.1, (1024, 2)), jnp.bfloat16)
    e = jnp.asarray(rng.uniform(0, 1, 1024), jnp.bfloat16)
    w = np.exp(-np.asarray(e, np.float64))
    ref = (w[:, None] * np.asarray(x, np.float64)).sum(0) / w.sum()
    for m in (consensus_point(x, e, 1.0), streaming_consensus_point(x, e, 1.0, chunk=1),
              streaming_consensus_point(x, e, 1.0, chunk=64)):
        assert m.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(m, np.float64), ref, rtol=1e-2)  # bfloat16's own rounding
    xi = jnp.array([[0, 0], [2, 4], [4, 8], [6, 2]], jnp.int32)
    for call in (lambda: consensus_point(xi, jnp.ones(4), 1.0), lambda: streaming_consensus_point(xi, jnp.ones(4), 1.0,
                                                                                                   chunk=2),
                 lambda: pop.weighted_average(xi, jnp.ones(4))):
        with pytest.raises(ValueError, match="needs floating rows.*int32"):
            call()


def test_alpha_derivative_at_alpha_zero_is_minus_the_uniform_covariance():
    """d m / dα at α = 0 is -Cov(x, E) under uniform weights (the α = 0 mask also cut this
    derivative to 0); the 0·∞ limits keep finite values and gradients."""
    with enable_x64(True):
        x = jnp.asarray([[0.0, 0.0], [1.0, 2.0], [2.0, 2.0]])
        e = jnp.asarray([1.0, 2.0, 3.0])
        grad = np.asarray(jax.jacobian(lambda a: cj.consensus_point(x, e, a))(0.0))
        xn, en = np.asarray(x), np.asarray(e)
        cov = ((xn - xn.mean(0)) * (en - en.mean())[:, None]).mean(0)
        np.testing.assert_allclose(grad, -cov, rtol=1e-12)
        # the 0 · ∞ limits keep their values: α = ∞ (the best agent alone), and at α = 0 an
        # energy spread beyond the float range (finite energies whose difference overflows)
        np.testing.assert_allclose(np.asarray(cj.consensus_point(x, e, jnp.inf)), xn[0])
        spread = jnp.asarray([-1e308, 1e308])
        np.testing.assert_allclose(np.asarray(cj.consensus_point(x[:2], spread, 0.0)), xn[:2].mean(0))


@pytest.mark.parametrize("streaming", [False, True])
def test_consensus_point_names_energies_alpha_and_mask_of_the_wrong_shape(streaming):
    """An energy of length 1 for N = 5 broadcast to the plain mean; an α of shape (3,) with one
    row of energies gave a (3, 3) result; a 0/1 float mask failed in ``&``. The streaming
    form (one pass over chunks of agents) names them the same way."""
    consensus_point = (functools.partial(consensus.streaming_consensus_point, chunk=5) if streaming
                       else consensus.consensus_point)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    e = np.arange(5.0, dtype=np.float32)
    for bad in (e[:1], e[:4], np.zeros((2, 2, 5), np.float32)):
        with pytest.raises(ValueError, match=r"energy must be \(N,\) or \(K, N\) for the population's N = 5 agents"):
            consensus_point(x, bad, 1.0)
    with pytest.raises(ValueError, match=r"alpha must be a scalar or one value per row of the energies, shape \(\)"):
        consensus_point(x, e, np.ones(3))
    with pytest.raises(ValueError, match=r"mask must be boolean.*mask.astype\(bool\)"):
        consensus_point(x, e, 1.0, mask=np.array([1.0, 0, 1, 0, 1]))
    assert consensus_point(x, np.stack([e, e]), np.ones(2)).shape == (2, 3)  # K points, one alpha each
    masked = consensus_point(x, e, 1.0, mask=np.array([True, False, True, False, True]))
    np.testing.assert_allclose(masked, consensus.consensus_point(x[::2], e[::2], 1.0), rtol=1e-6, atol=1e-7)


def test_bad_host_inputs_to_the_consensus_functions_are_refused():
    """Found by feeding them bad input: a negative α returned the *worst* particle, NaN a NaN
    point; a 0/1/2 integer mask was ANDed bitwise (2 & 1 == 0 dropped an agent, and the result
    was an int array); an index past N was dropped by the dense scatter (weights no longer
    summing to 1), -1 wrapped to the last agent, and the gather method gave NaN."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 2)), jnp.float32)
    e = jnp.arange(5.0)
    for alpha in (-100.0, float("nan"), np.array([1.0, -1.0])):
        with pytest.raises(ValueError, match="alpha must be >= 0"):
            cj.consensus_point(x, jnp.stack([e, e]) if np.ndim(alpha) else e, alpha)
    np.testing.assert_allclose(np.asarray(cj.consensus_point(x, e, np.float32(1e6))), np.asarray(x[0]))
    with pytest.raises(ValueError, match="mask must be boolean.*astype\\(bool\\)"):
        cj.quantile_mask(e, 0.5, mask=jnp.array([1, 0, 2, 1, 1]))
    loss = jnp.ones((2, 2))
    for idx in ([[0, 7], [1, 2]], [[0, 1], [1, -1]]):
        for method in ("dense", "gather"):
            with pytest.raises(ValueError, match=r"idx must index the population's N = 5 agents, in \[0, 5\)"):
                cj.subset_consensus(x, jnp.array(idx), loss, 10.0, method=method)
    with pytest.raises(ValueError, match="idx must be integer indices of the shape of loss"):
        cj.subset_consensus(x, jnp.array([[0.0, 1.0], [1.0, 2.0]]), loss, 10.0)
    with pytest.raises(ValueError, match="idx must be integer indices of the shape of loss"):
        cj.subset_consensus(x, jnp.array([[0, 1, 2], [1, 2, 3]]), loss, 10.0)
    # traced arguments cannot be checked and still run (the federated round's case)
    out = jax.jit(lambda i, a: cj.subset_consensus(x, i, loss, a))(jnp.array([[0, 1], [1, 2]]), 10.0)
    assert out.shape == (2, 2) and np.isfinite(np.asarray(out)).all()


def test_consensus_of_many_agents_is_rounded_like_float32_not_summed_in_one_run():
    """At large N one consensus point is summed in blocks, not by XLA:CPU's matrix-vector
    kernel, whose error grows with N (1.2e-5 off at N = 2**18 here, 1.1e-2 at 1e7 in
    benchmarks/consensus_sum.py). Checked for 1-D and (1, N) energies, a leaf with trailing axes, bfloat16 rows,
    runs under vmap, the streaming form with a chunk of more than 2**16 rows, and an N with no
    divisor between 256 and 8192 (the loop over blocks and a dot of the rows left)."""
    tol = 1e-6  # the matrix-vector kernel: 1.2e-5 at N = 2**18, 6e-6 at 2 * 65537

    def close(got, want):
        err = np.abs(np.asarray(got, np.float64) - want).max()
        assert err < tol, err

    rng = np.random.default_rng(0)
    for n in (1 << 18, 2 * 65537):
        x = rng.normal(size=(n, 3)) + 1.0  # rows of one sign: a running sum's error is not cancelled
        e = 0.5 * np.sum((x - 1.0) ** 2, axis=1)
        ref, _ = np_consensus(x, e, 1.0)
        x32, e32 = jnp.asarray(x, jnp.float32), jnp.asarray(e, jnp.float32)
        close(cj.consensus_point(x32, e32, 1.0), ref)
        close(cj.consensus_point(x32, e32[None], 1.0)[0], ref)
        close(cj.consensus_point({"w": x32.reshape(n, 1, 3)}, e32, 1.0)["w"][0], ref)
        runs = jax.vmap(lambda s: cj.consensus_point(x32 + s, e32, 1.0))(jnp.arange(2, dtype=jnp.float32))
        close(runs[1], ref + 1.0)
    close(consensus.streaming_consensus_point(x32, e32, 1.0, chunk=n // 2), ref)
    # bfloat16 rows are summed in float32 and rounded once: within bfloat16's half ulp of [1, 2)
    low = cj.consensus_point(x32.astype(jnp.bfloat16), e32, 1.0)
    ref_low, _ = np_consensus(np.asarray(x32.astype(jnp.bfloat16).astype(jnp.float32)), e, 1.0)
    assert np.abs(np.asarray(low, np.float64) - ref_low).max() <= 2.0**-8



def test_blocks_of_many_agents_divide_the_rows_for_any_n():
    """The split of N rows into g groups of blocks: g divides N, and either a block divides a group
    (between 256 and 8192 rows) or the groups are longer than a block (the loop). N = 720720 is
    divisible by every device count up to 16: one row a group crashed the loop before."""
    from cbo_jax import population as pop

    for n in (65537, 72008, 100_000, 131_074, 1 << 20, 720_720, 2_162_160, 10_000_000, 10_000_003,
              *np.random.default_rng(0).integers(65_537, 10**7, 200).tolist()):
        g, b = pop._blocks(n)
        assert n % g == 0, (n, g)
        if b is None:
            assert n // g > 8192, (n, g)
        else:
            assert 256 <= b <= 8192 and (n // g) % b == 0, (n, g, b)
    assert pop._blocks(10_000_000) == (80, 6250)  # 1600 blocks: a multiple of every device count dividing 80
    x = np.random.default_rng(1).normal(size=(720_720, 2)) + 1.0
    e = 0.5 * np.sum((x - 1.0) ** 2, axis=1)
    ref, _ = np_consensus(x, e, 1.0)
    m = cj.consensus_point(jnp.asarray(x, jnp.float32), jnp.asarray(e, jnp.float32), 1.0)
    assert np.abs(np.asarray(m, np.float64) - ref).max() < 1e-6

_SHARDED_SUM = r"""
import json, os, re
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import cbo_jax as cj
from cbo_jax import population as pop

mesh = Mesh(np.array(jax.devices()), ("agents",))
out = {}
for n in (100_000, 8 * 9001):  # blocks of a divisor; 9001 is prime: the loop over blocks
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(n, 3)) + 1.0).astype(np.float32)
    e = (0.5 * np.sum((x - 1.0) ** 2, axis=1)).astype(np.float32)
    xs = jax.device_put(x, NamedSharding(mesh, P("agents", None)))
    es = jax.device_put(e, NamedSharding(mesh, P("agents")))
    f = jax.jit(lambda x, e: cj.consensus_point(x, e, 1.0))
    hlo = f.lower(xs, es).compile().as_text()
    w = np.exp(-(e.astype(np.float64) - e.min()))
    ref = (w / w.sum()) @ x.astype(np.float64)
    out[str(n)] = {"blocks": list(pop._blocks(n)),
                   "moved": sorted(set(re.findall(r"all-gather|all-to-all|collective-permute", hlo))),
                   "error": float(np.abs(np.asarray(f(xs, es), np.float64) - ref).max())}
print(json.dumps(out))
"""


def test_consensus_of_many_sharded_agents_is_summed_where_the_rows_are():
    """On 8 devices (agent axis sharded), the blocks follow the shards: no rows are gathered or
    moved between devices (blocks across the devices' boundaries, as 125 blocks of 8000 rows
    for N = 1e6 were, made XLA gather the whole population), and the sum stays accurate."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _SHARDED_SUM], env=dict(os.environ, JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for n, r in out.items():
        assert r["moved"] == [], (n, r)  # blocks across the devices: the loop's rows were gathered
        assert r["error"] < 3e-6, (n, r)  # (one dot, split over 8 devices, is as close: 1.1e-6, 1.2e-6)
    assert out["100000"]["blocks"] == [80, 1250] and out["72008"]["blocks"] == [8, None]


def test_quantile_mask_checks_a_concrete_beta_of_any_kind():
    # A Python 1.5 was refused, but a NumPy or JAX 1.5 kept every agent and a 0.0 only the best one.
    e = jnp.arange(10.0)
    for beta in (1.5, np.float32(1.5), jnp.asarray(-3.0), np.float64(0.0)):
        with pytest.raises(ValueError, match=r"beta must lie in \(0, 1\]"):
            cj.quantile_mask(e, beta)
    assert int(jnp.sum(cj.quantile_mask(e, np.float32(0.3)))) == 3
    assert int(jax.jit(lambda b: jnp.sum(cj.quantile_mask(e, b)))(0.3)) == 3  # traced: not checked, as documented


def _np_consensus(x, e, alpha, keep):
    """float64 NumPy reference: Σ θ e^{-α(E - E_min)} / Σ e^{-α(E - E_min)} over the kept rows."""
    keep = keep & np.isfinite(e) & np.all(np.isfinite(x), axis=1)
    w = np.where(keep, np.exp(-alpha * np.where(keep, e - e[keep].min(), 0.0)), 0.0)
    return (w[:, None] * np.where(keep[:, None], x, 0)).sum(0) / w.sum()


def test_streaming_consensus_matches_numpy_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    e = rng.exponential(size=60) + 1e-8
    x[5, 1], e[7] = np.nan, np.inf  # non-finite agents get weight zero
    mask = rng.random(60) < 0.7
    streaming = jax.jit(consensus.streaming_consensus_point, static_argnames="chunk")
    with enable_x64(True):
        for alpha in (0.0, 3.0, 1e12):
            for keep in (None, mask):
                got = streaming(x, e, alpha, keep, chunk=12)
                ref = _np_consensus(x, e, alpha, np.ones(60, bool) if keep is None else keep)
                np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12)
        alpha = 3.0
        # K consensus points at once, and a stacked pytree
        E = np.stack([e, rng.exponential(size=60)])
        got = consensus.streaming_consensus_point(x, E, jnp.array([alpha, 1.0]), chunk=20)
        np.testing.assert_allclose(np.asarray(got), np.asarray(consensus.consensus_point(x, E, jnp.array([alpha, 1.0]))),
                                   rtol=1e-12)
        tree = {"a": x[:, :2].reshape(60, 2, 1), "b": x[:, 2:]}
        got = consensus.streaming_consensus_point(tree, e, alpha, chunk=30)
        np.testing.assert_allclose(np.concatenate([np.asarray(got["a"]).ravel(), np.asarray(got["b"])]),
                                   _np_consensus(x, e, alpha, np.ones(60, bool)), rtol=1e-12)
        # a chunk that does not divide N: the last chunk is the last 7 agents, those counted masked out
        got = consensus.streaming_consensus_point(x, e, alpha, chunk=7)
        np.testing.assert_allclose(np.asarray(got), _np_consensus(x, e, alpha, np.ones(60, bool)), rtol=1e-12)
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        consensus.streaming_consensus_point(x, e, 1.0, chunk=0)
