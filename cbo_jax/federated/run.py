"""The round loop: a jitted ``lax.scan`` over chunks of communication rounds.

:func:`run_federated` scans ``eval_every`` rounds at a time (one compiled program,
reused), then evaluates test accuracy, appends one JSON line per round to
``metrics.jsonl`` (the evaluation fields on evaluation rounds), updates a progress
bar, and optionally checkpoints the state. Per-round selection metrics (SR_n and its
oracle, selection frequency by cluster, IFCA's cluster purity) are computed inside
the scan from the true cluster ids, which are passed to the loop, never to the
algorithm.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cbo_jax import _checks
from cbo_jax import checkpoint as ckpt
from cbo_jax.federated import metrics as fm
from cbo_jax.federated.algorithms.base import AgentData, Algorithm
from cbo_jax.federated.data import FederatedData
from cbo_jax.federated.padding import pad_agent_data, padded_run
from cbo_jax.models import Model
from cbo_jax.sharding import shard_leading

__all__ = ["RunResult", "run_federated"]


class RunResult(NamedTuple):
    state: Any
    history: list  # one dict per round
    summary: dict


@functools.partial(jax.jit, static_argnames=("round_fn", "length", "num_clusters"), donate_argnums=(0,))
def _scan_rounds(state, data: AgentData, cluster, *, round_fn, length: int, num_clusters: int):
    n = cluster.shape[0]  # the real agents; a sharded run's data may hold padding agents after them

    def body(s, _):
        s, info = round_fn(s, data)
        if info.active.shape[0] != n:
            info = jax.tree_util.tree_map(lambda a: a[:n] if a.ndim else a, info)  # drop the padding agents
        rec = {"train_loss": jnp.mean(info.train_loss), "eps": info.eps, "participants": jnp.sum(info.active)}
        if info.idx.shape[1] > 0:
            rec["sr"] = fm.selection_rate(info.idx, cluster)
            rec["sr_oracle"] = fm.oracle_selection_rate(info.eps, cluster)
            rec["selection_frequency"] = fm.selection_frequency(info.idx, cluster, num_clusters)
        rec["assignment"] = info.assignment
        return s, rec

    return jax.lax.scan(body, state, None, length=length)


def _to_py(v):
    v = np.asarray(v)
    return v.item() if v.ndim == 0 else v.tolist()


def run_federated(
    algorithm: Algorithm,
    model: Model,
    data: FederatedData,
    rounds: int,
    key: jax.Array,
    *,
    eval_every: int = 1,
    eval_chunk: int = 8,
    test_size: int | None = None,
    out_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    mesh=None,
    progress: bool = True,
) -> RunResult:
    """Run ``rounds`` communication rounds of ``algorithm`` on ``data``.

    Args:
      algorithm: an ``(init, round)`` pair from :mod:`cbo_jax.federated.algorithms`.
      model: the model the algorithm trains (for evaluation).
      data: the federated data (cluster ids used for metrics only).
      key: PRNG key of the run.
      eval_every: evaluate test accuracy every this many rounds (and after the last).
      eval_chunk: models evaluated at once.
      test_size: evaluate on the first ``test_size`` images of each test set (all if None).
      out_dir: if given, ``metrics.jsonl`` is appended there round by round.
      checkpoint_every: with ``out_dir``, checkpoint the state every this many rounds
        (and after the last) to ``out_dir/checkpoint`` with orbax-checkpoint
        (:mod:`cbo_jax.checkpoint`).
      mesh: a :func:`cbo_jax.sharding.agent_mesh`: every array of the data and the
        state whose leading axis is the agent axis (models, optimiser states, the
        likelihood matrix's rows, ...) is split over the mesh's devices and the
        jitted rounds run partitioned by XLA. Any ``N`` works: when it is not a
        multiple of the device count, inactive padding agents are appended up to
        :func:`cbo_jax.sharding.padded_size` (no data, never in ``G_n``, never
        downloaded or averaged; :mod:`cbo_jax.federated.padding`), and dropped
        again from the metrics, the evaluation, the checkpoints and the returned
        state. Results equal the single-device run up to float rounding. FedCBO's
        downloads are gathered by XLA unless the algorithm was built with the same
        mesh (``fedcbo(..., mesh=mesh)``: the gather-free exchange).
      resume: with ``out_dir``, continue from ``out_dir/checkpoint`` when it exists:
        the state and the metrics rows up to its round are restored, and the run goes
        on to ``rounds``. A run stopped after round r and resumed ends in exactly the
        state, and writes exactly the metrics, of an uninterrupted run (the
        evaluation rounds must be the same: keep ``eval_every``).
    """
    _checks.positive_int("rounds", rounds)
    _checks.positive_int("eval_every", eval_every)
    agent_data = AgentData.from_federated(data)
    cluster = jnp.asarray(data.cluster)
    test_x, test_y = data.test_x, data.test_y
    if test_size is not None:
        test_x, test_y = test_x[:, :test_size], test_y[:, :test_size]
    k = data.num_clusters
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise ValueError("resume=True needs out_dir (the checkpoint lives in out_dir/checkpoint)")
    layout = padded_run(algorithm, data.num_agents, mesh)
    size, to_user = layout.size, layout.to_user  # to_user: the state without padding agents

    t0 = time.perf_counter()
    state = jax.jit(algorithm.init)(key)
    history: list[dict] = []
    done = 0
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume and ckpt.exists(out / "checkpoint"):
            state, meta = ckpt.restore(out / "checkpoint", state)
            done = int(meta["step"])
            if done > rounds:
                raise ValueError(f"the checkpoint is at round {done}, beyond rounds={rounds}")
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
            history = [r for r in rows if r["round"] <= done]
            if len(history) != done:
                raise ValueError(f"{out / 'metrics.jsonl'} has {len(history)} rows up to round {done}; cannot resume")
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    if mesh is not None:
        if size != layout.n:
            state = layout.to_padded(state)
            agent_data = pad_agent_data(agent_data, size)
        state, agent_data = shard_leading((state, agent_data), mesh, size)
        cluster = jax.device_put(cluster, NamedSharding(mesh, PartitionSpec()))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, initial=done, desc=algorithm.name, unit="round", dynamic_ncols=True)
    last_eval: dict = {k: v for k, v in history[-1].items() if k.startswith("test_acc")} if history else {}
    try:
        while done < rounds:
            # Evaluation rounds are multiples of eval_every (and the last), also after a resume.
            length = min(eval_every - done % eval_every, rounds - done)
            state, rec = _scan_rounds(state, agent_data, cluster, round_fn=algorithm.round, length=length, num_clusters=k)
            rec = jax.device_get(rec)
            kind, params = algorithm.eval_models(to_user(state))
            last_eval = fm.evaluate(model, kind, params, test_x, test_y, cluster, chunk=eval_chunk)
            for i in range(length):
                row = {"round": done + i + 1}
                for name, val in rec.items():
                    if name == "assignment":
                        if algorithm.name == "ifca":
                            row["cluster_purity"] = fm.cluster_purity(val[i], data.cluster)
                        continue
                    row[name] = _to_py(val[i])
                if i == length - 1:
                    row.update(last_eval)
                    row["elapsed_s"] = round(time.perf_counter() - t0, 3)
                history.append(row)
                if out is not None:
                    with open(out / "metrics.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
            done += length
            if bar is not None:
                bar.update(length)
                post = {"acc": f"{last_eval['test_acc']:.2f}"}
                if "sr" in history[-1]:
                    post["SR"] = f"{history[-1]['sr']:.2f}"
                bar.set_postfix(post)
            if out is not None and checkpoint_every and (done % checkpoint_every == 0 or done == rounds):
                ckpt.save(out / "checkpoint", to_user(state), step=done, meta={"algorithm": algorithm.name})
    finally:
        if bar is not None:
            bar.close()
    summary = {
        "algorithm": algorithm.name,
        "rounds": rounds,
        "num_agents": layout.n,
        "num_clusters": k,
        "final_test_acc": last_eval.get("test_acc"),
        "final_test_acc_per_cluster": last_eval.get("test_acc_per_cluster"),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if "sr" in history[-1]:
        summary["final_sr"] = history[-1]["sr"]
        summary["final_sr_oracle"] = history[-1]["sr_oracle"]
    if "cluster_purity" in history[-1]:
        summary["final_cluster_purity"] = history[-1]["cluster_purity"]
    return RunResult(state=to_user(state), history=history, summary=summary)
