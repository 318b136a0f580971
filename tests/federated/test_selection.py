"""Agent selection: uniform and ε-greedy (FedCBO Remark 3), likelihood update (21)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax.federated import selection


def _distinct_others(idx):
    n = idx.shape[0]
    for j in range(n):
        assert j not in idx[j]
        assert len(set(idx[j].tolist())) == idx.shape[1]


def test_uniform_picks_distinct_others_uniformly():
    n, m = 12, 4
    counts = np.zeros((n, n))
    for s in range(300):
        idx = np.asarray(selection.draw_uniform(jax.random.key(s), n, m))
        _distinct_others(idx)
        np.add.at(counts, (np.repeat(np.arange(n), m), idx.ravel()), 1)
    off = counts[~np.eye(n, dtype=bool)]
    expected = 300 * m / (n - 1)  # 109.1, binomial sd ≈ 9.9
    assert np.all(np.abs(off - expected) < 5 * np.sqrt(expected))


@pytest.mark.parametrize("draw", ["uniform", "epsilon_greedy", "prob_sampling"])
def test_agents_draw_their_downloads_independently(draw):
    """Every agent's random downloads are a draw of its own: two agents' picks are independent.
    N = 6, M = 1, 4000 keys: agents 0 and 1 each pick one of their 5 others uniformly (ε-greedy
    with ε = 1; ProbSampling with every P equal), so they pick the same agent (one of 2..5) with
    probability 4/25 = 0.16, standard error 0.0058 over 4000 draws. One draw shared by the rows
    (every agent ranking the same noise) makes it about 2/3; the frequency tests above saw
    nothing of it, as they count each row alone."""
    n, keys = 6, 4000
    P = jnp.where(jnp.eye(n, dtype=bool), -jnp.inf, 1.0)
    one = {"uniform": lambda k: selection.draw_uniform(k, n, 1),
           "epsilon_greedy": lambda k: selection.draw_epsilon_greedy(k, P, 1, 1.0)[0],
           "prob_sampling": lambda k: selection.draw_prob_sampling(k, P, 1)}[draw]
    idx = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(5), keys)))[:, :, 0]
    assert np.all(idx != np.arange(n))
    same = np.mean(idx[:, 0] == idx[:, 1])
    assert abs(same - 4 / 25) < 5 * np.sqrt(0.16 * 0.84 / keys), same


@pytest.mark.parametrize("eps", [0.0, 0.2, 0.25, 0.45, 0.5, 1.0])  # εM = 1.6 and 3.6: floor and round differ
def test_epsilon_greedy_counts_and_top_p(eps):
    n, m = 20, 8
    rng = np.random.default_rng(0)
    P = rng.normal(size=(n, n)).astype(np.float32)
    np.fill_diagonal(P, -np.inf)
    idx, is_rand = selection.draw_epsilon_greedy(jax.random.key(1), jnp.asarray(P), m, eps)
    idx, is_rand = np.asarray(idx), np.asarray(is_rand)
    _distinct_others(idx)
    n_rand = int(np.floor(eps * m + 1e-6))  # the reference code's int(ε·M)
    assert np.all(is_rand.sum(1) == n_rand)
    for j in range(n):
        rand = idx[j][is_rand[j]]
        greedy = idx[j][~is_rand[j]]
        rest = [i for i in range(n) if i != j and i not in rand]
        top = sorted(rest, key=lambda i: -P[j, i])[: m - n_rand]
        assert sorted(greedy.tolist()) == sorted(top)


def test_round_zero_ties_are_uniform():
    n, m = 10, 3
    P = selection.init_likelihood(n)
    counts = np.zeros((n, n))
    for s in range(300):
        idx, _ = selection.draw_epsilon_greedy(jax.random.key(s), P, m, 0.0)
        np.add.at(counts, (np.repeat(np.arange(n), m), np.asarray(idx).ravel()), 1)
    off = counts[~np.eye(n, dtype=bool)]
    expected = 300 * m / (n - 1)
    assert np.all(np.abs(off - expected) < 5 * np.sqrt(expected))


def test_likelihood_update_eq21():
    P = selection.init_likelihood(4)
    idx = jnp.asarray([[1, 2], [0, 3], [3, 1], [2, 0]])
    own = jnp.asarray([1.0, 2.0, 3.0, 4.0])
    loss = jnp.asarray([[0.5, 2.0], [1.0, 1.5], [4.0, 2.0], [3.0, 5.0]])
    P2 = np.asarray(selection.update_likelihood(P, idx, loss, own))
    assert P2[0, 1] == 1.5 and P2[0, 2] == 0.0 and P2[1, 0] == 2.0 and P2[3, 0] == 0.0
    assert np.all(np.isneginf(np.diag(P2)))
    P3 = np.asarray(selection.update_likelihood(P, idx, loss, own, active=jnp.asarray([True, False, True, True])))
    assert P3[1, 0] == 1.0 and P3[0, 1] == 1.5


def test_epsilon_schedule():
    assert float(selection.epsilon_schedule(0)) == 0.5
    assert float(selection.epsilon_schedule(20)) == pytest.approx(0.3)
    assert float(selection.epsilon_schedule(100)) == pytest.approx(0.1)


def test_m_out_of_range():
    with pytest.raises(ValueError, match="1 <= M <= N - 1"):
        selection.draw_uniform(jax.random.key(0), 5, 5)
    with pytest.raises(ValueError, match="M="):
        selection.draw_epsilon_greedy(jax.random.key(0), selection.init_likelihood(5), 0, 0.5)


def test_the_m_bound_has_one_message_wherever_it_is_checked():
    """FedCBO's experiment config, the selection draws, FedCB²O's attackers and DFedAvgM's
    neighbours state ``1 <= M <= N - 1`` with one function (``_checks.downloads``): one wording."""
    from cbo_jax.experiments.federated import RotatedMNISTConfig, default_config
    from cbo_jax.federated import FedCBOConfig
    from cbo_jax.federated.attacks import attacker_selection

    rule = r"M \({}\) must be an integer with 1 <= M <= {} - 1 = 7, got M=8"
    with pytest.raises(ValueError, match=rule.format("downloads per agent", "N")):
        selection.draw_uniform(jax.random.key(0), 8, 8)
    with pytest.raises(ValueError, match=rule.format("downloads per agent", "N")):  # when the config is built
        default_config("fedcbo", data=RotatedMNISTConfig(agents=8, clusters=2), config=FedCBOConfig(M=8))
    with pytest.raises(ValueError, match=rule.format("downloads per attacker", "N")):
        attacker_selection(jax.random.key(0), np.zeros(8, int), np.arange(8) < 2, 8)


@pytest.mark.parametrize("make, match", [
    (lambda: selection.epsilon_greedy(0), "M must be >= 1"),
    (lambda: selection.epsilon_greedy(2.0), "M must be an integer"),
    (lambda: selection.uniform(True), "M must be an integer"),
    (lambda: selection.prob_sampling(-3), "M must be >= 1"),
    (lambda: selection.epsilon_greedy(3, eps0=2.0), "eps0"),
    (lambda: selection.epsilon_greedy(3, eps0=float("nan")), "eps0"),
    (lambda: selection.epsilon_greedy(3, eps_decay=-0.1), "eps_decay"),
    (lambda: selection.epsilon_greedy(3, eps_min=1.5), "eps_min"),
    (lambda: selection.epsilon_greedy(3, eps0=0.1, eps_min=0.5), r"eps_min=0.5 is above eps0=0.1"),
    (lambda: selection.prob_sampling(3, kappa=-1.0), "kappa"),
    (lambda: selection.prob_sampling(3, zeta=2.0), "zeta"),
    (lambda: selection.prob_sampling(3, zeta=0.0), "zeta"),
    (lambda: selection.init_likelihood(5, 3), "rows"),
])
def test_rule_factories_refuse_bad_hyperparameters(make, match):
    """The rule factories (the public API that FedCBOConfig also goes through) checked nothing:
    ``epsilon_greedy(0)``, ``eps0=2``, ``zeta=2`` or a NaN ε were accepted and failed (or
    ran with a meaningless ε) only inside the traced round."""
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("m, match", [(-1, "M"), (0, "M"), (6, "M"), (2.0, "M"), ("mal", "malicious")])
def test_attacker_selection_checks_m_and_the_malicious_mask(m, match):
    """``attacker_selection`` is documented to return ``(N_m, M)`` downloads: ``m=-1`` returned 5
    columns (NumPy's slice ``[:, :-1]``), ``m=6`` with 6 agents 6 columns (the attacker
    itself among them), ``m=0`` none; a mask of another length failed in a JAX gather."""
    from cbo_jax.federated import attacks

    cluster = np.array([0, 0, 0, 1, 1, 1])
    malicious = np.array([0, 0, 1, 0, 0, 1], bool)
    if m == "mal":
        m, malicious = 2, malicious[:4]
    with pytest.raises(ValueError, match=match):
        attacks.attacker_selection(jax.random.key(0), cluster, malicious, m)
    idx, valid = attacks.attacker_selection(jax.random.key(0), cluster, np.array([0, 0, 1, 0, 0, 1], bool), 5)
    assert idx.shape == valid.shape == (2, 5)


def test_an_epsilon_floor_above_its_start_is_refused():
    """``eps_min > eps0`` made ε = eps_min in every round, eps0 unused (``eps0=0`` for a greedy
    run, with the default ``eps_min=0.1``, ran with ε = 0.1). Rules that draw no ε take any."""
    from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig

    with pytest.raises(ValueError, match=r"eps_min=0.1 is above eps0=0.0"):
        FedCBOConfig(eps0=0.0)
    FedCBOConfig(eps0=0.0, eps_min=0.0)
    FedCBOConfig(eps0=0.3, eps_min=0.3, eps_decay=0.0)
    FedCBOConfig(selection="prob_sampling", eps0=0.0)
    FedCBOConfig(selection="uniform", eps0=0.0)


@pytest.mark.parametrize("eps,m,random_picks", [(0.5, 3, 1), (0.3, 3, 0), (0.7, 10, 7), (0.49, 20, 9), (1.0, 4, 4)])
def test_epsilon_greedy_random_share_is_the_floor_of_eps_m(eps, m, random_picks):
    """⌊εM⌋ random picks, the reference code's int(ε·M) (εM need not be an integer; ε = 0.7 is
    0.69999999 in float32 and still gives 7 of 10)."""
    P = selection.init_likelihood(24)
    _, is_random = selection.draw_epsilon_greedy(jax.random.key(0), P, m, jnp.float32(eps))
    assert np.asarray(is_random).sum(axis=1).tolist() == [random_picks] * 24


# ------------------------------------------------------------------------------ references (mutation testing)
# Each pins a formula that a single-point change of the library went through the other tests
# without breaking; references are closed forms, float64 NumPy or CBXpy (marker ``reference``,
# docs/development.md).

@pytest.mark.reference
def test_prob_likelihood_update_leaves_the_rows_of_non_participants():
    """FedCB²O eq. (3.12) ``P^{j,i} ← (1-ζ) P^{j,i} + ζ exp(-κ L_j^i)`` is applied only by the
    agents that took part in the round (FedCBO with ProbSampling and participation < 1,
    Algorithm 2's ``G_n``): a row with ``active`` False keeps every entry, NaN included."""
    P = np.array([[-np.inf, 0.4, np.nan, 0.2], [0.3, -np.inf, 0.6, np.nan], [0.5, 0.1, -np.inf, 0.7]], np.float32)
    idx = np.array([[1, 2], [0, 3], [3, 1]])
    loss = np.array([[0.5, 1.0], [0.2, 0.3], [0.9, 0.4]], np.float32)
    active = np.array([True, False, True])
    kappa, zeta = 2.0, 0.3
    got = np.asarray(selection.update_prob_likelihood(jnp.asarray(P), jnp.asarray(idx), jnp.asarray(loss), kappa, zeta,
                                                      active=jnp.asarray(active)))
    want = P.astype(np.float64)
    for j in np.nonzero(active)[0]:
        for t, i in enumerate(idx[j]):
            r = np.exp(-kappa * loss[j, t])
            want[j, i] = r if np.isnan(want[j, i]) else (1 - zeta) * want[j, i] + zeta * r
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
