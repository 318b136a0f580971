"""``cbo-jax sweep ALGORITHM``: a grid of an algorithm's numbers on the data of ``cbo-jax run``, as
one program (:mod:`cbo_jax.federated.sweep`), into one results directory.

    cbo-jax sweep fedcbo --alpha 1,10,100 --local.lr 0.01,0.1 --rounds 20 --output results/sweep

Every flag of ``cbo-jax run ALGORITHM`` is taken; a comma-separated list given to a number of the
algorithm's config (``--alpha``, ``--lambda1``, ``--eps0``, ``--local.lr``, ...) makes it an axis of
the grid, in the order given. The directory holds ``metrics.jsonl`` (each value a nested list of
the grid's shape), ``summary.json``, ``config.json`` (the config with each swept field at its first
value, and ``"sweep"``: the grid) and ``sweep.png`` (every point's curves side by side).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from cbo_jax import _checks
from cbo_jax import config as cfgs
from cbo_jax.experiments.federated import _record, build, load_data, resolve_data
from cbo_jax.federated import metrics as fm
from cbo_jax.federated.runner import RunResult, run

__all__ = ["sweep_experiment", "parse_values", "best_point", "table"]


def parse_values(flag: str, text: str) -> list[float]:
    """``"1,10,100"`` as ``[1.0, 10.0, 100.0]``; a ``ValueError`` naming ``flag`` otherwise."""
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise ValueError(f"{flag} {text}: a sweep takes comma-separated numbers, and {part.strip()!r} is not "
                             f"one") from None
    return out


def sweep_experiment(cfg, params: Mapping[str, Sequence[float]], out_dir: str | Path | None = None,
                     progress: bool = True, overwrite: bool = False) -> RunResult:
    """Run the experiment ``cfg`` (a ``cbo-jax run`` config) over the grid ``params`` of its
    algorithm's numbers (``{"alpha": [...], "local.lr": [...]}``) as one program."""
    unsupported = [name for name, value in (("run.checkpoint_every", cfg.run.checkpoint_every),
                                            ("run.tensorboard", cfg.run.tensorboard),
                                            ("run.memory_budget_gb", cfg.run.memory_budget_gb)) if value]
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)}: not for a sweep, which runs its grid as one program on one "
                         f"device without checkpoints (cbo-jax run runs one point with them)")
    cfg = dataclasses.replace(cfg, data=resolve_data(cfg.data))
    data = load_data(cfg.data)
    model, algorithm = build(cfg, data.num_agents)
    data.check(model)
    round_metrics, metrics = fm.default_metrics(model, data, chunk=getattr(cfg.config, "eval_chunk", 8),
                                                test_size=cfg.run.test_size, log=None)
    return run(algorithm, data, cfg.run.rounds, _checks.as_key("seed", cfg.run.seed), metrics=metrics,
               round_metrics=round_metrics, every=cfg.run.eval_every, out=out_dir,
               config=_record(cfgs.to_dict(cfg), model), overwrite=overwrite, progress=progress,
               on_diverged=cfg.run.on_diverged, params=params)


def best_point(summary: dict, metric: str = "final_test_acc", higher: bool = True) -> dict | None:
    """The grid point with the best ``metric`` in a sweep's summary: ``{"point", "index", metric}``."""
    values = summary.get(metric)
    if values is None:
        return None
    flat = np.asarray(values, dtype=float).reshape(-1)
    if not np.isfinite(flat).any():
        return None
    i = int(np.nanargmax(flat) if higher else np.nanargmin(flat))
    grid = summary["sweep"]
    index = np.unravel_index(i, grid["shape"])
    point = {name: vals[j] for name, vals, j in zip(grid["names"], grid["values"], index)}
    return {"point": point, "index": [int(j) for j in index], metric: float(flat[i])}


def table(summary: dict, metric: str = "final_test_acc") -> str:
    """One line per grid point: its numbers and ``metric`` (a sweep's summary)."""
    import itertools

    grid = summary["sweep"]
    flat = np.asarray(summary[metric], dtype=float).reshape(-1)
    widths = [max(len(name), 8) for name in grid["names"]]
    lines = ["  ".join(name.rjust(w) for name, w in zip(grid["names"], widths)) + f"  {metric}"]
    for combo, value in zip(itertools.product(*grid["values"]), flat):
        lines.append("  ".join(f"{v:g}".rjust(w) for v, w in zip(combo, widths)) + f"  {value:.4g}")
    return "\n".join(lines)
