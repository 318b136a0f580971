"""Evaluation metrics of a federated run: ``f(ev: Evaluation) -> dict`` on the host, at evaluation rounds.

:class:`~cbo_jax.federated.metrics.Evaluation` (what they see),
:func:`~cbo_jax.federated.metrics.returning` (the names they return),
:func:`~cbo_jax.federated.metrics.test_accuracy`,
:func:`~cbo_jax.federated.metrics.attack_accuracy` (with
:func:`~cbo_jax.federated.metrics.attack_metrics`), :func:`~cbo_jax.federated.metrics.pooled`
and :func:`~cbo_jax.federated.metrics.privacy`, and the compiled evaluations behind them.
Public path: :mod:`cbo_jax.federated.metrics`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax import _checks
from cbo_jax.federated._data_checks import _BOOL_HINT, check_labels, check_test_sets
from cbo_jax.models import Model, zero_padding

PyTree = Any


class Evaluation(NamedTuple):
    """What an evaluation metric sees: the round, whether it is the run's last, the
    state of the real agents, and ``algorithm.eval_models(state)`` as ``kind``/``params``.

    ``state`` and ``params`` may be the run's own buffers, which the next rounds' compiled
    scan takes over (donates) and deletes: use them during the call, and copy what a metric
    keeps for later (``jax.tree_util.tree_map(jnp.copy, ev.params)``, or NumPy arrays).
    Reading a kept, uncopied array after the next rounds raises "Array has been deleted"."""

    round: int
    last: bool
    state: Any
    kind: str
    params: PyTree


def returning(name: str, names) -> Callable[[Callable], Callable]:
    """Decorator for an evaluation metric: its ``__name__`` (what error messages call it) and
    ``returns``, the names it returns. :func:`cbo_jax.federated.run` checks declared names
    against each other and against the round metrics' before the first round; a metric that
    declares none is checked at its first evaluation."""
    def mark(fn):
        fn.__name__ = fn.__qualname__ = name
        fn.returns = tuple(names)
        return fn
    return mark


def _acc_loss(model: Model, params, x, y, count):
    """Accuracy and mean loss of one model on one test set (its first ``count`` samples). A
    model with a non-finite output on an evaluated sample (diverged) scores a NaN accuracy:
    the argmax of NaN logits is class 0, an accuracy of the share of class 0."""
    out = model.apply(params, x)
    per = model.loss(out, y)
    hit = (jnp.argmax(out, -1) == y) if model.is_classifier else jnp.zeros(per.shape, bool)
    broken = ~jnp.all(jnp.isfinite(out).reshape(out.shape[0], -1), axis=-1)
    if count is None:
        acc = jnp.mean(hit)
        return jnp.where(jnp.any(broken), jnp.nan, acc), jnp.mean(per)
    real = jnp.arange(x.shape[0]) < count
    n = jnp.maximum(count, 1).astype(per.dtype)
    acc = jnp.sum(hit & real) / n
    return jnp.where(jnp.any(broken & real), jnp.nan, acc), jnp.sum(jnp.where(real, per, 0.0)) / n


def _agent_eval_impl(model, chunk, params, test_x, test_y, test_counts, test_of):
    def one(args):
        p, t = args
        return _acc_loss(model, p, test_x[t], test_y[t], None if test_counts is None else test_counts[t])

    return jax.lax.map(one, (params, test_of), batch_size=chunk)


def _server_eval_impl(model, chunk, params, test_x, test_y, test_counts):
    def one(p):
        if test_counts is None:
            return jax.vmap(lambda x, y: _acc_loss(model, p, x, y, None))(test_x, test_y)
        return jax.vmap(lambda x, y, c: _acc_loss(model, p, x, y, c))(test_x, test_y, test_counts)

    return jax.lax.map(one, params, batch_size=chunk)


def _grouped_eval_impl(model, chunk, groups, params, test_x, test_y, test_counts):
    """:func:`_agent_eval_impl` with the agents grouped by test set (``groups[t]``: the
    agents measured on test set ``t``, a static tuple).

    Within a group the test inputs are the same for every agent of a chunk, so a chunk's
    forward pass is one matrix product ``(T × d_in) @ (d_in × chunk·h)`` rather than
    ``chunk`` separate ones over copies of the test set. Accuracies are the same numbers
    as the per-agent path; losses equal it up to float32 summation order.
    """
    accs, losses, order = [], [], []
    for t, agents in enumerate(groups):
        if not agents:
            continue
        count = None if test_counts is None else test_counts[t]
        acc, loss = jax.lax.map(lambda p: _acc_loss(model, p, test_x[t], test_y[t], count),
                                jax.tree_util.tree_map(lambda a: a[np.asarray(agents)], params), batch_size=chunk)
        accs.append(acc)
        losses.append(loss)
        order.extend(agents)
    back = np.argsort(np.asarray(order))
    return jnp.concatenate(accs)[back], jnp.concatenate(losses)[back]


_agent_eval = jax.jit(_agent_eval_impl, static_argnums=(0, 1))
_grouped_eval = jax.jit(_grouped_eval_impl, static_argnums=(0, 1, 2))
# Group agents by test set when the sets are few (clusters), not one per agent.
_MAX_GROUPS = 64
_server_eval = jax.jit(_server_eval_impl, static_argnums=(0, 1))


def _check_test_values(model: Model, test_x, test_y, counts, test_size: int | None = None) -> None:
    """The evaluated test samples (the first ``test_size`` of each set, within ``counts``):
    finite inputs and targets, and a classifier's labels integers in ``[0, C)``. Checked when
    a metric is built: left to the first evaluation, after the first rounds, NaN inputs would
    score a NaN loss and an accuracy of chance, and float labels would fail inside the loss."""
    n_test = np.shape(test_x)[1] if test_size is None else min(test_size, np.shape(test_x)[1])
    evaluated = np.arange(n_test)[None, :] < (n_test if counts is None else np.asarray(counts)[:, None])
    for name, arr in (("test inputs test_x", test_x), ("test targets test_y", test_y)):
        arr = np.asarray(arr[:, :test_size])
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).reshape(arr.shape[:2] + (-1,)).all(-1)[
                np.broadcast_to(evaluated, arr.shape[:2])].all():
            raise ValueError(f"the {name} hold NaN or infinite values")
    if model.num_classes is not None:  # a classifier
        if not np.issubdtype(np.asarray(test_y).dtype, np.integer) or np.ndim(test_y) != 2:
            bool_hint = _BOOL_HINT if np.asarray(test_y).dtype == np.bool_ else ""
            raise ValueError(f"a classifier needs integer test labels test_y of shape (T, n_test), got "
                             f"{np.asarray(test_y).dtype} {np.shape(test_y)} (model {model.name}){bool_hint}")
        check_labels(test_y[:, :test_size], None if counts is None else np.asarray(counts), model.num_classes,
                     "test_y", model=f"model {model.name}", unit="test set")


def test_accuracy(model: Model, data, *, chunk: int = 8, test_size: int | None = None,
                  agents: str = "all") -> Callable:
    """Test accuracy (%) and loss in the paper's convention (module docstring).

    Agents that share a test set (one per cluster, or one for all) are evaluated
    together, one matrix product over the shared test inputs per chunk of ``chunk``
    agents; with one test set per agent each agent is evaluated on its own.

    ``data``: a :class:`~cbo_jax.federated.data.FederatedData` with test sets. Returns
    ``test_acc``, ``test_loss`` and, with cluster ids, ``test_acc_per_cluster`` (server
    models: also ``server_model_per_cluster``); a regression model reports ``test_loss``
    only. ``test_size``: evaluate on the first ``test_size`` samples of each test set.

    The per-cluster lists are indexed by cluster id, ``0 .. max id``. Ids need not be
    contiguous: an id no agent has (the 1 of clusters ``{0, 2}``) gets ``None`` (``null``
    in ``metrics.jsonl``), as in :func:`attack_metrics`, rather than the NaN of an empty
    mean; ``test_acc`` and ``test_loss`` are means over the agents and do not depend on it.

    ``agents``: ``"all"`` (default) -- the run's agents are ``data``'s, one for one (a run of
    another number of agents is an error); ``"first"`` -- ``data`` describes the first
    ``data.num_agents`` agents of the run, whose own models are measured (FedCB²O on one's own
    data: the benign agents come first, ``data`` holds their test sets). A model whose outputs
    are not finite (diverged) scores a NaN accuracy, not that of the class its NaN logits
    point to.
    """
    _checks.one_of("agents", agents, ("all", "first"))
    if data.test_x is None:
        raise ValueError("test_accuracy needs test sets (FederatedData.test_x/test_y)")
    if hasattr(data, "check_test_shapes"):  # here, not at the first evaluation after the first rounds
        data.check_test_shapes()
    _checks.positive_int("chunk", chunk)
    if test_size is not None:  # a slice bound: -1 would silently drop each set's last sample
        _checks.positive_int("test_size", test_size)
    test_x, test_y = jnp.asarray(data.test_x[:, :test_size]), jnp.asarray(data.test_y[:, :test_size])
    counts = None if data.test_counts is None else jnp.minimum(jnp.asarray(data.test_counts), test_x.shape[1])
    test_of = data.test_index()
    n = data.num_agents
    # What check() validates and the evaluation would otherwise take silently (JAX clamps an
    # index past the test sets; a label past the classes never counts as a hit).
    if test_of.shape != (n,) or test_of.max(initial=0) >= test_x.shape[0]:
        raise ValueError(f"test_of must map each of the {n} agents to one of the {test_x.shape[0]} test sets, got "
                         f"{test_of.tolist()[:10]}{' ...' if test_of.size > 10 else ''}")
    if counts is not None:  # an empty test set would score accuracy 0 and loss 0 into the agents' means
        empty = sorted(set(int(t) for t in test_of) & set(np.flatnonzero(np.asarray(counts) < 1).tolist()))
        if empty:
            raise ValueError(f"test sets {empty[:10]} have no samples (test_counts < 1) but agents "
                             f"{np.flatnonzero(np.isin(test_of, empty))[:10].tolist()} are measured on them")
    cluster = None if data.cluster is None else _checks.cluster_ids("cluster", data.cluster)
    if cluster is not None and cluster.shape != (n,):
        raise ValueError(f"cluster must hold one id per agent ({n}), got {cluster.shape[0]}")
    _check_test_values(model, data.test_x, data.test_y, None if counts is None else np.asarray(counts), test_size)
    ids = () if cluster is None else tuple(range(int(cluster.max(initial=-1)) + 1))
    has = {k: bool(np.any(cluster == k)) for k in ids}
    t = test_x.shape[0]
    clf = model.is_classifier
    groups = tuple(tuple(int(j) for j in np.flatnonzero(test_of == k)) for k in range(t))
    names = (["test_acc"] + list(DISTRIBUTION) if clf else []) + ["test_loss"] + (
        (["test_acc_per_cluster"] if clf else []) + ["server_model_per_cluster"] if cluster is not None else [])

    @returning("test_accuracy", names)
    def metric(ev: Evaluation) -> dict:
        out: dict[str, Any]
        if ev.kind == "agent":
            rows = {np.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(ev.params)}
            params = ev.params
            if agents == "first" and len(rows) == 1 and min(rows) >= n:
                params = jax.tree_util.tree_map(lambda a: a[:n], ev.params)
            elif rows != {n}:  # another data's metric: its agents' test sets would be used (indices clamped)
                first = (" (to measure the first of more agents, the benign ones of FedCB²O, pass agents='first')"
                         if agents == "all" and len(rows) == 1 and min(rows) > n else "")
                raise ValueError(f"test_accuracy was built for the {n} agents of its data, but the run's models are "
                                 f"{' or '.join(map(str, sorted(rows)))} agents: build the metric from the data the "
                                 f"run trains on{first}")
            if t <= _MAX_GROUPS and t < len(test_of):
                acc, loss = _grouped_eval(model, chunk, groups, params, test_x, test_y, counts)
            else:
                acc, loss = _agent_eval(model, chunk, params, test_x, test_y, counts, jnp.asarray(test_of))
            out = {"test_acc": float(jnp.mean(acc)) * 100, "test_loss": float(jnp.mean(loss)),
                   **distribution(np.asarray(acc, np.float64) * 100)}
            if cluster is not None:
                c = jnp.asarray(cluster)
                out["test_acc_per_cluster"] = [float(jnp.mean(acc[c == k])) * 100 if has[k] else None for k in ids]
        elif ev.kind == "server":
            acc, loss = _server_eval(model, chunk, ev.params, test_x, test_y, counts)  # (R, T)
            best = jnp.argmin(loss, axis=0)
            acc_t, loss_t = acc[best, jnp.arange(t)], loss[best, jnp.arange(t)]
            per_set = jnp.bincount(jnp.asarray(test_of), length=t).astype(jnp.float32)  # agents per test set
            out = {"test_acc": float(jnp.sum(acc_t * per_set) / jnp.sum(per_set)) * 100,
                   "test_loss": float(jnp.sum(loss_t * per_set) / jnp.sum(per_set)),
                   **distribution(np.asarray(acc_t, np.float64)[test_of] * 100)}
            if cluster is not None:
                per_agent = np.asarray(acc_t, np.float64)[test_of]
                out["test_acc_per_cluster"] = [float(np.mean(per_agent[cluster == k])) * 100 if has[k] else None
                                               for k in ids]
                best_np = np.asarray(best)
                out["server_model_per_cluster"] = [int(best_np[test_of[np.argmax(cluster == k)]]) if has[k] else None
                                                   for k in ids]
        else:
            raise ValueError(f"eval_models must return kind 'agent' or 'server', got {ev.kind!r}")
        if not clf:
            out = {k: v for k, v in out.items() if not k.startswith("test_acc")}
        return out

    return metric


DISTRIBUTION = ("test_acc_p10", "test_acc_median", "test_acc_p90", "test_acc_worst10")


def distribution(per_agent: np.ndarray) -> dict:
    """The agents' test accuracies (%) as a distribution: the 10th, 50th and 90th percentiles
    (linear interpolation) and the mean of the worst decile (the ``ceil(N/10)`` lowest)."""
    a = np.sort(np.asarray(per_agent, np.float64))
    if a.size == 0:
        return {}
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {"test_acc_p10": float(p10), "test_acc_median": float(p50), "test_acc_p90": float(p90),
            "test_acc_worst10": float(np.mean(a[: max(1, -(-a.size // 10))]))}


def _attack_eval_impl(model, chunk, test_batch, params, test_x, test_y, cluster, source, target):
    n_test = test_x.shape[1]
    nbat = -(-n_test // test_batch)
    pad = nbat * test_batch - n_test
    xs = jnp.pad(test_x, [(0, 0), (0, pad)] + [(0, 0)] * (test_x.ndim - 2))
    real = jnp.arange(nbat * test_batch) < n_test
    ys = jnp.pad(test_y, [(0, 0), (0, pad)])

    def one(args):
        p, c = args
        x = xs[c].reshape((nbat, test_batch) + xs.shape[2:])
        pred = jax.lax.map(lambda xb: jnp.argmax(model.apply(p, xb), axis=-1), x).reshape(-1)
        y = ys[c]
        src = (y == source) & real
        n_src = jnp.maximum(jnp.sum(src), 1)
        return (jnp.sum((pred == y) & real) / n_test, jnp.sum((pred == y) & src) / n_src,
                jnp.sum((pred == target) & src) / n_src)

    return jax.lax.map(one, (params, cluster), batch_size=chunk)


_attack_eval = jax.jit(_attack_eval_impl, static_argnums=(0, 1, 2))


def attack_metrics(model: Model, params: PyTree, test_x, test_y, cluster, source: int, target: int, chunk: int = 8,
                   test_batch: int = 2000) -> dict:
    """Overall accuracy, source-class accuracy and attack success rate (%), means over agents.

    Args:
      params: the benign agents' models ``(N_b, ...)``.
      test_x, test_y: ``(K, n_test, ...)`` per-cluster test sets.
      cluster: ``(N_b,)`` the benign agents' clusters.
      source, target: the attack's classes.
      chunk, test_batch: agents evaluated at once, test images per forward pass.
    """
    test_x, test_y, cluster = jnp.asarray(test_x), jnp.asarray(test_y), jnp.asarray(cluster)
    tb = int(min(test_batch, test_x.shape[1]))
    acc, src, asr = _attack_eval(model, chunk, tb, params, test_x, test_y, cluster, jnp.int32(source), jnp.int32(target))
    k = test_x.shape[0]
    out: dict[str, Any] = {"overall_acc": float(jnp.mean(acc)) * 100, "source_acc": float(jnp.mean(src)) * 100,
           "asr": float(jnp.mean(asr)) * 100}
    for name, v in (("overall_acc", acc), ("source_acc", src), ("asr", asr)):
        out[f"{name}_per_cluster"] = [float(jnp.mean(v[cluster == c])) * 100 if bool(jnp.any(cluster == c)) else None
                                      for c in range(k)]
    return out


def attack_accuracy(model: Model, dataset, cluster=None, *, chunk: int = 8, test_size: int | None = None) -> Callable:
    """FedCB²O §3.5 metrics of the benign agents' own models (the first ``N_b`` rows).

    ``dataset``: the :class:`~cbo_jax.federated.attacks.AttackDataset` (test sets, the
    attack's classes, the benign count); ``cluster``: the population's true clusters
    (default the dataset's). ``test_size`` samples per test set at intermediate
    evaluations; the last one uses the whole test sets.
    """
    _checks.positive_int("chunk", chunk)
    if test_size is not None:
        _checks.positive_int("test_size", test_size)
    nb = dataset.num_benign
    c_benign = _checks.cluster_ids("cluster", dataset.cluster if cluster is None else cluster)[:nb]
    # checked here, not at the first evaluation after the first rounds
    k = np.shape(dataset.test_x)[0]
    if c_benign.shape != (nb,) or c_benign.max(initial=0) >= k:
        raise ValueError(f"attack_accuracy needs a cluster id in [0, {k}) (one test set each) for each of the {nb} "
                         f"benign agents, got {c_benign.tolist()[:10]}{' ...' if c_benign.size > 10 else ''}")
    if model.num_classes is None:
        raise ValueError(f"attack_accuracy measures a classifier; model {model.name} has no classes")
    for name, c in (("source", dataset.source), ("target", dataset.target)):
        if not _checks.is_integer(c) or not 0 <= int(c) < model.num_classes:
            raise ValueError(f"the attack's {name} class must be in [0, {model.num_classes}) for model {model.name}, "
                             f"got {c!r}")
    check_test_sets(dataset.test_x, dataset.test_y, None, np.shape(dataset.test_x)[2:])
    _check_test_values(model, dataset.test_x, dataset.test_y, None)

    @returning("attack_accuracy", [f"{m}{e}" for m in ("overall_acc", "source_acc", "asr") for e in ("", "_per_cluster")])
    def metric(ev: Evaluation) -> dict:
        benign = jax.tree_util.tree_map(lambda a: a[:nb], ev.params)
        n_test = None if ev.last else test_size
        return attack_metrics(model, benign, dataset.test_x[:, :n_test], dataset.test_y[:, :n_test], c_benign,
                              dataset.source, dataset.target, chunk=chunk)

    return metric


def _pooled(model, params, x, y, counts):
    mask = jnp.arange(x.shape[1])[None, :] < counts[:, None]
    # padding rows may hold NaN (not data): zeroed, and their losses masked with where (0 · NaN is NaN)
    out = jax.vmap(lambda xi: model.apply(params, xi))(zero_padding(x, mask))  # (N, n, C)
    real = mask.astype(jnp.float32)
    per = jnp.where(mask, jax.vmap(model.loss)(out, y), 0.0)
    # a regression model has no accuracy (argmax over its outputs against float targets would be 0, or
    # a broadcasting error for targets of more than one dimension)
    hit = (jnp.argmax(out, -1) == y).astype(jnp.float32) if model.is_classifier else jnp.zeros(real.shape)
    total = jnp.maximum(jnp.sum(real), 1.0)
    per_device = jnp.sum(per * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1.0)
    return jnp.sum(per * real) / total, jnp.sum(hit * real) / total, jnp.mean(per_device)


_pooled_jit = jax.jit(_pooled, static_argnums=0)


def pooled(model: Model, train, test_x, test_y, test_counts) -> Callable:
    """The server model's pooled metrics (FedSGLD): ``train_loss`` (pooled over every
    training sample), ``objective`` (``(1/N) Σ_i F_i``), ``train_acc`` and ``test_acc`` (%;
    a classifier's only). ``test_counts``: ``None`` when every test set is whole.

    For algorithms with one server model (FedSGLD, FedPD, FedAvg); per-agent models or
    several server models (FedCBO, IFCA) are refused at the first evaluation rather than
    reported as agent 0's or server model 0's."""
    # checked here, not at the first evaluation after the first rounds
    check_test_sets(test_x, test_y, test_counts, np.shape(train.x)[2:])
    _check_test_values(model, test_x, test_y, test_counts)
    train = jax.tree_util.tree_map(jnp.asarray, train)
    test_x = jnp.asarray(test_x)
    counts = jnp.full(test_x.shape[:1], test_x.shape[1], jnp.int32) if test_counts is None else test_counts
    test = (test_x, jnp.asarray(test_y), jnp.asarray(counts))

    @returning("pooled", ["train_loss", "objective"] + (["train_acc", "test_acc"] if model.is_classifier else []))
    def metric(ev: Evaluation) -> dict:
        num = int(jax.tree_util.tree_leaves(ev.params)[0].shape[0])
        if ev.kind != "server" or num != 1:
            raise ValueError(f"pooled measures one server model (FedSGLD, FedPD, FedAvg); the algorithm exposes {num} "
                             f"{ev.kind} models: use test_accuracy")
        server = jax.tree_util.tree_map(lambda a: a[0], ev.params)
        loss, acc, obj = _pooled_jit(model, server, train.x, train.y, train.counts)
        _, tacc, _ = _pooled_jit(model, server, *test)
        out = {"train_loss": float(loss), "objective": float(obj)}
        if model.is_classifier:
            out.update(train_acc=float(acc) * 100, test_acc=float(tacc) * 100)
        return out

    return metric


def privacy(cfg, rounds: int, delta: float | None = None, device_sizes=None) -> Callable:
    """FedSGLD's per-device ``epsilon`` after each round (:func:`cbo_jax.federated.privacy.account`;
    per-sample clipping: the least protected device's, which needs ``device_sizes``, the ``n_i``).

    ε is tabled for ``rounds`` rounds; a run extended beyond them (``resume=True,
    extend=True``) gets the table recomputed for its later rounds.
    """
    from cbo_jax.federated import privacy as dp

    table = dp.account(cfg, rounds, delta, device_sizes=device_sizes).epsilon

    @returning("privacy", ["epsilon"])
    def metric(ev: Evaluation) -> dict:
        nonlocal table
        if ev.round > len(table):  # ε after k rounds does not depend on how many are tabled
            table = dp.account(cfg, max(ev.round, 2 * len(table)), delta, device_sizes=device_sizes).epsilon
        return {"epsilon": float(table[ev.round - 1])}

    return metric
