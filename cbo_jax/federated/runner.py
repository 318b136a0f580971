"""The one round loop of every federated algorithm: :func:`run`.

``run(algorithm, data, rounds, key, ...)`` scans ``every`` rounds at a time in one
jitted ``lax.scan`` (compiled once, reused; the state is donated), computing the round
metrics inside the scan from each round's info; then, on the host, it evaluates the
evaluation metrics, writes one row per round, updates the progress bar and optionally
checkpoints. With ``checkpoint_every``, the scans are ``gcd(every, checkpoint_every)``
rounds long, and the host stops at every evaluation round and every checkpoint round;
where the scans end changes no number. Nothing here knows which algorithm runs: what is
measured is the metric functions passed in (:mod:`cbo_jax.federated.metrics`).

With ``out``, the run leaves a results directory: ``metrics.jsonl`` (one row per
round; TensorBoard event files too with ``tensorboard=True``), ``config.json``,
``summary.json`` (final numbers, and under ``"environment"`` the versions, device and
command that produced them: ``cbo_jax.provenance``) and ``metrics.png`` (every scalar
curve), and checkpoints with ``checkpoint_every``.

With ``mesh``, every per-agent array of the data and of the state (the fields the
state lists in ``agent_fields``) is split over the devices and the jitted rounds run
partitioned by XLA. Any ``N`` works: inactive padding agents fill the last devices
(:mod:`cbo_jax.federated.padding`) and are cut off again from the infos, the
evaluation, the checkpoints and the returned state.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from cbo_jax import _checks
from cbo_jax import population as pop
from cbo_jax.federated import padding
from cbo_jax.federated import sweep as _sweep
from cbo_jax.federated._records import (_comparable, _config_record, _fingerprint_hash, _read_fingerprint,
                                        _resume, fingerprint, model_record)
from cbo_jax.federated.algorithms.base import Algorithm
from cbo_jax.federated.data import AgentData, FederatedData, check_training
from cbo_jax.federated.metrics import Evaluation
from cbo_jax.runtime import checkpoint as ckpt
from cbo_jax.runtime import provenance
from cbo_jax.runtime.driver import Output, RunFiles, drive
from cbo_jax.runtime.progress import Stopwatch, advance
from cbo_jax.runtime.writer import (read_jsonl, replace_text, to_python,
                                    write_summary)

__all__ = ["DivergedError", "RunResult", "finished", "fingerprint", "model_record", "run"]

ON_DIVERGED = ("warn", "stop")


class DivergedError(RuntimeError):
    """A run with ``on_diverged="stop"`` met a model holding a NaN or an infinity. The message
    names the round and the agents (or server models); the rows up to that round are written."""


class RunResult(NamedTuple):
    state: Any  # the final state of the real agents
    history: list  # one dict per round
    summary: dict

    def __repr__(self) -> str:  # the summary in full, the state and the rows by shape and name
        from cbo_jax.runtime import display as _repr

        names = list(dict.fromkeys(k for row in self.history for k in row)) if isinstance(self.history, list) else []
        return (f"RunResult(summary={self.summary!r},\n"
                f"    state={_repr.tree(self.state)},\n"
                f"    history=[{len(self.history)} rows of {_repr.columns(names)}])")


# written by the runner into every row (diverged_agents: where the algorithm's info or models tell it)
_ROW_KEYS = ("round", "elapsed_s", "diverged_agents")


def _merge(fns: Sequence[Callable], arg, what: str, taken: dict | None = None) -> dict:
    """The metrics' dicts as one row part. A name given twice, by two metrics or by a round
    metric and an evaluation metric (``taken``), or one of the runner's own row keys, is an
    error naming both: the later value would silently replace the earlier one."""
    out: dict = {}
    source: dict = dict(taken or {})
    for fn in fns:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        got = _checks.returns_dict(f"{what} {name!r}", fn(arg), "metric name -> value, e.g. {'loss': ...}")
        for key in got:
            _claim(source, key, name, what)
        out.update(got)
    return out


def _claim(source: dict, key: str, name: str, what: str) -> None:
    """Record that metric ``name`` returns ``key`` in ``source`` (name -> metric); a runner's row key
    or a name another metric returns is an error naming both."""
    if key in _ROW_KEYS:
        raise ValueError(f"{what} {name!r} returns {key!r}, which the runner writes into every row; name it otherwise")
    if key in source:
        raise ValueError(f"{what} {name!r} and {source[key]!r} both return {key!r}: one would overwrite the other in "
                         "every row; rename one of them")
    source[key] = name


def _declared(metrics: Sequence[Callable]) -> tuple[tuple[str, str], ...]:
    """``(name, metric)`` pairs of the names the evaluation metrics declare (their ``returns``,
    :func:`~cbo_jax.federated.metrics.returning`), checked as :func:`_merge` checks the rows, but
    before the first round: a clash found at the first evaluation would lose the rounds before it."""
    source: dict[str, str] = {}
    for fn in metrics:
        names = getattr(fn, "returns", None)
        if names is None:
            continue
        name = getattr(fn, "__name__", None) or type(fn).__name__
        for key in names:
            _claim(source, key, name, "the metric")
    return tuple(sorted(source.items()))


@functools.partial(jax.jit, static_argnums=1)
def _pad_state(state, layout):
    """``layout.pad_state`` compiled once per layout (a bound method of each run's new Layout
    is a new function to ``jax.jit``, compiled again every run)."""
    return layout.pad_state(state)


def _nonfinite(info, state, eval_models, layout) -> dict:
    """The round's diverged models: ``"agents"``, the ``(N,)`` real agents whose model held a NaN or
    an infinity (the info's ``diverged``, which every algorithm of the package reports; else, for
    per-agent models, their rows), and ``"servers"``, the ``(K,)`` server models that do."""
    out = {}
    flags = getattr(info, "diverged", None)
    kind, params = eval_models(state)
    if kind == "server":
        out["servers"] = ~pop.tree_isfinite_rows(params)
    elif flags is None:
        flags = ~pop.tree_isfinite_rows(jax.tree_util.tree_map(lambda a: a[:layout.n], params))
    if flags is not None:
        out["agents"] = flags
    return out


@functools.partial(jax.jit, static_argnames=("round_fn", "eval_models", "layout", "metrics", "length", "taken"),
                   donate_argnums=(0,))
def _scan_rounds(state, data, *, round_fn, eval_models, layout, metrics, length: int, taken: tuple = ()):
    # taken: the evaluation metrics' declared names; a round metric's clash with one is refused
    # here, while the rounds are traced, before any of them runs
    def body(s, _):
        s, info = round_fn(s, data)
        info = layout.trim_info(info)
        row = _merge(metrics, info, "the round metric", dict(taken))
        bad = _nonfinite(info, s, eval_models, layout)
        if "agents" in bad:
            row["diverged_agents"] = jnp.sum(bad["agents"], dtype=jnp.int32)
        return s, (row, bad)

    return jax.lax.scan(body, state, None, length=length)


def _diverged_news(start: int, recs: list, seen: set) -> list[tuple[int, list[int], list[int]]]:
    """``(round, new agents, server models)`` of each round of ``recs`` (host copies of the scans'
    ``(row, bad)``) where an agent diverged that had not before (``seen``, updated), or a server model
    held a NaN or an infinity."""
    news, r = [], start
    for length, (_, bad) in recs:
        for i in range(length):
            r += 1
            agents = [int(j) for j in np.flatnonzero(bad["agents"][i])] if "agents" in bad else []
            servers = [int(k) for k in np.flatnonzero(bad["servers"][i])] if "servers" in bad else []
            new = [j for j in agents if j not in seen]
            seen.update(new)
            if new or servers:
                news.append((r, new, servers))
    return news


def _diverged_message(name: str, r: int, agents: list[int], servers: list[int]) -> str:
    def listed(ids):
        return ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")

    parts = []
    if agents:
        many = len(agents) > 1
        parts.append(f"agent{'s' if many else ''} {listed(agents)} {'hold' if many else 'holds'} a NaN or an infinity "
                     f"(diverged) and {'are' if many else 'is'} left out of every average; the rows count them "
                     f"(diverged_agents)")
    if servers:
        many = len(servers) > 1
        parts.append(f"server model{'s' if many else ''} {listed(servers)} {'hold' if many else 'holds'} a NaN or an "
                     f"infinity")
    return f"{name}, round {r}: " + "; ".join(parts)


def _train_view(data):
    # A FederatedData (host benchmark with test sets and cluster ids) trains on its .train
    # side only: the algorithm never sees the test sets or the cluster ids.
    return data.train if hasattr(data, "test_index") else data


def _check_data(algorithm: Algorithm, data) -> None:
    """Validate the training side of ``data`` on the host before anything is compiled, naming
    the field and the agent (:func:`~cbo_jax.federated.data.check_training`): shapes, integer
    ``counts`` in ``[1, n_max]`` for every real agent, finite inputs and targets on the real
    samples, and, with the algorithm's model, an abstract probe of its output and per-sample
    loss against the labels (``jax.eval_shape``) and, for a classifier, labels in
    ``[0, num_classes)`` (out-of-range labels would train silently to garbage). A
    :class:`~cbo_jax.federated.data.FederatedData` is checked as given (its ``counts``
    before the ``int32`` conversion of its ``.train``); its test sets are the metrics' part."""
    model = getattr(algorithm, "model", None)
    from cbo_jax.federated.attacks import AttackData

    parts: tuple[tuple[str, Any, int], ...]
    if isinstance(data, AttackData):
        nb = data.benign.num_agents
        parts = (("benign", data.benign, 0), ("val", data.val, 0), ("malicious", data.malicious, nb))
    elif isinstance(data, (AgentData, FederatedData)):
        parts = (("", data, 0),)
    elif not hasattr(data, "num_agents"):  # else an AttributeError ('tuple' object has no attribute 'num_agents')
        raise ValueError(f"data must be a FederatedData, an AgentData or an AttackData (what the algorithm's round "
                         f"takes), got {type(data).__name__}; FederatedData.from_arrays / from_lists build one")
    else:  # another container of the caller's own algorithm
        return
    for prefix, group, first in parts:
        for field in ("x", "y", "counts"):  # a list is a pytree of scalars inside the compiled round
            if not hasattr(getattr(group, field), "shape"):
                raise ValueError(f"{prefix + '.' if prefix else ''}{field} must be an array, got "
                                 f"{type(getattr(group, field)).__name__}: pass np.asarray({field})")
        check_training(group.x, group.y, group.counts, getattr(group, "valid", None), model=model, prefix=prefix,
                       first=first)


