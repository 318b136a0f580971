"""The round loop of the attack experiments (FedCB²O, FedCBO under attack, DFedAvgM oracles).

Like :func:`cbo_jax.federated.run.run_federated`, rounds are a jitted ``lax.scan``
over chunks of ``eval_every`` rounds, the state is donated, and one JSON line per
round is appended to ``metrics.jsonl``. What differs is what is measured: per round,
the Fig. 5 statistics of the benign agents' downloads (selection frequency and total
consensus weight by same/other cluster × benign/malicious, :func:`metrics.category_stats`),
and at evaluation rounds the attack metrics of the benign agents' own models
(:func:`metrics.attack_metrics`). The true clusters and the attacker mask enter the
metrics only; the algorithm was built without them (except the attackers' own strategy).

With ``mesh=`` the run is sharded over the agent axis as in ``run_federated``: inactive
padding agents are appended after the ``N`` real ones (``Algorithm.resize`` and
:func:`cbo_jax.federated.padding.pad_attack_data`) and dropped again from the
evaluation and the returned state; the per-round metrics read the benign agents only.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cbo_jax import _checks
from cbo_jax.federated import metrics as fm
from cbo_jax.federated.algorithms.base import Algorithm
from cbo_jax.federated.attacks import AttackDataset
from cbo_jax.federated.padding import pad_attack_data, padded_run
from cbo_jax.federated.run import RunResult
from cbo_jax.models import Model
from cbo_jax.sharding import agent_sharding, shard_leading

__all__ = ["run_attack"]


@functools.partial(jax.jit, static_argnames=("round_fn", "length", "num_benign"), donate_argnums=(0,))
def _scan(state, data, cluster, malicious, *, round_fn, length: int, num_benign: int):
    def body(s, _):
        s, info = round_fn(s, data)
        freq, weight = fm.category_stats(info.idx[:num_benign], info.weights[:num_benign], cluster, malicious)
        rec = {"train_loss": jnp.mean(info.train_loss[:num_benign]), "frequency": freq, "weight": weight,
               "self_weight": jnp.mean(info.self_weight[:num_benign])}
        return s, rec

    return jax.lax.scan(body, state, None, length=length)


def run_attack(algorithm: Algorithm, model: Model, data: Any, dataset: AttackDataset, rounds: int, key: jax.Array, *,
               cluster=None, malicious=None, eval_every: int | None = None, eval_chunk: int = 8,
               test_size: int | None = None, out_dir: str | Path | None = None, mesh=None,
               progress: bool = True) -> RunResult:
    """Run ``rounds`` rounds of an attacked algorithm and measure the benign agents.

    Args:
      algorithm: FedCB²O/FedCBO (:func:`~cbo_jax.federated.algorithms.fedcb2o.fedcb2o`) or
        DFedAvgM; its population's first ``dataset.num_benign`` agents are the benign ones.
      data: what ``algorithm.round`` takes (``AttackData`` or a tuple of ``AgentData``).
      dataset: the host dataset (test sets, classes of the attack, benign count).
      cluster, malicious: the population's true clusters and attacker mask (default: the
        dataset's; Oracle Min passes the benign agents' only).
      eval_every: evaluate every this many rounds (default: only after the last).
      test_size: images per test set at intermediate evaluations (the last one uses all).
      mesh: a :func:`cbo_jax.sharding.agent_mesh`: the state's agent axis (models,
        optimiser states) is split over the mesh's devices, and so is every data group
        whose agent count is a multiple of the device count (the others are replicated).
        Any ``N`` works: inactive padding agents are appended up to
        :func:`cbo_jax.sharding.padded_size` (no data, never selected, downloaded or
        averaged) and dropped from the evaluation and the returned state. Results equal
        the single-device run up to float rounding.
    """
    _checks.positive_int("rounds", rounds)
    eval_every = rounds if eval_every is None else _checks.positive_int("eval_every", eval_every)
    cluster = jnp.asarray(dataset.cluster if cluster is None else cluster)
    malicious = jnp.asarray(dataset.malicious if malicious is None else malicious)
    nb = dataset.num_benign
    c_benign = cluster[:nb]
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
    n = int(cluster.shape[0])
    layout = padded_run(algorithm, n, mesh)
    size, to_user = layout.size, layout.to_user  # to_user: the state without padding agents

    t0 = time.perf_counter()
    state = jax.jit(algorithm.init)(key)
    if mesh is not None:
        if size != n:
            state = layout.to_padded(state)
            data = pad_attack_data(data, size, n)
        state = shard_leading(state, mesh, size)
        replicated = NamedSharding(mesh, PartitionSpec())

        def put(x):  # a data group is split over the devices when its agents divide evenly
            x = jnp.asarray(x)
            even = x.ndim >= 1 and x.shape[0] > 0 and x.shape[0] % mesh.size == 0
            return jax.device_put(x, agent_sharding(mesh, x.ndim, 0) if even else replicated)

        data = jax.tree_util.tree_map(put, data)
        cluster, malicious = jax.device_put((cluster, malicious), replicated)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, desc=algorithm.name, unit="round", dynamic_ncols=True)
    history: list[dict] = []
    done, last = 0, {}
    try:
        while done < rounds:
            length = min(eval_every, rounds - done)
            state, rec = _scan(state, data, cluster, malicious, round_fn=algorithm.round, length=length, num_benign=nb)
            rec = jax.device_get(rec)
            done += length
            _, params = algorithm.eval_models(to_user(state))
            benign = jax.tree_util.tree_map(lambda a: a[:nb], params)
            n_test = None if done == rounds else test_size
            tx, ty = dataset.test_x[:, :n_test], dataset.test_y[:, :n_test]
            last = fm.attack_metrics(model, benign, tx, ty, c_benign, dataset.source, dataset.target, chunk=eval_chunk)
            for i in range(length):
                row = {"round": done - length + i + 1}
                for name, val in rec.items():
                    v = np.asarray(val[i])
                    row[name] = v.item() if v.ndim == 0 else dict(zip(fm.CATEGORIES, v.tolist()))
                if i == length - 1:
                    row.update(last)
                    row["elapsed_s"] = round(time.perf_counter() - t0, 3)
                history.append(row)
                if out is not None:
                    with open(out / "metrics.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
            if bar is not None:
                bar.update(length)
                bar.set_postfix({"acc": f"{last['overall_acc']:.1f}", "asr": f"{last['asr']:.1f}"})
    finally:
        if bar is not None:
            bar.close()
    summary = {"algorithm": algorithm.name, "rounds": rounds, "num_agents": int(cluster.shape[0]), "num_benign": nb,
               "overall_acc": last["overall_acc"], "source_acc": last["source_acc"], "asr": last["asr"],
               "per_cluster": {k: last[f"{k}_per_cluster"] for k in ("overall_acc", "source_acc", "asr")},
               "seconds": round(time.perf_counter() - t0, 2)}
    if out is not None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return RunResult(state=to_user(state), history=history, summary=summary)
