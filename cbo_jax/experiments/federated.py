"""Configured federated experiments: one flat config → data, model, algorithm, results.

:class:`FedRunConfig` holds every knob of ``cbo-jax run ALGORITHM`` (and can be read
from a JSON file with ``--config``); :func:`run_experiment` builds the rotated-MNIST
data, the MLP, the algorithm, runs it, and writes a results directory:

    config.json  metrics.jsonl  summary.json  accuracy.png  selection_rate.png (FedCBO)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax

from cbo_jax import models
from cbo_jax.federated import data as fdata
from cbo_jax.federated import mnist
from cbo_jax.federated.algorithms import (FedAvgConfig, FedCBOConfig, IFCAConfig, LocalConfig, fedavg, fedcbo, ifca,
                                          local_only)
from cbo_jax.federated.algorithms.base import AgentData
from cbo_jax.federated.local import LocalSGDConfig
from cbo_jax.federated.run import RunResult, run_federated

ALGORITHMS = ("fedcbo", "fedavg", "ifca", "local")


@dataclasses.dataclass(frozen=True)
class FedRunConfig:
    """Everything one federated run needs (defaults: the paper's Table 1 setting)."""

    algorithm: str = "fedcbo"
    # data
    source: str = "auto"
    data_dir: str | None = None
    agents: int = 1200
    clusters: int = 4
    samples_per_agent: int | None = 200
    data_seed: int = 0
    # local SGD
    epochs: int = 10
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    reset_optimizer: bool = True
    # FedCBO
    M: int = 200
    alpha: float = 10.0
    lambda1: float = 9.8
    gamma: float = 0.1
    selection: str = "epsilon_greedy"
    eps0: float = 0.5
    eps_decay: float = 0.01
    eps_min: float = 0.1
    noise: str = "none"
    sigma1: float = 0.0
    loss_reduction: str = "mean"
    eval_chunk: int = 4
    # IFCA
    k: int | None = None
    # run
    participation: float = 1.0
    rounds: int = 100
    eval_every: int = 10
    test_size: int | None = None
    seed: int = 0
    checkpoint_every: int | None = None
    memory_budget_gb: float | None = None  # FedCBO: pick the largest eval_chunk whose round fits

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            raise ValueError(f"memory_budget_gb must be > 0, got {self.memory_budget_gb}")
        self.local_config()  # validates the local SGD fields
        self.algorithm_config()

    def local_config(self) -> LocalSGDConfig:
        return LocalSGDConfig(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                              reset_optimizer=self.reset_optimizer)

    def algorithm_config(self):
        loc = self.local_config()
        if self.algorithm == "fedcbo":
            return FedCBOConfig(M=self.M, lambda1=self.lambda1, gamma=self.gamma, alpha=self.alpha, selection=self.selection,
                                eps0=self.eps0, eps_decay=self.eps_decay, eps_min=self.eps_min, noise=self.noise,
                                sigma1=self.sigma1, loss_reduction=self.loss_reduction, participation=self.participation,
                                eval_chunk=self.eval_chunk, local=loc)
        if self.algorithm == "fedavg":
            return FedAvgConfig(participation=self.participation, local=loc)
        if self.algorithm == "ifca":
            return IFCAConfig(k=self.k or self.clusters, participation=self.participation, local=loc)
        return LocalConfig(participation=self.participation, local=loc)

    def replace(self, **kw) -> "FedRunConfig":
        return dataclasses.replace(self, **kw)


def load_data(cfg: FedRunConfig) -> fdata.FederatedData:
    """Rotated MNIST for ``cfg`` (validates agents/clusters before loading anything)."""
    if cfg.clusters not in fdata.ROTATIONS:
        raise ValueError(f"clusters (rotation count) must be one of {sorted(fdata.ROTATIONS)}, got {cfg.clusters}")
    if cfg.agents % cfg.clusters:
        raise ValueError(f"agents ({cfg.agents}) must be divisible by clusters ({cfg.clusters})")
    if cfg.algorithm == "fedcbo" and not 1 <= cfg.M <= cfg.agents - 1:
        raise ValueError(f"M (downloads per agent) must satisfy 1 <= M <= N - 1 = {cfg.agents - 1}, got M={cfg.M}")
    source = mnist.load_mnist(cfg.source, cfg.data_dir)
    return fdata.rotated_mnist(source, cfg.agents, cfg.clusters, cfg.samples_per_agent, seed=cfg.data_seed)


def build(cfg: FedRunConfig, num_agents: int, mesh=None):
    """The model and the algorithm; with ``mesh``, FedCBO exchanges its downloads between devices."""
    model = models.mlp_mnist()
    if cfg.algorithm == "fedcbo":
        return model, fedcbo(model, cfg.algorithm_config(), num_agents, mesh=mesh)
    builder = {"fedavg": fedavg, "ifca": ifca, "local": local_only}[cfg.algorithm]
    return model, builder(model, cfg.algorithm_config(), num_agents)


def run_experiment(cfg: FedRunConfig, out_dir: str | Path | None = None, progress: bool = True,
                   data: fdata.FederatedData | None = None, resume: bool = False, mesh=None) -> RunResult:
    """Run one configured experiment; write its results directory when ``out_dir`` is given."""
    data = data if data is not None else load_data(cfg)
    if cfg.memory_budget_gb is not None and cfg.algorithm == "fedcbo":
        from cbo_jax.federated.algorithms.fedcbo import eval_chunk_for_budget

        chunk, plan = eval_chunk_for_budget(models.mlp_mnist(), cfg.algorithm_config(),
                                            AgentData.from_federated(data), cfg.memory_budget_gb * 2**30, mesh=mesh)
        print(f"memory budget {cfg.memory_budget_gb} GiB: eval_chunk={chunk} (planned GiB per round: "
              + ", ".join(f"{c}: {b / 2**30:.2f}" for c, b in plan.items()) + ")", flush=True)
        cfg = cfg.replace(eval_chunk=chunk)
    model, algorithm = build(cfg, data.num_agents, mesh=mesh)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    res = run_federated(algorithm, model, data, cfg.rounds, jax.random.key(cfg.seed), eval_every=cfg.eval_every,
                        eval_chunk=cfg.eval_chunk, test_size=cfg.test_size, out_dir=out,
                        checkpoint_every=cfg.checkpoint_every, resume=resume, mesh=mesh, progress=progress)
    if out is not None:
        (out / "summary.json").write_text(json.dumps(res.summary, indent=2) + "\n")
        plot_history(res.history, out, title=cfg.algorithm)
    return res


def plot_history(history: list[dict], out: Path, title: str = "") -> list[Path]:
    """Accuracy vs round, and (FedCBO) SR_n vs its oracle, as PNG files."""
    from cbo_jax._plotting import subplots

    paths = []
    ev = [h for h in history if "test_acc" in h]
    fig, ax = subplots(figsize=(5, 3.5))
    ax.plot([h["round"] for h in ev], [h["test_acc"] for h in ev], marker="o")
    ax.set_xlabel("communication round")
    ax.set_ylabel("mean test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "accuracy.png")
    fig.savefig(paths[-1], dpi=120)
    if history and "sr" in history[0]:
        fig, ax = subplots(figsize=(5, 3.5))
        rounds = [h["round"] for h in history]
        ax.plot(rounds, [h["sr"] for h in history], label="SR$_n$ (measured)")
        ax.plot(rounds, [h["sr_oracle"] for h in history], "--", label="oracle (1-ε)+ε·share")
        ax.set_xlabel("communication round")
        ax.set_ylabel("successful selection rate")
        ax.set_ylim(0, 1.02)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        paths.append(out / "selection_rate.png")
        fig.savefig(paths[-1], dpi=120)
    return paths


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """One option per :class:`FedRunConfig` field (``--samples-per-agent`` etc.)."""
    for f in dataclasses.fields(FedRunConfig):
        if f.name == "algorithm":
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None, metavar="BOOL")
        elif f.name in ("source", "selection", "noise", "loss_reduction", "data_dir"):
            p.add_argument(flag, default=None)
        elif "float" in str(f.type):
            p.add_argument(flag, type=float, default=None)
        else:
            p.add_argument(flag, type=int, default=None)


def config_from_args(algorithm: str, args: argparse.Namespace, base: FedRunConfig | None = None) -> FedRunConfig:
    """``--config FILE`` (JSON) first, then any explicit command-line option over it."""
    kw = {}
    if getattr(args, "config", None):
        kw.update(json.loads(Path(args.config).read_text()))
    for f in dataclasses.fields(FedRunConfig):
        v = getattr(args, f.name, None)
        if v is not None and f.name != "algorithm":
            kw[f.name] = v
    kw["algorithm"] = algorithm
    unknown = set(kw) - {f.name for f in dataclasses.fields(FedRunConfig)}
    if unknown:
        raise ValueError(f"unknown config keys: {sorted(unknown)}")
    return dataclasses.replace(base or FedRunConfig(), **kw)
