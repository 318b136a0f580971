"""Hyperparameter sweeps of a federated algorithm as one vmapped program.

An algorithm's numbers (FedCBO's α, λ1 and γ of the step ``λ1 γ``, the ε schedule, σ1, the local
learning rate, ...) are fields of its config, and a config's numbers are constants of the
compiled round: a sweep written as a loop of :func:`~cbo_jax.federated.run` calls compiles the
rounds once per value. ``run(algorithm, data, rounds, key, params=grid)`` runs the whole grid as
one program instead: the grid's numbers are traced, the algorithm is built inside the trace from
a config holding them (``algorithm.build``), and the rounds of every grid point run side by side
under ``jax.vmap``, every point from the same data and the same key. Each point's numbers equal
those of a separate run of its config up to float32 rounding (``benchmarks/federated_sweep.py``
measures both).

>>> res = fl.run(fl.fedcbo(model, fl.FedCBOConfig(M=5), n), data, 20, jax.random.key(0),  # doctest: +SKIP
...              params={"alpha": [1, 10, 100], "local.lr": [0.01, 0.1]}, out="results/sweep")
>>> res.summary["final_test_acc"]    # a 3 × 2 nested list: the grid's axes  # doctest: +SKIP

``params`` maps config fields (a nested one by its path, ``"local.lr"``) to their values; the grid
is their outer product, its axes in the order given. Only ``float`` fields are swept: an
``int`` sets array shapes (``M``, ``epochs``, ``batch_size``) and a string the program's
structure, so a loop of runs is the way to vary them. A float field that the algorithm reads on
the host to choose its program (``participation < 1`` draws ``G_n``; a Poisson sampling rate of
1 takes the full batch) cannot be traced either: the run refuses it naming the field. A term
that a value of 0 leaves out of a single run (a momentum, the noise σ1 or ε) stays in a sweep's
program with a weight that may be 0. Every point's config is built and checked on the host
first, so a value out of range is refused naming the point.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks

__all__ = ["Grid", "grid", "algorithm_at", "sweepable_fields", "NotSweepableError", "nested", "plot_sweep"]


class NotSweepableError(ValueError):
    """A swept field that the algorithm reads on the host to choose its program (a Python branch on
    the value, or ``float(value)``), so it cannot be traced; the message names the field."""


class Grid(NamedTuple):
    """A grid of config values: ``names`` (field paths) and each one's ``values``, the grid's axes.

    ``configs`` holds one concrete, checked config per point, in row-major order (the last name
    varies fastest), as :meth:`points` and every flattened result.
    """

    names: tuple[str, ...]
    values: tuple[tuple[float, ...], ...]
    configs: tuple[Any, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.values)

    @property
    def size(self) -> int:
        return len(self.configs)

    def points(self) -> list[dict[str, float]]:
        """Each point's ``{name: value}``, row-major."""
        return [dict(zip(self.names, combo)) for combo in itertools.product(*self.values)]

    def arrays(self) -> tuple[jax.Array, ...]:
        """The points' values as one ``(P,)`` float32 array per name (what the sweep traces)."""
        pts = np.asarray(list(itertools.product(*self.values)), np.float64).reshape(self.size, len(self.names))
        return tuple(jnp.asarray(pts[:, i], jnp.float32) for i in range(len(self.names)))

    def label(self, i: int) -> str:
        """``"alpha=10, local.lr=0.1"`` for point ``i``."""
        return ", ".join(f"{k}={v:g}" for k, v in self.points()[i].items())

    def record(self) -> dict:
        """What config.json and summary.json record: ``{"names", "values", "shape"}``."""
        return {"names": list(self.names), "values": [list(v) for v in self.values], "shape": list(self.shape)}


def sweepable_fields(config: Any, prefix: str = "") -> list[str]:
    """The ``float`` fields of ``config`` (nested configs by path): what a sweep may trace."""
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out += sweepable_fields(value, f"{prefix}{f.name}.")
        elif "float" in str(f.type) and not isinstance(value, (bool, np.bool_, str)):
            out.append(prefix + f.name)
    return out


def _replace_path(config: Any, path: Sequence[str], value: Any) -> Any:
    if len(path) == 1:
        return dataclasses.replace(config, **{path[0]: value})
    return dataclasses.replace(config, **{path[0]: _replace_path(getattr(config, path[0]), path[1:], value)})


def _with(config: Any, names: Sequence[str], values: Sequence[Any]) -> Any:
    for name, value in zip(names, values):
        config = _replace_path(config, name.split("."), value)
    return config