def _metric_fns(name: str, fns: Any) -> tuple:
    """``fns`` as a tuple of metric functions, refused up front otherwise: a non-function would be
    called only at the first evaluation, after the rounds up to it had trained ("'list' object
    is not callable" for the pair that :func:`~cbo_jax.federated.metrics.default_metrics`
    returns), and round metrics are static arguments of the compiled scan (hashable)."""
    kind = "f(Evaluation) -> dict" if name == "metrics" else "f(info) -> dict"
    if callable(fns) or isinstance(fns, (str, bytes, dict)) or not isinstance(fns, Iterable):
        raise ValueError(f"{name} must be a list of functions {kind}, got {type(fns).__name__}"
                         + (f": pass [{name}]" if callable(fns) else ""))
    fns = tuple(fns)  # once: a generator is used up by the checks below
    for i, fn in enumerate(fns):
        if not callable(fn):
            hint = ""
            if isinstance(fn, (list, tuple)):
                hint = ("; fl.metrics.default_metrics returns the pair (round_metrics, metrics): unpack it, "
                        "round_metrics, metrics = default_metrics(...)")
            raise ValueError(f"{name}[{i}] must be a function {kind}, got {type(fn).__name__}{hint}")
        if name == "round_metrics":
            try:
                hash(fn)
            except TypeError:
                raise ValueError(f"{name}[{i}] ({type(fn).__name__}) must be hashable: round metrics are static "
                                 f"arguments of the compiled rounds (a function, or a frozen dataclass)") from None
    return fns


