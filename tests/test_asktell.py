"""Ask/tell (cbo_jax.ask_tell, cj.Optimizer; issue 60): the step that simulate runs, cut at the evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cbo_jax as cj

from _stack import enable_x64

F = cj.objectives.Rastrigin()
SPHERE = cj.constraints.sphere(1.0)
# Every dynamics of the CBX family, with what it needs besides the objective.
FAMILY = {
    "cbo": {}, "cbo_memory": {}, "pso": {}, "cbs": {}, "polar_cbo": {}, "adam_cbo": {}, "mirror_cbo": {},
    "drift_constrained_cbo": {"constraints": SPHERE}, "hypersurface_cbo": {},
    "reg_combination_cbo": {"constraints": SPHERE, "eps": 0.1},
}


def _x0(name="cbo", n=30, d=3, seed=0):
    x = np.random.default_rng(seed).uniform(-2, 2, (n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) if name == "hypersurface_cbo" else x


def _loop(at, x0, key, steps, f=F):
    ask, tell = jax.jit(at.ask), jax.jit(at.tell)
    state = at.start(x0, key)
    for _ in range(steps + 1):  # the first tell is the start (the energies of x0)
        x, state = ask(state)
        state = tell(state, f(x))
    return state


@pytest.mark.parametrize("name", list(FAMILY))
def test_ask_evaluate_tell_is_simulate(name):
    """float64, 10 steps: every field of the state equals simulate's up to float rounding (the
    objective evaluated outside the compiled step: energies of about 30 differ by 1e-12)."""
    make, kw = getattr(cj, name), FAMILY[name]
    with enable_x64(True):
        ref = cj.simulate(make(F, dtype="float64", **kw), _x0(name), 2, 10).state
        got = _loop(cj.ask_tell(make, dtype="float64", **kw), _x0(name), 2, 10)
    for path, a in jax.tree_util.tree_leaves_with_path(ref):
        b = got
        for k in path:
            b = getattr(b, k.name) if hasattr(k, "name") else b[k.idx]
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-12,
                                   err_msg=jax.tree_util.keystr(path))


def test_the_positions_asked_are_the_ones_told():
    at = cj.ask_tell(cj.cbo, sigma1=0.5)
    state = at.start(_x0().astype(np.float32), 0)
    x, state = at.ask(state)
    np.testing.assert_array_equal(np.asarray(x), _x0().astype(np.float32))  # the first ask: x0
    state = at.tell(state, F(x))
    x1, same = at.ask(state)
    assert same is state
    assert not np.allclose(np.asarray(x1), np.asarray(x))
    after = at.tell(state, F(x1))
    np.testing.assert_array_equal(np.asarray(after.x), np.asarray(x1))  # the step moved them to what ask said


def test_settings_that_evaluate_twice_are_refused():
    with pytest.raises(ValueError, match="correction='heaviside'.*E\\(m\\)"):
        cj.ask_tell(cj.cbo, correction="heaviside")
    with pytest.raises(ValueError, match="stagnation_patience"):
        cj.ask_tell(cj.cbo, stagnation_patience=5)
    with pytest.raises(ValueError, match="sigma_indep=0.5.*pre-step"):
        cj.ask_tell(cj.drift_constrained_cbo, constraints=SPHERE, sigma_indep=0.5)
    with pytest.raises(ValueError, match="gradient terms"):
        cj.ask_tell(cj.cbo, lambda2=0.1, sigma2=0.1)
    at = cj.ask_tell(cj.cbo)
    state = at.tell(at.start(_x0().astype(np.float32), 0), F(_x0().astype(np.float32)))
    with pytest.raises(ValueError, match=r"one energy per particle, shape \(30,\)"):
        at.tell(state, jnp.zeros(29))
    with pytest.raises(ValueError, match="drive it with ask/tell"):
        cj.simulate(at.dynamics, _x0().astype(np.float32), 0, 2)


def test_optimizer_saves_and_resumes_bit_for_bit(tmp_path):
    x0 = _x0(n=40, d=4).astype(np.float32)

    def run(opt, tells):
        for _ in range(tells):
            opt.tell(F(jnp.asarray(opt.ask())))
        return opt

    whole = run(cj.Optimizer(cj.ask_tell(cj.cbo, sigma1=0.7), x0, key=3), 12)
    first = run(cj.Optimizer(cj.ask_tell(cj.cbo, sigma1=0.7), x0, key=3), 5)
    path = first.save(tmp_path / "opt")
    resumed = cj.Optimizer(cj.ask_tell(cj.cbo, sigma1=0.7), x0, key=3)
    resumed.restore(path)
    assert resumed.tells == 5
    run(resumed, 7)
    for a, b in zip(jax.tree_util.tree_leaves(whole.state), jax.tree_util.tree_leaves(resumed.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert whole.best_energy == resumed.best_energy and whole.best_x.shape == (4,)
    with pytest.raises(RuntimeError, match="before ask"):
        resumed.tell(np.zeros(40))
    with pytest.raises(ValueError, match="another dynamics"):
        cj.Optimizer(cj.ask_tell(cj.pso), x0, key=3).restore(path)
    with pytest.raises(TypeError, match="ask_tell"):
        cj.Optimizer(cj.cbo(F), x0)


def test_the_clustered_and_cb2o_systems_by_ask_and_tell():
    """K = 2 classes (the losses told as (K, N)) and CB²O (L then G, (2, N)): simulate's numbers
    in float64, and an Optimizer over Particles."""
    from cbo_jax.dynamics.clustered import ClusteredConfig, particles

    lower = [cj.objectives.Quadratic(shift=c) for c in (-1.0, 1.0)]
    upper = cj.objectives.Quadratic(shift=0.3)
    with enable_x64(True):
        p = particles(_x0(n=24, d=2), np.arange(24) % 2)
        cfg = ClusteredConfig(sigma1=0.5, alpha=20.0, dtype="float64")
        ref = cj.simulate(cj.clustered(lower, cfg), p, 1, 8).state
        at = cj.ask_tell(cj.clustered, 2, cfg)
        got = _loop(at, p, 1, 8, lambda x: jnp.stack([f(x) for f in lower]))
        np.testing.assert_allclose(np.asarray(got.x), np.asarray(ref.x), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(got.consensus), np.asarray(ref.consensus), rtol=1e-12, atol=1e-12)
        bi = ClusteredConfig(sigma1=0.4, alpha=30.0, beta=0.5, dtype="float64")
        one = particles(_x0(n=24, d=2))
        ref = cj.simulate(cj.cb2o(lower[0], upper, bi), one, 2, 8).state
        got = _loop(cj.ask_tell(cj.cb2o, bi), one, 2, 8, lambda x: jnp.stack([lower[0](x), upper(x)]))
        np.testing.assert_allclose(np.asarray(got.x), np.asarray(ref.x), rtol=1e-12, atol=1e-12)
    opt = cj.Optimizer(cj.ask_tell(cj.clustered, 2, ClusteredConfig(sigma1=0.5)),
                       particles(_x0(n=24, d=2).astype(np.float32), np.arange(24) % 2), key=0)
    for _ in range(3):
        x = opt.ask()
        opt.tell(np.stack([np.sum((x + 1) ** 2, 1), np.sum((x - 1) ** 2, 1)]))
    assert opt.state.x.shape == (24, 2) and opt.tells == 3
    with pytest.raises(ValueError, match=r"shape \(2, 24\)"):
        opt.ask()
        opt.tell(np.zeros(24))
    with pytest.raises(ValueError, match="number of classes K"):
        cj.ask_tell(cj.clustered, lower)
