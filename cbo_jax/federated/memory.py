"""Memory planning for FedCBO rounds: the largest ``eval_chunk`` that fits a budget.

FedCBO evaluates the ``N × M`` downloaded models ``eval_chunk`` agents at a time; XLA's
temporary memory is a few times ``eval_chunk · M · P`` floats for ``P`` parameters per
model. :func:`planned_round_bytes` compiles one round on abstract shapes (nothing is
allocated) and reads XLA's buffer plan. Measured at the paper's scale (N = 1200,
M = 200), the plan plus the Python process's baseline (about 0.5 GB) was within
0.3–0.5 GB of the peak RSS of a real round (benchmarks/RESULTS_fedcbo.md).
"""

from __future__ import annotations

import dataclasses

import jax

from cbo_jax import _checks
from cbo_jax.federated.algorithms.base import Algorithm
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo
from cbo_jax.federated.data import AgentData
from cbo_jax.federated.padding import layout
from cbo_jax.models import Model

__all__ = ["planned_round_bytes", "eval_chunk_for_budget"]


def planned_round_bytes(algorithm: Algorithm, data: AgentData, key: jax.Array | None = None, *,
                        size: int | None = None) -> int:
    """Bytes XLA plans for one round: arguments + outputs + temporaries - aliased.

    ``size``: plan the round padded to this many agents (a sharded run's
    ``padded_size(N, mesh)``).
    """
    n = data.num_agents
    # size=0 would be taken as "no padding" and a size below N would cut the state and data to that
    # many agents: a plan for fewer agents than the run has (an underestimate)
    if size is not None and (not _checks.is_integer(size) or size < n):
        raise ValueError(f"size must be an integer >= N={n} (the padded number of agents), got {size!r}")
    key = jax.random.key(0) if key is None else key
    lay = layout(n)._replace(size=n if size is None else int(size))
    state = jax.eval_shape(lambda k: lay.pad_state(algorithm.init(k)), key)
    shapes = jax.eval_shape(lambda d: lay.pad_data(d), data)
    ma = jax.jit(algorithm.round).lower(state, shapes).compile().memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes)


def eval_chunk_for_budget(model: Model, cfg: FedCBOConfig, data: AgentData, budget_bytes: float, *,
                          candidates=(64, 32, 16, 8, 4, 2, 1), mesh=None) -> tuple[int, dict]:
    """The largest ``eval_chunk`` whose planned FedCBO round fits ``budget_bytes``.

    Larger chunks evaluate more downloads at once (faster on accelerators) and need
    more memory. With ``cfg.eval_by == "model"`` only ``cfg.eval_chunk`` is tried. Tries
    ``candidates`` (integers >= 1) from the largest down, compiling one round each on
    abstract shapes (:func:`planned_round_bytes`). Returns ``(eval_chunk, plan)`` with
    ``plan`` mapping each tried chunk to its planned bytes. Raises ``ValueError`` when
    even the smallest candidate does not fit.
    """
    if not budget_bytes > 0:
        raise ValueError(f"memory budget must be > 0 bytes, got {budget_bytes}")
    n = data.num_agents
    size = layout(n, mesh).size
    downloads = None
    if mesh is not None:
        from cbo_jax.federated.exchange import exchange_downloads

        downloads = exchange_downloads(mesh)
    if cfg.eval_by == "model":
        # Model by model, eval_chunk is the group of agents' data per forward pass, not a
        # memory knob (one model and ``eval_chunk · n`` rows at a time): keep it, check the fit.
        candidates = (cfg.eval_chunk,)
    candidates = tuple(candidates)
    if not candidates:
        raise ValueError("candidates must be a non-empty sequence of eval_chunk values (integers >= 1)")
    for c in candidates:
        if not _checks.is_integer(c):
            raise ValueError(f"candidates must be integers (eval_chunk values), got {c!r} in {candidates!r}")
        if c < 1:
            raise ValueError(f"candidates must be >= 1 (eval_chunk values), got {c!r} in {candidates!r}")
    plan: dict[int, int] = {}
    for chunk in sorted(set(int(c) for c in candidates), reverse=True):
        alg = fedcbo(model, dataclasses.replace(cfg, eval_chunk=chunk), n, downloads=downloads)
        plan[chunk] = planned_round_bytes(alg, data, size=size)
        if plan[chunk] <= budget_bytes:
            return chunk, plan
    smallest = min(plan)
    raise ValueError(f"a FedCBO round needs {plan[smallest] / 2**30:.2f} GiB even with eval_chunk={smallest}; "
                     f"the budget is {budget_bytes / 2**30:.2f} GiB")