def run(algorithm: Algorithm, data: Any, rounds: int, key: jax.Array, *, metrics: Sequence[Callable] = (),
        round_metrics: Sequence[Callable] = (), every: int = 1, out: str | Path | None = None, config: Any = None,
        mesh: Mesh | None = None, checkpoint_every: int | None = None, resume: bool = False, extend: bool = False,
        overwrite: bool = False, progress: bool = True, tensorboard: bool = False, plots: bool = True,
        on_diverged: str = "warn", params: Mapping[str, Sequence[float]] | None = None) -> RunResult:
    """Run ``rounds`` communication rounds of ``algorithm`` on ``data``.

    Args:
      algorithm: an ``(init, round)`` pair from :mod:`cbo_jax.federated.algorithms`.
      data: what ``algorithm.round`` takes (an ``AgentData``, an ``AttackData``), or a
        :class:`~cbo_jax.federated.data.FederatedData`, whose training side is used. The
        training data (and FedCB²O's validation splits) are validated on the host before
        anything is compiled, a ``ValueError`` naming the field and the agent
        (:func:`~cbo_jax.federated.data.check_training`): shapes, integer ``counts`` in
        ``[1, n_max]``, finite inputs and targets, the model's output and per-sample loss
        against the labels (an abstract probe), a classifier's integer labels in
        ``[0, num_classes)``. The test sets are checked by the metrics and by
        :meth:`~cbo_jax.federated.data.FederatedData.check`.
      key: PRNG key of the run.
      metrics: evaluation metrics ``f(Evaluation) -> dict``, run every ``every`` rounds
        and after the last.
      round_metrics: round metrics ``f(info) -> dict`` of arrays, traced every round (none by
        default: the rows then hold the round alone; ``[fl.metrics.round_stats]`` records
        the mean local loss, ε and the participants, and
        :func:`~cbo_jax.federated.metrics.default_metrics` gives both kinds for a data set).
      every: rounds between evaluations (and per compiled scan without ``checkpoint_every``).
      out: results directory (``metrics.jsonl``, ``config.json``, ``summary.json``, plots).
      config: what ``config.json`` records (a dataclass or a dict; default: the algorithm's
        name and config, ``rounds``, ``every``, the key's data (``[0, seed]`` for
        ``jax.random.key(seed)``) and the model: its name, classes, loss and number of
        parameters).
      mesh: a :func:`cbo_jax.sharding.agent_mesh` to split the agents over devices.
      checkpoint_every: with ``out``, checkpoint after every round that is a multiple of
        this (whatever ``every``; and after the last) to ``out/checkpoint``
        (:mod:`cbo_jax.checkpoint`).
      resume: with ``out``, continue from ``out/checkpoint`` when it exists: the state
        and the rows up to its round are restored, and the run goes on to ``rounds``.
        A run stopped after round r and resumed ends in exactly the state, and writes
        exactly the rows, of an uninterrupted run. The checkpoint records the run's
        fingerprint (algorithm, its config, ``rounds``, ``every``, the key, a hash of
        the data, the model: its name, classes, loss, parameter shapes and a hash of its
        traced ``apply``); a resume with any other is refused with the differing fields listed.
      extend: with ``resume``, allow a different ``rounds`` (continue a finished run).
      overwrite: replace the results already in ``out`` (without ``resume`` or
        ``overwrite``, a directory holding results is refused; a second run into a
        directory in use is always refused).
      progress: show a progress bar, moved after every round, with the latest evaluation and
        the latest round's metrics (each round is then its own compiled scan call; the
        results are the same). Into a file or a pipe it prints at most every 30 s.
      tensorboard: also write TensorBoard event files to ``out`` (needs tensorboardX).
      plots: with ``out``, draw every scalar curve to ``out/metrics.png``.
      on_diverged: what a model holding a NaN or an infinity does to the run. Every algorithm
        of the package leaves such a model (a diverged agent) out of every average, and each
        row counts them (``diverged_agents``; the summary lists them under ``"diverged"``).
        ``"warn"`` (default): the run goes on, with a ``RuntimeWarning`` naming the round and the
        agents the first time each agent diverges, or whenever a server model is not finite.
        ``"stop"``: the run raises :class:`DivergedError` naming them, after writing the rows
        up to that round (no summary: the run did not finish).
      params: a grid of the algorithm's numbers, ``{config field: values}`` (a nested field by
        its path: ``{"alpha": [1, 10, 100], "local.lr": [0.01, 0.1]}``), run as one vmapped
        program (:mod:`cbo_jax.federated.sweep`): every point from the same data and key, each
        equal to a separate run of its config up to float32 rounding. The result's state, and
        each row's and the summary's values, carry the grid's axes first (nested lists of the
        grid's shape in the rows); ``out`` also gets ``sweep.png``, one curve per point. A sweep
        runs on one device, without checkpoints or TensorBoard files.
    """
    # Row j's random numbers must not depend on the rows after it (padding agents):
    # JAX's partitionable threefry (its default since 0.5) guarantees that.
    output = Output(None if out is None else Path(out), overwrite=overwrite, resume=resume, extend=extend, tensorboard=tensorboard, progress=progress,
                    plots=plots, checkpoint_every=checkpoint_every)
    key = _checks.as_key("key", key)
    _checks.single_key(key, "run splits the key into the rounds' keys itself (several runs: one run call per key)")
    metrics, round_metrics = _metric_fns("metrics", metrics), _metric_fns("round_metrics", round_metrics)
    _checks.positive_int("rounds", rounds)
    _checks.positive_int("every", every)
    _checks.one_of("on_diverged", on_diverged, ON_DIVERGED)
    clusters = getattr(data, "num_clusters", None)
    takes = getattr(algorithm, "takes", None)
    if takes is not None and not isinstance(data, takes):  # else: "built for 5 agents but the data holds 4"
        raise ValueError(f"{algorithm.name} takes an {takes.__name__}, got {type(data).__name__}"
                         + (": build one from your per-agent arrays with fl.AttackData.from_lists(train_x, train_y, "
                            "val_x, val_y[, malicious_x, malicious_y])" if takes.__name__ == "AttackData" else ""))
    from cbo_jax.federated.attacks import AttackData

    if takes is None and isinstance(data, AttackData):  # else an AttributeError from inside the traced round
        raise ValueError(f"{algorithm.name} takes a FederatedData or an AgentData, got an AttackData (FedCB²O's "
                         f"benign, validation and malicious agents); pass data.benign for the benign agents alone, "
                         f"or build the algorithm with takes=AttackData if its round reads one")
    declared = _declared(metrics)  # a clash of declared names: refused here, not after `every` rounds
    grid = None
    if params is not None:
        grid = _sweep.grid(algorithm, params)
        given = [k for k, v in (("mesh", mesh), ("checkpoint_every", checkpoint_every), ("resume", resume),
                                ("tensorboard", tensorboard)) if v]
        if given:
            raise ValueError(f"a sweep (params=) runs on one device without checkpoints or TensorBoard files; "
                             f"{', '.join(given)} are for a single run: run each point on its own for them")
    _check_data(algorithm, data)
    data = _train_view(data)
    n = data.num_agents
    padding.check_agents(algorithm, jax.eval_shape(algorithm.init, key), n)
    fp = fingerprint(algorithm, data, key, rounds, every)
    # summary.json names the code of the run's start (git state read now), not of its end
    started = provenance.started() if output.directory is not None else contextlib.nullcontext()
    # Row j's random numbers must not depend on the rows after it (padding agents):
    # JAX's partitionable threefry (its default since 0.5) guarantees that.
    with RunFiles() as files, jax.threefry_partitionable(True), started:
        if output.directory is not None:
            files.hold(output.directory, resume=resume, overwrite=overwrite)
        if grid is not None:
            return _run_sweep(algorithm, data, rounds, key, grid, output, files, metrics=metrics,
                              round_metrics=round_metrics, every=every, config=config, clusters=clusters,
                              declared=declared, on_diverged=on_diverged)
        return _run(algorithm, data, rounds, key, fp, output, files, metrics=metrics, round_metrics=round_metrics,
                    every=every, config=config, mesh=mesh, clusters=clusters, declared=declared,
                    on_diverged=on_diverged)


