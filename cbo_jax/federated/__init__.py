"""Federated learning on stacked agents: algorithms, data, metrics and the one runner.

>>> import jax, cbo_jax.federated as fl
>>> data = fl.FederatedData.from_arrays(x, y, cluster=c, test_x=tx, test_y=ty)   # doctest: +SKIP
>>> model = fl.from_flax(MyModule(), x[0, :1])                                   # doctest: +SKIP
>>> alg = fl.fedcbo(model, fl.FedCBOConfig(M=5), data.num_agents)                 # doctest: +SKIP
>>> res = fl.run(alg, data, 20, jax.random.key(0),                               # doctest: +SKIP
...              metrics=[fl.metrics.test_accuracy(model, data)], out="results/mine")

An algorithm of one's own is an :class:`Algorithm` built from the same pieces the package's
algorithms use (``local_train``, ``participants``, ``broadcast``, ``diverged``, ``init_population``,
``per_agent_fields``); a selection rule of one's own is a :class:`SelectionRule` passed as
``fedcbo(..., rule=)`` (``docs/guides/extending.md``, ``examples/federated_custom_algorithm.py``).
"""

from cbo_jax.federated import datasets, metrics, partition, robust, selection, sweep
from cbo_jax.federated.aggregation import consensus_downloads, local_downloads
from cbo_jax.federated.algorithms import (Algorithm, DFedAvgMConfig, FedAvgConfig, FedCB2OConfig, FedCBOConfig,
                                          FedOptConfig, FedProxConfig, RobustConfig, fedadam, fedopt, fedprox,
                                          fedyogi, robust_dfedavg, DittoConfig, ditto,
                                          FedPDConfig, FedSGLDConfig, IFCAConfig, LocalConfig, SGLDConfig, dfedavgm,
                                          fedavg, fedcb2o, fedcbo, fedpd, fedsgld, ifca, local_only,
                                          ScaffoldConfig, scaffold, CFLConfig, cfl)
from cbo_jax.federated.algorithms.base import BaselineConfig, broadcast, diverged, participants, per_agent_fields
from cbo_jax.federated.algorithms.fedcb2o import class_losses, robustness_criterion
from cbo_jax.federated.attacks import AttackData
from cbo_jax.federated.data import AgentData, FederatedData, rotated_mnist
from cbo_jax.federated.local import LocalSGDConfig, local_train
from cbo_jax.federated.robust import krum, median, trimmed_mean
from cbo_jax.federated.runner import DivergedError, RunResult, run
from cbo_jax.federated.selection import SelectionRule, epsilon_greedy, prob_sampling, uniform
from cbo_jax.models import Model, from_flax, init_population

__all__ = ["AgentData", "Algorithm", "AttackData", "BaselineConfig", "DFedAvgMConfig", "DivergedError", "FedAvgConfig",
           "FedCB2OConfig", "FedCBOConfig",
           "FedPDConfig", "FedSGLDConfig", "FederatedData", "IFCAConfig", "LocalConfig", "LocalSGDConfig", "Model",
           "RunResult", "SGLDConfig", "SelectionRule", "class_losses", "consensus_downloads", "dfedavgm", "epsilon_greedy", "fedavg",
           "fedcb2o", "fedcbo", "fedpd", "fedsgld", "from_flax", "ifca", "local_downloads", "local_only", "metrics", "partition",
           "robust", "median", "trimmed_mean", "krum", "RobustConfig", "robust_dfedavg",
           "FedOptConfig", "fedopt", "fedadam", "fedyogi", "FedProxConfig", "fedprox", "DittoConfig", "ditto",
           "ScaffoldConfig", "scaffold", "CFLConfig", "cfl", "datasets", "sweep",
           "prob_sampling", "robustness_criterion", "rotated_mnist", "run", "uniform",
           # building an algorithm of one's own (docs/guides/extending.md)
           "broadcast", "diverged", "init_population", "local_train", "participants", "per_agent_fields", "selection"]
