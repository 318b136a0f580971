"""Federated algorithms, each a pure ``(init, round)`` pair (see ``base.Algorithm``).

============  ==========================================  ====================================
name          builder                                     data its round takes
============  ==========================================  ====================================
fedcbo        :func:`fedcbo` (FedCBO Algorithm 1)         :class:`AgentData`
fedavg        :func:`fedavg`                              :class:`AgentData`
fedprox       :func:`fedprox`                             :class:`AgentData`
ditto         :func:`ditto` (personal models)             :class:`AgentData`
ifca          :func:`ifca`                                :class:`AgentData`
local         :func:`local_only`                          :class:`AgentData`
fedpd         :func:`fedpd` (also noisy FedPD)            :class:`AgentData`
fedsgld       :func:`fedsgld` (FedSGLD Algorithm 1)       :class:`AgentData`
fedadam       :func:`fedadam`, :func:`fedyogi`            :class:`AgentData`
              (server optimisers, :func:`fedopt`)
scaffold      :func:`scaffold` (control variates)         :class:`AgentData`
cfl           :func:`cfl` (clusters split by updates)     :class:`AgentData`
fedcb2o       :func:`fedcb2o` (FedCB²O Algorithm 1)       ``attacks.AttackData``
dfedavgm      :func:`dfedavgm` (the oracles)              ``attacks.AttackData``
dfedavg_RULE  :func:`robust_dfedavg` (median,             ``attacks.AttackData``
              trimmed mean, Krum)
============  ==========================================  ====================================
"""

from cbo_jax.federated.algorithms.base import AgentData, Algorithm, BaselineConfig
from cbo_jax.federated.algorithms.cfl import CFLConfig, cfl
from cbo_jax.federated.algorithms.dfedavgm import DFedAvgMConfig, dfedavgm
from cbo_jax.federated.algorithms.fedavg import FedAvgConfig, fedavg
from cbo_jax.federated.algorithms.fedcb2o import FedCB2OConfig, fedcb2o
from cbo_jax.federated.algorithms.fedcbo import FedCBOConfig, fedcbo
from cbo_jax.federated.algorithms.fedopt import FedOptConfig, fedadam, fedopt, fedyogi
from cbo_jax.federated.algorithms.fedprox import FedProxConfig, fedprox
from cbo_jax.federated.algorithms.ditto import DittoConfig, ditto
from cbo_jax.federated.algorithms.fedsgld import FedPDConfig, FedSGLDConfig, fedpd, fedsgld
from cbo_jax.federated.algorithms.ifca import IFCAConfig, ifca
from cbo_jax.federated.algorithms.local_only import LocalConfig, local_only
from cbo_jax.federated.algorithms.robust_dfedavg import RobustConfig, robust_dfedavg
from cbo_jax.federated.algorithms.scaffold import ScaffoldConfig, scaffold
from cbo_jax.federated.langevin import SGLDConfig

__all__ = ["AgentData", "Algorithm", "BaselineConfig", "DFedAvgMConfig", "DittoConfig", "FedAvgConfig", "FedCB2OConfig", "FedCBOConfig",
           "FedOptConfig", "FedProxConfig", "FedPDConfig", "FedSGLDConfig", "IFCAConfig", "LocalConfig", "RobustConfig", "SGLDConfig", "dfedavgm", "fedavg", "fedcb2o",
           "fedcbo", "fedpd", "fedsgld", "ifca", "local_only", "robust_dfedavg",
           "fedopt", "fedadam", "fedyogi", "fedprox", "ditto", "ScaffoldConfig", "scaffold", "CFLConfig", "cfl"]