def finished(out: str | Path, algorithm: Algorithm, data: Any, rounds: int, key: jax.Array, *, every: int = 1,
             config: Any = None, earlier: Sequence[Any] = ()) -> RunResult | None:
    """The results of ``out`` when it holds this run, finished; else ``None``.

    :func:`run` with ``resume`` continues from a checkpoint; a finished run that saved
    none (no ``checkpoint_every``) would run again from round 0. This reads it back
    instead, when ``out`` holds exactly this run: its ``fingerprint.json`` equals this
    run's :func:`fingerprint` (algorithm, its config, ``rounds``, ``every``, the key, a
    hash of the data), its ``summary.json`` (written last) names ``rounds`` and that
    fingerprint, ``metrics.jsonl`` holds rounds ``1..rounds`` in order, and its
    ``config.json`` records ``config`` (default: what :func:`run` records without one) or
    one of ``earlier``, the records an earlier version wrote for the same run (without
    ``config``, the default record's earlier forms are accepted: without the key, and
    without the key and the model). Only a checkpoint holds a state, so the result's ``state`` is ``None``; the rows and the
    summary are what the files hold, non-finite numbers as ``None`` (JSON's ``null``).
    """
    out = Path(out)
    _checks.positive_int("rounds", rounds)
    _checks.positive_int("every", every)
    key = _checks.as_key("key", key)
    try:
        summary = json.loads((out / "summary.json").read_text())
        recorded = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):  # none (never finished) or damaged: not this finished run
        return None
    saved = _read_fingerprint(out)
    if not isinstance(summary, dict) or saved is None or summary.get("rounds") != rounds:
        return None
    _check_data(algorithm, data)
    fp = fingerprint(algorithm, _train_view(data), key, rounds, every)
    if isinstance(saved, dict):
        fp = _comparable(saved, fp, out, 2)
    if saved != fp or summary.get("fingerprint") != _fingerprint_hash(fp):
        return None
    record = _config_record(algorithm, config, rounds, every, key)
    forms = [record, *(_config_record(algorithm, e, rounds, every, key) for e in earlier)]
    if config is None:  # records of older versions: without the key, and without the key and the model
        forms += [{k: v for k, v in record.items() if k != "key"},
                  {k: v for k, v in record.items() if k not in ("key", "model")}]
    if recorded not in forms:
        return None
    rows = read_jsonl(out / "metrics.jsonl")
    if [r.get("round") for r in rows] != list(range(1, rounds + 1)):
        return None
    return RunResult(None, rows, summary)


