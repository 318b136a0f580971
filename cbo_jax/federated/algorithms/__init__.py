"""Federated algorithms, each a pure ``(init, round)`` pair (see ``base.Algorithm``)."""

from cbo_jax.federated.algorithms.base import AgentData, Algorithm, RoundInfo
from cbo_jax.federated.algorithms.fedavg import FedAvgConfig, fedavg
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.ifca import IFCAConfig, ifca
from cbo_jax.federated.algorithms.local_only import LocalConfig, local_only

__all__ = ["AgentData", "Algorithm", "RoundInfo", "FedAvgConfig", "FedCBOConfig", "IFCAConfig", "LocalConfig",
           "fedavg", "fedcbo", "ifca", "local_only"]
