"""``fedcbo-table1 --baselines``: the paper's protocol and IFCA's own code's local update."""

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbo_jax import models
from cbo_jax.cli import main
from cbo_jax.experiments import fedcbo_table1
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.local import local_train


def _args(**kw):
    base = dict(scale="small", rounds=None, seeds=None, source="bundled", data_dir=None, preset="paper",
                baselines="paper")
    return argparse.Namespace(**{**base, **kw})


def test_ifca_code_changes_only_the_baselines_local_update():
    paper, _ = fedcbo_table1._configs(_args())
    code, _ = fedcbo_table1._configs(_args(baselines="ifca-code"))
    for name in ("fedcbo", "local"):
        assert code[name] == paper[name]
    want = fedcbo_table1.ifca_code_local(200)
    assert (want.epochs, want.batch_size, want.lr, want.momentum) == (10, 200, 0.1, 0.0)
    for name in ("ifca", "fedavg"):
        assert code[name].config.local == want
        assert dataclasses.replace(code[name].config, local=paper[name].config.local) == paper[name].config
        assert code[name].data == paper[name].data and code[name].run == paper[name].run
    assert code["ifca"].config.k == 4


def test_ifca_code_local_update_is_ten_full_batch_gradient_steps():
    """IFCA's code: ``tau = 10`` times ``param -= lr * grad`` of the mean loss over all of the
    machine's images. Against that loop written out with jax.grad, in float32."""
    model = models.mlp_mnist(hidden=(8,))
    n = 20
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, (2, n, 28, 28)), jnp.uint8)
    y = jnp.asarray(rng.integers(0, 10, (2, n)), jnp.int32)
    params = jax.vmap(model.init)(jax.random.split(jax.random.key(1), 2))
    cfg = fedcbo_table1.ifca_code_local(n)
    got = local_train(model, cfg, params, None, AgentData(x, y, jnp.full((2,), n)), jax.random.key(2)).params

    def mean_loss(p, xa, ya):
        return jnp.mean(model.loss(model.apply(p, xa), ya))

    for j in range(2):
        p = jax.tree_util.tree_map(lambda a: a[j], params)
        for _ in range(10):
            g = jax.grad(mean_loss)(p, x[j], y[j])
            p = jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)
        for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(got)):
            np.testing.assert_allclose(np.asarray(b[j]), np.asarray(a), rtol=2e-5, atol=2e-6)


def test_fedcbo_noise_refuses_baselines(capsys):
    code = main(["reproduce", "fedcbo-noise", "--baselines", "ifca-code", "--seeds", "1", "--no-progress"])
    assert code != 0
    assert "--baselines" in capsys.readouterr().err


@pytest.mark.slow  # eight runs' compilations; CI runs it in the slow step
def test_table1_ifca_code_prints_the_protocol(tmp_path, monkeypatch, capsys):
    tiny = fedcbo_table1.Scale(agents=8, M=3, epochs=1, rounds=1, eval_chunk=4, seeds=1, samples_per_agent=20,
                               eval_every=1)
    monkeypatch.setitem(fedcbo_table1.SCALES, "small", tiny)
    assert main(["reproduce", "fedcbo-table1", "--scale", "small", "--seeds", "1", "--source", "bundled",
                 "--baselines", "ifca-code", "--no-progress", "--output", str(tmp_path / "out")]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["baselines"] == "ifca-code"
    assert all(0 <= r[m] <= 100 for m in ("fedcbo", "ifca", "fedavg", "local"))
    cfg = json.loads((tmp_path / "out" / "ifca" / "seed0" / "config.json").read_text())
    assert cfg["config"]["local"] == {"epochs": 10, "batch_size": 20, "lr": 0.1, "momentum": 0.0,
                                      "reset_optimizer": True, "agent_chunk": None}