def _run(algorithm, data, rounds, key, fp, output: Output, files: RunFiles, *, metrics, round_metrics, every, config,
         mesh, clusters, declared=(), on_diverged="warn") -> RunResult:
    # declared: the evaluation metrics' declared names (run's _declared), refused in the rounds' trace
    n, out = data.num_agents, output.directory
    lay = padding.layout(n, mesh)
    clock = Stopwatch()  # elapsed_s and seconds: the run's work, not the time its process was stopped
    state = jax.jit(algorithm.init)(key)
    history: list[dict] = []
    done = 0
    if output.resume:
        state, done, history, clock.offset = _resume(output.files, state, fp, rounds, output.extend)
    if out is not None:
        replace_text(out / "fingerprint.json", json.dumps(fp, indent=1) + "\n")
        files.open_writer(out, tensorboard=output.tensorboard, keep=history)
        replace_text(out / "config.json",
                     json.dumps(_config_record(algorithm, config, rounds, every, key), indent=2) + "\n")
    if lay.padded:
        state, data = _pad_state(state, lay), lay.pad_data(data)
    if mesh is not None:
        from cbo_jax.sharding import shard_fields

        state, data = shard_fields(state, mesh), shard_fields(data, mesh)
    if output.progress:
        files.open_bar(rounds, desc=algorithm.name, unit="round", initial=done)
    rounds_ = _Rounds(algorithm, data, lay, fp, output, files, metrics, round_metrics, every, rounds, declared,
                      on_diverged, clock, history)
    checkpoint_every = output.checkpoint_every
    # Scans of step rounds (fewer to reach the next stop after a resume and at the end): at most
    # a couple of scan lengths compile. The rounds are the same whatever the scans. With a
    # progress bar, one round per scan: the bar moves when a round has finished, not only at
    # the evaluations (every=10 rounds of a large run can take many minutes).
    step = 1 if files.bar is not None else every if not checkpoint_every else math.gcd(every, checkpoint_every)
    state, done = drive(
        state, done, rounds,
        # Stop at the next evaluation round (multiples of every, and the last, also after a
        # resume) or checkpoint round (multiples of checkpoint_every).
        next_stop=lambda done: min(rounds, _next_multiple(done, every), _next_multiple(done, checkpoint_every or rounds)),
        length=lambda done, stop: min(step - done % step, stop - done), scan=rounds_.scan, at_stop=rounds_.at_stop)
    summary = {"algorithm": algorithm.name, "rounds": rounds, "num_agents": n,
               "seconds": round(clock(), 2),
               "fingerprint": _fingerprint_hash(fp)}
    if clusters is not None:
        summary["num_clusters"] = clusters
    summary.update({f"final_{k}": v for k, v in history[-1].items() if k not in ("round", "elapsed_s")})
    if rounds_.diverged:
        summary["diverged"] = sorted(rounds_.diverged)  # every agent that diverged in this process's rounds
    files.finish()  # the rows written and the bar closed before the files that mark the run finished
    if out is not None:
        # The plot before the summary, which marks the run finished (`finished`, a resume): an
        # interrupt while the plot is drawn would leave a finished run without its metrics.png.
        if output.plots:
            plot_history(history, out / "metrics.png", title=algorithm.name)
        write_summary(out / "summary.json", summary)
    return RunResult(lay.unpad_state(state), history, summary)