def grid(algorithm: Any, params: Mapping[str, Sequence[float]]) -> Grid:
    """The grid of ``params`` (``{field path: values}``) around ``algorithm``'s config, every
    point's config checked on the host; a ``ValueError`` names what is wrong and where."""
    if getattr(algorithm, "build", None) is None:
        raise ValueError(f"{algorithm.name} cannot be rebuilt from another config (its Algorithm has no `build`), so "
                         f"it cannot sweep its numbers in one program: run one config at a time")
    if not isinstance(params, Mapping) or not params:
        raise ValueError(f"params must be a non-empty dict {{config field: values}}, e.g. {{'alpha': [1, 10]}}, "
                         f"got {params!r}")
    base, allowed = algorithm.config, sweepable_fields(algorithm.config)
    names, values = [], []
    for name, vals in params.items():
        if name not in allowed:
            raise ValueError(f"params[{name!r}]: {type(base).__name__} has no float field {name!r} to sweep; "
                             f"its float fields: {', '.join(allowed)} (int and string fields set shapes and the "
                             f"program's structure: run one config per value)")
        if isinstance(vals, (str, bytes)) or np.ndim(vals) != 1 or len(vals) == 0:
            raise ValueError(f"params[{name!r}] must be a non-empty list of numbers, got {vals!r}")
        vals = tuple(_checks.finite_number(f"params[{name!r}][{i}]", v, f32=True) for i, v in enumerate(vals))
        if len(set(vals)) < len(vals):
            raise ValueError(f"params[{name!r}] repeats a value: {list(vals)}")
        names.append(name)
        values.append(vals)
    configs = []
    for idx, combo in zip(itertools.product(*(range(len(v)) for v in values)), itertools.product(*values)):
        try:
            configs.append(_with(base, names, combo))
        except ValueError as err:
            point = ", ".join(f"{k}={v:g}" for k, v in zip(names, combo))
            raise ValueError(f"params, grid point {idx} ({point}): {err}") from None
    return Grid(tuple(names), tuple(values), tuple(configs))


def algorithm_at(algorithm: Any, names: tuple[str, ...], values: Sequence[jax.Array]) -> Any:
    """``algorithm`` built from its config with ``names`` set to the traced ``values`` (inside a
    trace; the grid's concrete configs were checked by :func:`grid`)."""
    with _checks.swept_numbers():
        return algorithm.build(_with(algorithm.config, names, values))


def traced(fn: Callable, names: tuple[str, ...]) -> Callable:
    """``fn`` (a function tracing an algorithm built with swept numbers), its failures to trace a
    host-side use of one of ``names`` turned into a :class:`NotSweepableError` naming them."""
    def wrapped(*args, **kwargs):
        try:
            with _checks.swept_numbers():
                return fn(*args, **kwargs)
        except (jax.errors.TracerBoolConversionError, jax.errors.ConcretizationTypeError,
                jax.errors.TracerIntegerConversionError) as err:
            raise NotSweepableError(
                f"the algorithm reads {' or '.join(names)} on the host to choose its program (a Python branch "
                f"or a float() of the value), so a sweep cannot trace it: run one config per value "
                f"({type(err).__name__})") from err
    return wrapped


def nested(flat: Any, shape: tuple[int, ...]) -> Any:
    """A row-major list of the grid's ``P`` points' values as nested lists of ``shape``."""
    arr = np.empty(len(flat), dtype=object)
    arr[:] = list(flat)
    return arr.reshape(shape).tolist()


def plot_sweep(history: list[dict], g: Grid, path: Any, title: str = "") -> Any:
    """Every scalar metric against the round, one panel each, one curve per grid point (its label
    in the legend): the sweep's comparison plot."""
    from cbo_jax.runtime.plotting import subplots

    def flat(v):
        return np.asarray(v, dtype=object).reshape(-1) if isinstance(v, list) else None

    keys = [k for k in dict.fromkeys(k for r in history for k in r) if k not in ("round", "elapsed_s")]
    keys = [k for k in keys if any(flat(r.get(k)) is not None and flat(r.get(k)).size == g.size for r in history)]
    if not any(np.any(flat(r["diverged_agents"]) != 0) for r in history if isinstance(r.get("diverged_agents"), list)):
        keys = [k for k in keys if k != "diverged_agents"]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = -(-len(keys) // cols)
    fig, axes = subplots(rows, cols, figsize=(4.4 * cols, 3.1 * rows), squeeze=False)
    for ax, k in zip(axes.ravel(), keys):
        for p in range(g.size):
            pts = [(r["round"], flat(r[k])[p]) for r in history if flat(r.get(k)) is not None
                   and isinstance(flat(r[k])[p], (int, float)) and not isinstance(flat(r[k])[p], bool)]
            if pts:
                ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, label=g.label(p))
        ax.set_xlabel("communication round")
        ax.set_title(k)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(keys):]:
        ax.axis("off")
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    ncol = min(4, g.size)
    legend_rows = -(-g.size // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, min(0.4, 0.035 * legend_rows * 3.1 / rows), 1, 1))
    fig.savefig(path, dpi=110)
    return path
