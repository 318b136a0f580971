"""Pin the numbers of every federated algorithm before the engine redesign (issue 13).

Run once with the pre-redesign API (commit 395e0bb):

    python tests/pinned/make_federated_pinned.py

It runs tiny fixed-seed runs of every algorithm and variant, on one device and on 8
simulated CPU devices with padding agents, and writes ``federated_v1.npz``: the final
state (every array leaf, PRNG keys excluded) and every per-round metric. The
regression test (tests/federated/test_runner.py) rebuilds the same runs with the
current API and compares them to this file. This script is kept as the record of how
the numbers were made; it imports the old API and is not run by the tests.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cbo_jax import models, sharding  # noqa: E402
from cbo_jax.federated import attack_run, attacks  # noqa: E402
from cbo_jax.federated.algorithms import (FedAvgConfig, FedCBOConfig, IFCAConfig, LocalConfig, fedavg,  # noqa: E402
                                          fedcbo, ifca, local_only)
from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm  # noqa: E402
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o  # noqa: E402
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, SGLDConfig, fedpd, fedsgld  # noqa: E402
from cbo_jax.federated.data import FederatedData  # noqa: E402
from cbo_jax.federated.local import LocalSGDConfig  # noqa: E402
from cbo_jax.federated.mnist import MNIST  # noqa: E402
from cbo_jax.federated.run import run_federated  # noqa: E402
from cbo_jax.federated.synthetic import synthetic  # noqa: E402

assert jax.device_count() == 8
MESH = sharding.agent_mesh()
ROUNDS = 3


# ----------------------------------------------------------------------------- data

def clustered_data(n=13, n_max=20, seed=0):
    """Two clusters with opposite labelling rules on 2-D inputs (as tests/_sharded_runs.py)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_max, 2, 1)).astype(np.float32)
    cl = (np.arange(n) >= 7).astype(np.int32)
    y = (x[:, :, 0, 0] > 0).astype(np.int32)
    y[cl == 1] = 1 - y[cl == 1]
    counts = rng.integers(12, n_max + 1, n).astype(np.int32)  # unequal sizes
    tx = rng.normal(size=(2, 50, 2, 1)).astype(np.float32)
    ty = np.stack([(tx[0, :, 0, 0] > 0), (tx[1, :, 0, 0] <= 0)]).astype(np.int32)
    return FederatedData(x, y, counts, cl, tx, ty)


def attack_dataset():
    rng = np.random.default_rng(0)
    images = MNIST(rng.integers(0, 256, (200, 2, 2)).astype(np.uint8), rng.integers(0, 4, 200).astype(np.int32),
                   rng.integers(0, 256, (40, 2, 2)).astype(np.uint8), rng.integers(0, 4, 40).astype(np.int32), "fake")
    cfg = attacks.LabelFlipConfig(source=2, target=1, num_classes=4, benign_per_cluster=4, malicious_per_cluster=2,
                                  benign_samples=10, val_samples=5, malicious_samples=12)
    return attacks.label_flip_rotated(images, cfg, seed=3)


MODEL = models.mlp_mnist(hidden=(4,), num_classes=2, input_shape=(2, 1))
TINY4 = models.mlp_mnist(hidden=(3,), num_classes=4, input_shape=(2, 2))
LOC = LocalSGDConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
ALOC = LocalSGDConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.9)


def federated_variants(n):
    loc_keep = LocalSGDConfig(epochs=1, batch_size=8, lr=0.05, momentum=0.5, reset_optimizer=False)
    return {
        "fedcbo_egreedy_iso": fedcbo(MODEL, FedCBOConfig(M=3, local=LOC, noise="isotropic", sigma1=0.01,
                                                          participation=0.8, alpha=5.0), n),
        "fedcbo_uniform_aniso": fedcbo(MODEL, FedCBOConfig(M=4, local=loc_keep, selection="uniform",
                                                            noise="anisotropic", sigma1=0.05,
                                                            loss_reduction="sum_of_batch_means", lambda1=5.0), n),
        "fedcbo_probsampling": fedcbo(MODEL, FedCBOConfig(M=3, local=LOC, selection="prob_sampling", eps0=0.3), n),
        "fedavg": fedavg(MODEL, FedAvgConfig(local=LOC, participation=0.6), n),
        "ifca": ifca(MODEL, IFCAConfig(k=2, local=LOC), n),
        "local": local_only(MODEL, LocalConfig(local=loc_keep, participation=0.5), n),
    }