class _Rounds:
    """The federated run's work of the driver (:func:`cbo_jax.runtime.driver.drive`): ``scan`` runs
    compiled rounds; ``at_stop`` (an evaluation round, a checkpoint round, the end) evaluates,
    writes the rows, reports diverged agents and checkpoints."""

    def __init__(self, algorithm, data, lay, fp, output, files, metrics, round_metrics, every, rounds, declared,
                 on_diverged, clock, history):
        self.algorithm, self.data, self.lay, self.fp, self.output, self.files = algorithm, data, lay, fp, output, files
        self.metrics, self.round_metrics, self.every, self.rounds = metrics, round_metrics, every, rounds
        self.declared, self.on_diverged, self.clock, self.history = declared, on_diverged, clock, history
        self.last_eval: dict = {}
        self.diverged: set[int] = set()  # the agents that diverged so far (warned about once)

    def scan(self, state, done: int, length: int):
        state, rec = _scan_rounds(state, self.data, round_fn=self.algorithm.round,
                                  eval_models=self.algorithm.eval_models, layout=self.lay, metrics=self.round_metrics,
                                  length=length, taken=self.declared)
        if self.files.bar is not None:  # fetched once: the bar shows the round's metrics, the rows take them below
            rec = jax.device_get(rec)
            advance(self.files.bar, length,
                    _postfix(self.last_eval, {k: v[-1] for k, v in rec[0].items() if np.ndim(v) == 1}))
        return state, rec

    def at_stop(self, state, start: int, done: int, recs: list):
        recs = jax.device_get(recs)
        news = _diverged_news(start, recs, self.diverged)
        recs = [(length, to_python(row)) for length, (row, _) in recs]
        user = self.lay.unpad_state(state)
        evaluate = done % self.every == 0 or done == self.rounds
        if evaluate:
            kind, params = self.algorithm.eval_models(user)
            taken = {k: "a round metric" for _, rec in recs[:1] for k in rec}  # a row holds both kinds
            self.last_eval = _merge(self.metrics, Evaluation(done, done == self.rounds, user, kind, params),
                                    "the metric", taken)
        self._write_rows(start, done, recs, evaluate)
        if self.files.bar is not None and evaluate:  # drawn with the next round's move, or when the bar closes
            self.files.bar.set_postfix(_postfix(self.last_eval, self.history[-1]), refresh=False)
        for r, agents, servers in news:  # after the rows up to them are written
            message = _diverged_message(self.algorithm.name, r, agents, servers)
            if self.on_diverged == "stop":
                out = self.output.directory
                raise DivergedError(f"{message}; the run stops (on_diverged='stop'), its rows up to round {done} "
                                    f"are written" + (f" in {out}" if out is not None else ""))
            warnings.warn(f"{message} (on_diverged='stop' / --on-diverged stop stops the run instead)",
                          RuntimeWarning, stacklevel=5)
        every_ckpt = self.output.checkpoint_every
        if every_ckpt and (done % every_ckpt == 0 or done == self.rounds):
            ckpt.save(self.output.directory / "checkpoint", user, step=done, meta={"run": self.fp}, overwrite=True)
        return state, done, False

    def _write_rows(self, start: int, done: int, recs: list, evaluate: bool) -> None:
        r = start
        for length, rec in recs:
            for i in range(length):
                r += 1
                row: dict[str, Any] = {"round": r}
                row.update(jax.tree_util.tree_map(lambda v: v[i], rec, is_leaf=lambda v: isinstance(v, list)))
                if evaluate and r == done:
                    row.update(self.last_eval)
                    row["elapsed_s"] = round(self.clock(), 3)
                self.history.append(row)
                if self.files.writer is not None:
                    self.files.writer.write(row)


