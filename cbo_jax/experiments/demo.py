"""The main demo: FedCBO against FedAvg, IFCA and local training, offline.

Rotated MNIST (4 rotations) built from the real-MNIST subset shipped in the package:
N = 40 agents (10 per rotation) of 200 images, an MLP 784-200-10 per agent, the same
local SGD for every method, a few communication rounds. Prints a comparison table and
writes each method's results directory under ``out``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from cbo_jax.experiments.federated import (RotatedMNISTConfig, RunOptions, comparison, load_data, resolve_data,
                                          run_experiment)
from cbo_jax.federated.algorithms import FedCBOConfig
from cbo_jax.federated.local import LocalSGDConfig

DATA = RotatedMNISTConfig(source="bundled", agents=40, clusters=4, samples_per_agent=200)
LOCAL = LocalSGDConfig(epochs=2, batch_size=64, lr=0.05)
RUN = RunOptions(rounds=15, eval_every=5, test_size=1000)
FEDCBO = FedCBOConfig(M=8, alpha=10.0, eps0=0.5, eps_decay=0.05, eps_min=0.1, eval_chunk=8)


def _check_replaceable(out: Path, configs: dict) -> None:
    """Refuse an ``out/ALGO`` that holds another command's run: the demo replaces only an earlier demo's results.

    ``cbo-jax demo --output results`` deleted the metrics, checkpoints and summary of a
    ``cbo-jax run fedcbo --output results/fedcbo``. An earlier demo's run is recognised by its
    ``config.json`` (the algorithm and the demo's data; any seed or round count); a run
    killed before writing it, and an empty directory, are replaced as before.
    """
    data = dataclasses.asdict(resolve_data(DATA))
    for algo in configs:
        d = out / algo
        try:
            recorded = json.loads((d / "config.json").read_text())
        except (OSError, ValueError):
            recorded = None
        foreign = (d / "checkpoint").exists() or (recorded is not None and not (
            isinstance(recorded, dict) and recorded.get("algorithm") == algo and _same_data(recorded.get("data"), data)))
        if foreign:
            raise ValueError(f"{d} holds the results of a run that is not a demo's; the demo replaces only its own "
                             f"results: choose another --output")


def _same_data(recorded, data: dict) -> bool:
    """``recorded`` is the demo's data: as recorded now, or as a demo before ``data.dataset`` and
    ``data.model`` recorded it (MNIST and its MLP, then the only ones)."""
    if recorded == data:
        return True
    older = {k: v for k, v in data.items() if k not in ("dataset", "model")}
    return (isinstance(recorded, dict) and recorded == older and data.get("dataset") == "mnist"
            and data.get("model") == "mlp")


def run_demo(out: Path, seed: int = 0, progress: bool = True, rounds: int | None = None) -> dict:
    """Run the four methods; ``rounds`` overrides the demo's 15 rounds (a quicker look)."""
    out = Path(out)
    run = dataclasses.replace(RUN, seed=seed)
    if rounds is not None:
        run = dataclasses.replace(run, rounds=rounds, eval_every=min(RUN.eval_every, rounds))
    configs = comparison(DATA, LOCAL, run, FEDCBO)
    _check_replaceable(out, configs)
    data = load_data(DATA)
    rows = {}
    t0 = time.perf_counter()
    for algo, cfg in configs.items():
        # The demo's directory is the demo's: a second demo replaces the first one's results.
        rows[algo] = run_experiment(cfg, out / algo, progress=progress, data=data, overwrite=True).summary
    width = 8
    print()
    print(f"Rotated MNIST (bundled real subset): {DATA.agents} agents, {DATA.clusters} rotations, "
          f"{DATA.samples_per_agent} images each, {run.rounds} rounds, tau={LOCAL.epochs} epochs")
    print(f"{'method':<{width}}  {'test acc %':>10}  {'per rotation (0/90/180/270)':<30}  {'seconds':>7}")
    for algo, s in rows.items():
        per = " / ".join(f"{a:.1f}" for a in s["final_test_acc_per_cluster"])
        print(f"{algo:<{width}}  {s['final_test_acc']:>10.2f}  {per:<30}  {s['seconds']:>7.1f}")
    if "final_sr" in rows["fedcbo"]:
        print(f"FedCBO successful selection rate {rows['fedcbo']['final_sr']:.3f} "
              f"(oracle {rows['fedcbo']['final_sr_oracle']:.3f})")
    print(f"published (paper scale, Table 1): FedCBO 96.51, IFCA 94.44, FedAvg 85.50, Local 81.27; results in {out}/")
    result = {algo: round(s["final_test_acc"], 2) for algo, s in rows.items()}
    result["sr_final"] = rows["fedcbo"].get("final_sr")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    from cbo_jax.runtime.writer import replace_text

    replace_text(out / "demo.json", json.dumps(result, indent=2) + "\n")  # never through a link in its place
    return result