def primal_dual_variants(n):
    lr = models.logistic_regression(num_features=5, num_classes=3)
    oracle = SGLDConfig(steps=6, burn_in=2, lr=0.05, noise=0.3, clip_norm=1.0, sampling_rate=0.5)
    return lr, {
        "fedpd": fedpd(lr, FedPDConfig(local_steps=5, lr=0.05, gamma=2.0, sampling_rate=0.5), n),
        "noisy_fedpd": fedpd(lr, FedPDConfig(local_steps=5, lr=0.05, gamma=2.0, sampling_rate=0.5, noise=0.3,
                                             clip_norm=1.0), n),
        "fedsgld": fedsgld(lr, FedSGLDConfig(oracle=oracle, gamma=2.0, server_momentum=0.3, warm_start=True), n),
        "fedsgld_cold": fedsgld(lr, FedSGLDConfig(oracle=SGLDConfig(steps=6, burn_in=2, lr=0.05, noise=0.3,
                                                                    clip_norm=None, sampling_rate=1.0, average="ema"),
                                                  gamma=2.0, warm_start=False), n),
    }


def attack_variants(ds):
    return {
        "fedcb2o_G": (fedcb2o(TINY4, FedCB2OConfig(M=5, T_G=1, alpha=2.0, local=ALOC), ds.cluster, ds.malicious),
                      ds.attack_data(), None),
        "fedcb2o_self": (fedcb2o(TINY4, FedCB2OConfig(M=4, T_G=0, include_self=True, local=ALOC), ds.cluster,
                                 ds.malicious), ds.attack_data(), None),
        "fedcb2o_loss": (fedcb2o(TINY4, FedCB2OConfig(M=5, criterion="loss", local=ALOC), ds.cluster, ds.malicious),
                         ds.attack_data(), None),
        "oracle_max": (dfedavgm(TINY4, DFedAvgMConfig(M=3, local=ALOC), ds.cluster, name="oracle_max"),
                       ds.oracle_groups(True), None),
        "oracle_min": (dfedavgm(TINY4, DFedAvgMConfig(M=3, local=ALOC), ds.cluster[:ds.num_benign], name="oracle_min"),
                       ds.oracle_groups(False), ds.num_benign),
    }


# ----------------------------------------------------------------------------- recording

def state_arrays(state):
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            continue
        out[jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def flatten_row(row, prefix=""):
    out = {}
    for k, v in row.items():
        if k in ("elapsed_s", "round"):
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_row(v, name + "."))
        else:
            out[name] = np.asarray(v, np.float64)
    return out


def history_arrays(history):
    rows = [flatten_row(r) for r in history]
    keys = sorted(set().union(*rows))
    out = {}
    for k in keys:
        shape = next(r[k].shape for r in rows if k in r)
        out[k] = np.stack([r[k] if k in r else np.full(shape, np.nan) for r in rows])
    return out


RECORD = {}


def record(tag, state, history):
    for k, v in state_arrays(state).items():
        RECORD[f"{tag}/state{k}"] = v
    for k, v in history_arrays(history).items():
        RECORD[f"{tag}/metric/{k}"] = v


def main():
    data = clustered_data()
    n = data.num_agents
    for name, alg in federated_variants(n).items():
        for tag, mesh in (("single", None), ("mesh8", MESH)):
            res = run_federated(alg, MODEL, data, ROUNDS, jax.random.key(11), eval_every=1, progress=False, mesh=mesh)
            record(f"{name}/{tag}", res.state, res.history)

    syn = synthetic(1.0, 1.0, num_devices=13, num_features=5, num_classes=3, max_samples=24, seed=4)
    from cbo_jax.federated.data import FederatedData as FD

    sdata = FD(syn.x, syn.y, syn.counts, np.zeros(13, np.int32), syn.test_x[:1], syn.test_y[:1])
    lr_model, pd_algs = primal_dual_variants(13)
    for name, alg in pd_algs.items():
        for tag, mesh in (("single", None), ("mesh8", MESH)):
            res = run_federated(alg, lr_model, sdata, ROUNDS, jax.random.key(12), eval_every=1, progress=False,
                                mesh=mesh)
            record(f"{name}/{tag}", res.state, res.history)

    ds = attack_dataset()
    for name, (alg, adata, nb) in attack_variants(ds).items():
        kw = {} if nb is None else {"cluster": ds.cluster[:nb], "malicious": ds.malicious[:nb]}
        for tag, mesh in (("single", None), ("mesh8", MESH)):
            res = attack_run.run_attack(alg, TINY4, adata, ds, ROUNDS, jax.random.key(13), eval_every=1, progress=False,
                                        mesh=mesh, **kw)
            record(f"{name}/{tag}", res.state, res.history)

    out = Path(__file__).with_name("federated_v1.npz")
    np.savez_compressed(out, **RECORD)
    print(f"wrote {len(RECORD)} arrays to {out}")


if __name__ == "__main__":
    sys.exit(main())