@functools.partial(jax.jit, static_argnames=("algorithm", "names", "metrics", "length", "taken"), donate_argnums=(0,))
def _scan_sweep(states, values, data, *, algorithm, names, metrics, length: int, taken: tuple = ()):
    """``length`` rounds of every grid point: the rounds' scan (as :func:`_scan_rounds`) of the
    algorithm built from the point's traced numbers, ``vmap``-ped over the points."""
    def one(state, vals):
        alg = _sweep.algorithm_at(algorithm, names, vals)

        def body(s, _):
            s, info = alg.round(s, data)
            row = _merge(metrics, info, "the round metric", dict(taken))
            flags = getattr(info, "diverged", None)
            if flags is not None:
                row["diverged_agents"] = jnp.sum(flags, dtype=jnp.int32)
            return s, row

        return jax.lax.scan(body, state, None, length=length)

    return _sweep.traced(jax.vmap(one), names)(states, values)


@functools.partial(jax.jit, static_argnames=("algorithm", "names"))
def _init_sweep(key, values, *, algorithm, names):
    return _sweep.traced(jax.vmap(lambda v: _sweep.algorithm_at(algorithm, names, v).init(key)), names)(values)


def _run_sweep(algorithm, data, rounds, key, grid, output: Output, files: RunFiles, *, metrics, round_metrics, every,
               config, clusters, declared=(), on_diverged="warn") -> RunResult:
    """:func:`run` of a grid (``params=``): the rounds of every point in one vmapped scan, the
    evaluation metrics point by point, rows and summary holding nested lists of the grid's shape."""
    n, out, names, shape = data.num_agents, output.directory, grid.names, grid.shape
    values = grid.arrays()
    clock = Stopwatch()
    padding.check_agents(algorithm, jax.eval_shape(algorithm.init, key), n)
    states = _init_sweep(key, values, algorithm=algorithm, names=names)
    if out is not None:
        record = _config_record(algorithm, config, rounds, every, key)
        if isinstance(record, dict):
            record = {**record, "sweep": grid.record()}
        replace_text(out / "config.json", json.dumps(record, indent=2) + "\n")
        files.open_writer(out, tensorboard=False, keep=[])
    if output.progress:
        files.open_bar(rounds, desc=f"{algorithm.name} sweep of {grid.size}", unit="round")
    history: list[dict] = []
    warned: set[int] = set()
    done = 0
    while done < rounds:
        stop = min(rounds, _next_multiple(done, every))
        length = 1 if files.bar is not None else stop - done
        states, rec = _scan_sweep(states, values, data, algorithm=algorithm, names=names, metrics=round_metrics,
                                  length=length, taken=declared)
        rec = to_python(jax.device_get(rec))  # {name: [P][length] ...}
        for i in range(length):
            r = done + i + 1
            row: dict[str, Any] = {"round": r}
            row.update({k: _sweep.nested([v[p][i] for p in range(grid.size)], shape) for k, v in rec.items()})
            history.append(row)
        done += length
        if files.bar is not None:
            advance(files.bar, length, {})
        if done == stop:  # an evaluation round (a multiple of every, or the last)
            last = history[-1]
            last.update(_evaluate_sweep(algorithm, states, grid, metrics, done, done == rounds, last))
            last["elapsed_s"] = round(clock(), 3)
        if files.writer is not None:
            for row in history[-length:]:
                files.writer.write(row)
        for row in history[-length:]:  # after the rows up to them are written
            _sweep_diverged(algorithm.name, grid, row, warned, on_diverged, out, row["round"])
    summary = {"algorithm": algorithm.name, "rounds": rounds, "num_agents": n, "seconds": round(clock(), 2),
               "sweep": grid.record(), "points": grid.size}
    if clusters is not None:
        summary["num_clusters"] = clusters
    summary.update({f"final_{k}": v for k, v in history[-1].items() if k not in ("round", "elapsed_s")})
    if warned:
        summary["diverged_points"] = sorted(warned)
    files.finish()
    if out is not None:
        if output.plots:
            _sweep.plot_sweep(history, grid, out / "sweep.png", title=f"{algorithm.name}: sweep of {', '.join(names)}")
        write_summary(out / "summary.json", summary)
    states = jax.tree_util.tree_map(lambda a: a.reshape(shape + a.shape[1:]), states)
    return RunResult(states, history, summary)


