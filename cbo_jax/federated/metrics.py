"""Metrics of a federated run: plain functions passed to :func:`cbo_jax.federated.run`.

Metrics may read the true cluster ids and the attacker mask; algorithms may not. Two
kinds, both built by the factories below:

* **round metrics** ``f(info) -> dict`` see the round's info (the algorithm's own
  NamedTuple, padding agents already removed) inside the jitted scan, every round, and
  return arrays (or nested dicts of them). A metric that needs a field the info does
  not have returns ``{}``, so one list of metrics fits every algorithm.
  :func:`round_stats` (mean local loss, ε, participants), :func:`selection` (SR_n of
  Remark 6 and its oracle, selection frequency by cluster), :func:`cluster_purity`
  (IFCA), :func:`attack_selection` (FedCB²O Fig. 5: share and weight of downloads by
  same/other cluster × benign/malicious).
* **evaluation metrics** ``f(ev: Evaluation) -> dict`` run on the host at evaluation
  rounds with the state of the real agents and the models the algorithm exposes
  (``eval_models``). :func:`test_accuracy` (mean test accuracy over agents, as the
  FedCBO paper reports it, or the test loss of a regression model),
  :func:`attack_accuracy` (FedCB²O §3.5: overall and source-class accuracy, attack
  success rate), :func:`pooled` (FedSGLD: the server model's pooled training loss and
  accuracy), :func:`privacy` (FedSGLD's per-device (ε, δ) after the round).

Accuracy convention (:func:`test_accuracy`): for per-agent models (FedCBO, Local),
agent ``j``'s own model on its test set; for server models (FedAvg, IFCA), each test
set uses the server model with the smallest loss on it, and agents inherit the
accuracy of their test set.
"""

from __future__ import annotations

# The two kinds, one module each; this module is their public path.
from cbo_jax.federated._eval_metrics import (Evaluation, attack_accuracy, attack_metrics, pooled, privacy, returning,
                                            test_accuracy)
from cbo_jax.federated._round_metrics import (CATEGORIES, attack_losses, attack_selection, category_stats,
                                             cluster_purity, oracle_selection_rate, round_stats, selection,
                                             selection_frequency, selection_rate)
from cbo_jax.models import Model

# Private names of the modules above, importable from here too (tests and benchmarks reach in through this module).
from cbo_jax.federated._eval_metrics import (_MAX_GROUPS, PyTree, _acc_loss, _agent_eval,  # noqa: F401
                                            _agent_eval_impl, _attack_eval, _attack_eval_impl, _check_test_values,
                                            _grouped_eval, _grouped_eval_impl, _pooled, _pooled_jit, _server_eval,
                                            _server_eval_impl)
from cbo_jax.federated._round_metrics import _AttackSelection, _ClusterMetric, _Purity, _Selection  # noqa: F401

__all__ = ["Evaluation", "round_stats", "selection", "cluster_purity", "attack_selection", "attack_losses",
           "test_accuracy", "attack_accuracy", "pooled", "privacy", "default_metrics", "selection_rate", "oracle_selection_rate",
           "selection_frequency", "category_stats", "attack_metrics", "returning", "CATEGORIES"]


def default_metrics(model: Model, data, *, chunk: int = 8, test_size: int | None = None, log=print):
    """``(round_metrics, metrics)`` for a :class:`~cbo_jax.federated.data.FederatedData`:
    the round statistics, the selection and IFCA metrics when the data has cluster ids,
    and the test accuracy when it has test sets. Says which metrics it skips and why."""
    round_metrics, metrics = [round_stats], []
    if data.cluster is not None:
        round_metrics += [selection(data.cluster), cluster_purity(data.cluster)]
    elif log is not None:
        log("no cluster ids in the data: SR_n, selection frequency and cluster purity are skipped")
    if data.test_x is not None:
        metrics.append(test_accuracy(model, data, chunk=chunk, test_size=test_size))
    elif log is not None:
        log("no test sets in the data: test accuracy is skipped")
    return round_metrics, metrics