def _evaluate_sweep(algorithm, states, grid, metrics, done: int, last: bool, row: dict) -> dict:
    """The evaluation metrics of every grid point, as nested lists of the grid's shape."""
    per_point = []
    for p in range(grid.size):
        state = jax.tree_util.tree_map(lambda a: a[p], states)
        kind, params = algorithm.eval_models(state)
        taken = {k: "a round metric" for k in row if k not in _ROW_KEYS}
        per_point.append(to_python(_merge(metrics, Evaluation(done, last, state, kind, params), "the metric", taken)))
    keys = list(dict.fromkeys(k for d in per_point for k in d))
    return {k: _sweep.nested([d.get(k) for d in per_point], grid.shape) for k in keys}


def _sweep_diverged(name: str, grid, row: dict, warned: set, on_diverged: str, out, done: int) -> None:
    """Warn (or, with ``on_diverged="stop"``, raise) once per grid point whose models diverged."""
    counts = row.get("diverged_agents")
    if counts is None:
        return
    flat = np.asarray(counts).reshape(-1)
    new = [p for p in np.flatnonzero(flat > 0) if p not in warned]
    if not new:
        return
    warned.update(int(p) for p in new)
    message = (f"{name} sweep, round {done}: agents of grid point{'s' if len(new) > 1 else ''} "
               f"{'; '.join(grid.label(int(p)) for p in new)} hold a NaN or an infinity (diverged) and are left out "
               f"of every average; the rows count them (diverged_agents)")
    if on_diverged == "stop":
        raise DivergedError(f"{message}; the run stops (on_diverged='stop')" + (f", its rows up to round {done} are "
                                                                               f"written in {out}" if out else ""))
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _next_multiple(done: int, k: int) -> int:
    return (done // k + 1) * k


def _postfix(last_eval: dict, latest_round: dict) -> dict:
    """The progress bar's numbers: the latest evaluation's, then the latest round's own
    metrics (the mean local loss of ``round_stats``), three at most."""
    round_part = _scalars(to_python(latest_round))
    if "train_loss" in round_part:  # before ε, the selection rates and the other round metrics
        round_part = {"train_loss": round_part.pop("train_loss"), **round_part}
    latest = {**_scalars(to_python(last_eval)), **round_part}
    shown = [(k, v) for k, v in latest.items()
             if k not in ("round", "elapsed_s", "participants") and not (k == "diverged_agents" and v == 0)]
    return {k: f"{v:.4g}" for k, v in shown[:3]}


def _scalars(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def plot_history(history: list[dict], path: Path, title: str = "") -> Path | None:
    """Every scalar metric against the round, one panel each (``sr`` with its oracle)."""
    from cbo_jax.runtime.plotting import subplots

    keys = [k for k in dict.fromkeys(k for r in history for k in _scalars(r)) if k not in ("round", "elapsed_s")]
    if not any(r.get("diverged_agents") for r in history):  # no panel of zeros in every run's figure
        keys = [k for k in keys if k != "diverged_agents"]
    panels = [k for k in keys if not (k.endswith("_oracle") and k[:-len("_oracle")] in keys)]  # a pair: one panel
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, k in zip(axes.ravel(), panels):
        for name, style in ((k, "-"), (f"{k}_oracle", "--")):
            pts = [(r["round"], r[name]) for r in history if isinstance(r.get(name), (int, float))]
            if pts:
                ax.plot(*zip(*pts), style, marker="o" if len(pts) < 30 else None, ms=3, label=name)
        ax.set_xlabel("communication round")
        ax.set_title(k)
        ax.grid(alpha=0.3)
        if f"{k}_oracle" in keys:
            ax.legend(fontsize=8)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
