"""Configured federated runs on rotated MNIST and other image sets: ``cbo-jax run ALGORITHM``.

An experiment's configuration is one nested dataclass per algorithm
(:func:`experiment_class`): ``data`` (:class:`RotatedMNISTConfig`), ``config`` (the
algorithm's own config, e.g. :class:`~cbo_jax.federated.algorithms.fedcbo.FedCBOConfig`
with its nested ``local`` SGD) and ``run`` (:class:`RunOptions`); rules across sections
(FedCBO's ``M`` downloads among the ``data.agents``) are checked when it is built. The
command-line flags and the ``--config`` file format are generated from it
(:mod:`cbo_jax.cli.flags`): ``--data.agents``, ``--M``, ``--local.lr``, ``--rounds``.
:func:`run_experiment` loads the data, builds the model and the algorithm and runs it
through :func:`cbo_jax.federated.run`, which writes the results directory
(``config.json``, ``metrics.jsonl``, ``summary.json``, ``metrics.png``).

The data section's ``dataset`` picks the images (``--dataset cifar10``): MNIST (default, the
FedCBO paper's), or EMNIST-balanced, Fashion-MNIST, CIFAR-10 or CIFAR-100 through
tensorflow-datasets (:mod:`cbo_jax.federated.datasets`), rotated per cluster the same way;
its ``model`` the network (:func:`model_of`: the paper's MLP for MNIST, the CNN of McMahan et
al. 2017, :func:`cbo_jax.models.cnn`, for the other sets).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import jax

from cbo_jax import _checks, models
from cbo_jax import config as cfgs
from cbo_jax.federated import data as fdata
from cbo_jax.federated import datasets as fdatasets
from cbo_jax.federated import metrics as fm
from cbo_jax.federated import mnist
from cbo_jax.federated.algorithms import (CFLConfig, DittoConfig, FedAvgConfig, FedCBOConfig, FedOptConfig, FedProxConfig,
                                          IFCAConfig, LocalConfig, ScaffoldConfig, cfl, ditto, fedavg, fedcbo, fedopt,
                                          fedprox, ifca, local_only, scaffold)
from cbo_jax.federated.runner import ON_DIVERGED, RunResult, finished, model_record, run
from cbo_jax.runtime.writer import json_safe, stable_text, to_python

__all__ = ["ALGORITHMS", "FLAT_SECTIONS", "RotatedMNISTConfig", "RunOptions", "experiment_class", "default_config",
           "load_data", "resolve_data", "model_of", "build", "run_experiment", "comparison", "replace"]

ALGORITHMS = {"fedcbo": FedCBOConfig, "fedavg": FedAvgConfig, "ifca": IFCAConfig, "local": LocalConfig,
              "fedprox": FedProxConfig, "fedopt": FedOptConfig, "ditto": DittoConfig, "scaffold": ScaffoldConfig,
              "cfl": CFLConfig}

# The sections of an experiment config whose fields are top-level flags (--M, --rounds) and top-level
# names of a flat --config file; the data's keep their section (--data.agents).
FLAT_SECTIONS = ("config", "run")

# The images of ``data.dataset`` (MNIST from its own sources, the others from tensorflow-datasets)
# and the networks of ``data.model`` ("auto": the MLP for MNIST, the CNN for the others).
DATASETS = tuple(fdatasets.DATASETS)
MODELS = ("auto", "mlp", "cnn")


@dataclasses.dataclass(frozen=True)
class RotatedMNISTConfig:
    """The rotated-MNIST benchmark (FedCBO §2.4; defaults: the paper's Table 1), or another image set rotated alike.

    Attributes:
      source: MNIST source: auto (IDX files from data_dir or CBO_JAX_DATA_DIR, else the bundled subset), idx, tfds, bundled
        (for the other data sets auto or tfds).
      data_dir: directory of the MNIST IDX files, or the tensorflow-datasets data directory
        (source tfds; none: tfds' default).
      agents: number of agents N (a multiple of clusters).
      clusters: rotations K (1, 2 or 4).
      samples_per_agent: training images per agent (none: the whole training set partitioned).
      seed: seed of the partition.
      subset: the reference script's protocol: every agent draws its images with
        replacement from one shared subset of this many training images (none: the paper's
        partition).
      partition: label skew within each rotation, none for the paper's equal random split
        (iid, dirichlet:ALPHA, classes:K, shards:S or quantity:BETA).
      dataset: the images: mnist, emnist (balanced, 47 classes), fashion_mnist, cifar10 or
        cifar100 (all but mnist through tensorflow-datasets).
      model: the network: auto (mlp for mnist, cnn for the others), mlp (one hidden layer of
        200) or cnn (McMahan et al. 2017's: two 5x5 convolutions, dense 512).
    """

    source: str = "auto"
    data_dir: str | None = None
    agents: int = 1200
    clusters: int = 4
    samples_per_agent: int | None = 200
    seed: int = 0
    subset: int | None = None
    partition: str | None = None
    dataset: str = "mnist"
    model: str = "auto"

    def __post_init__(self):
        cfgs.check_types(self)
        _checks.one_of("dataset", self.dataset, DATASETS)
        _checks.one_of("model", self.model, MODELS)
        _checks.one_of("source", self.source, mnist.SOURCES)
        if self.dataset != "mnist" and self.source not in ("auto", "tfds"):
            raise ValueError(f"data.source {self.source!r} is MNIST's; the {self.dataset} images are read with "
                             f"tensorflow-datasets (source auto or tfds, data_dir its data directory)")
        if self.partition is not None:
            from cbo_jax.federated.partition import parse

            parse(self.partition)
            if self.subset is not None:
                raise ValueError("data.partition and data.subset are two protocols: give one of them")
        _checks.positive_int("agents", self.agents)
        if self.clusters not in fdata.ROTATIONS:
            raise ValueError(f"clusters (rotation count) must be one of {sorted(fdata.ROTATIONS)}, got {self.clusters!r}")
        if self.agents % self.clusters:
            raise ValueError(f"agents ({self.agents}) must be divisible by clusters ({self.clusters})")
        if self.samples_per_agent is not None:
            _checks.positive_int("samples_per_agent", self.samples_per_agent)
        _checks.seed("seed", self.seed)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a federated run goes.

    Attributes:
      rounds: communication rounds T.
      eval_every: evaluate (test accuracy) every this many rounds and after the last.
      test_size: evaluate on the first test_size images of each test set (none: all).
      seed: seed of the algorithm's randomness.
      checkpoint_every: checkpoint every this many rounds (none: never).
      memory_budget_gb: FedCBO: pick the largest eval_chunk whose round fits this many GiB.
      tensorboard: also write TensorBoard event files to the results directory.
      on_diverged: an agent whose model holds a NaN or an infinity (left out of every
        average, counted in the rows' diverged_agents): "warn" (go on, naming it) or "stop"
        (end the run there, its rows so far written).
    """

    rounds: int = 100
    eval_every: int = 10
    test_size: int | None = None
    seed: int = 0
    checkpoint_every: int | None = None
    memory_budget_gb: float | None = None
    tensorboard: bool = False
    on_diverged: str = "warn"

    def __post_init__(self):
        cfgs.check_types(self)
        _checks.one_of("on_diverged", self.on_diverged, ON_DIVERGED)
        _checks.positive_int("rounds", self.rounds)
        _checks.positive_int("eval_every", self.eval_every)
        if self.test_size is not None:
            _checks.positive_int("test_size", self.test_size)
        _checks.seed("seed", self.seed)
        if self.checkpoint_every is not None:
            _checks.positive_int("checkpoint_every", self.checkpoint_every)
        if self.memory_budget_gb is not None:
            _checks.positive("memory_budget_gb", self.memory_budget_gb, f32=True)


def _across(cfg) -> None:
    """The rules across an experiment's sections: FedCBO's ``M`` downloads among the data's agents."""
    if isinstance(cfg.config, FedCBOConfig):
        _checks.downloads(cfg.config.M, cfg.data.agents)


@functools.lru_cache(maxsize=None)
def experiment_class(algorithm: str) -> type:
    """The config dataclass of ``cbo-jax run ALGORITHM``: ``algorithm``, ``data``, ``config``, ``run``;
    an instance checks the rules across its sections (FedCBO: ``1 <= M <= data.agents - 1``)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    field = dataclasses.field
    return dataclasses.make_dataclass(
        f"{algorithm.capitalize()}Experiment",
        [("algorithm", str, field(default=algorithm)),
         ("data", RotatedMNISTConfig, field(default_factory=RotatedMNISTConfig)),
         ("config", ALGORITHMS[algorithm], field(default_factory=ALGORITHMS[algorithm])),
         ("run", RunOptions, field(default_factory=RunOptions))],
        frozen=True, namespace={"__doc__": f"A `cbo-jax run {algorithm}` experiment.", "__post_init__": _across})


def default_config(algorithm: str, **sections):
    """The experiment config of ``algorithm`` with the given sections replaced."""
    cfg = experiment_class(algorithm)()
    if algorithm == "ifca" and "config" not in sections:
        sections["config"] = dataclasses.replace(cfg.config, k=(sections.get("data") or cfg.data).clusters)
    return dataclasses.replace(cfg, **sections)


def resolve_data(data: RotatedMNISTConfig) -> RotatedMNISTConfig:
    """``data`` with the MNIST it reads made explicit (:func:`cbo_jax.federated.mnist.resolve_source`),
    and its model.

    ``source="auto"`` becomes ``"idx"`` with the absolute directory of the IDX files (from
    ``data_dir`` or ``$CBO_JAX_DATA_DIR``), or ``"bundled"``; an explicit source is kept.
    The other data sets' ``"auto"`` becomes ``"tfds"``, with ``data_dir`` absolute when given
    (``None``: tfds' default; ``$CBO_JAX_DATA_DIR``, MNIST's IDX directory, is not read).
    ``model="auto"`` becomes the model :func:`model_of` trains (``"mlp"`` for MNIST, ``"cnn"``
    for the others). :func:`run_experiment` records this in ``config.json``, so a rerun from
    that file reads the same data (or fails naming the missing files) whatever its environment.
    """
    model = _model_kind(data)
    if data.dataset != "mnist":
        data_dir = str(Path(data.data_dir).expanduser().absolute()) if data.data_dir else None
        return dataclasses.replace(data, source="tfds", data_dir=data_dir, model=model)
    source, data_dir = mnist.resolve_source(data.source, data.data_dir)
    return dataclasses.replace(data, source=source, data_dir=data_dir, model=model)


def _model_kind(data: RotatedMNISTConfig) -> str:
    """``data.model`` with ``"auto"`` made explicit: ``"mlp"`` for MNIST, ``"cnn"`` for the other sets."""
    if data.model != "auto":
        return data.model
    return "mlp" if data.dataset == "mnist" else "cnn"


def model_of(data: RotatedMNISTConfig) -> models.Model:
    """The model ``cbo-jax run`` trains on ``data``: for its image shape and classes, the
    FedCBO paper's MLP (one hidden layer of 200: 784-200-10 on MNIST, :func:`cbo_jax.models.mlp_mnist`)
    or the CNN of McMahan et al. 2017 (:func:`cbo_jax.models.cnn`); ``model="auto"``: the MLP
    for MNIST, the CNN for the other image sets."""
    spec = fdatasets.DATASETS[data.dataset]
    if _model_kind(data) == "cnn":
        return models.cnn(spec.image_shape, spec.num_classes)
    return models.mlp_mnist(num_classes=spec.num_classes, input_shape=spec.image_shape)


def load_data(data: RotatedMNISTConfig) -> fdata.FederatedData:
    """Rotated MNIST, or the rotated image set ``data.dataset``, as configured (the data
    :func:`resolve_data` names)."""
    import os

    if data.dataset != "mnist":
        source = fdatasets.load_dataset(data.dataset, data.data_dir)
        return _rotated(source, data)
    try:
        source = mnist.load_mnist(data.source, data.data_dir)
    except mnist.DataError as err:
        env = os.environ.get("CBO_JAX_DATA_DIR")
        # resolve_data made $CBO_JAX_DATA_DIR explicit: say where the directory came from
        if data.source == "idx" and env and data.data_dir and Path(env).absolute() == Path(data.data_dir).absolute():
            raise mnist.DataError(f"{err}; CBO_JAX_DATA_DIR={env!r} names this directory: unset it, or pass "
                                  "--source bundled, to use the bundled subset") from None
        raise
    return _rotated(source, data)


def _rotated(source: mnist.MNIST, data: RotatedMNISTConfig) -> fdata.FederatedData:
    split = None
    if data.partition is not None:
        from cbo_jax.federated.partition import parse

        split = parse(data.partition)
    return fdata.rotated_mnist(source, data.agents, data.clusters, data.samples_per_agent, seed=data.seed,
                               subset=data.subset, partition=split)


def build(cfg, num_agents: int, mesh=None):
    """The model and the algorithm; with ``mesh``, FedCBO exchanges its downloads between devices."""
    model = model_of(cfg.data)
    if cfg.algorithm == "fedcbo":
        downloads = None
        if mesh is not None:
            from cbo_jax.federated.exchange import exchange_downloads

            downloads = exchange_downloads(mesh)
        return model, fedcbo(model, cfg.config, num_agents, downloads=downloads)
    builder = {"fedavg": fedavg, "ifca": ifca, "local": local_only, "fedprox": fedprox, "fedopt": fedopt,
               "ditto": ditto, "scaffold": scaffold, "cfl": cfl}[cfg.algorithm]
    return model, builder(model, cfg.config, num_agents)


def run_experiment(cfg, out_dir: str | Path | None = None, progress: bool = True,
                   data: fdata.FederatedData | None = None, resume: bool = False, mesh=None, extend: bool = False,
                   overwrite: bool = False) -> RunResult:
    """Run one configured experiment; write its results directory when ``out_dir`` is given.

    ``resume``, ``extend`` and ``overwrite`` as in :func:`cbo_jax.federated.run`; a resume
    of a finished run reads its results back (:func:`cbo_jax.federated.runner.finished`:
    the result's ``state`` is then ``None``; :func:`cbo_jax.runtime.checkpoint.restore` reads a
    checkpointed one's) instead of running it again.
    ``config.json`` records ``cfg`` with its data source resolved (:func:`resolve_data`) and the
    model trained (``"model"``: its name, classes, loss and number of parameters).
    ``data``, when given, is the data ``cfg.data`` describes (loaded with :func:`load_data`).
    """
    cfg = dataclasses.replace(cfg, data=resolve_data(cfg.data))
    if resume and out_dir is not None:
        _check_resume(cfg, Path(out_dir), extend)
    data = data if data is not None else load_data(cfg.data)
    if cfg.run.memory_budget_gb is not None and cfg.algorithm == "fedcbo":
        from cbo_jax.federated.memory import eval_chunk_for_budget

        chunk, plan = eval_chunk_for_budget(model_of(cfg.data), cfg.config, data.train, cfg.run.memory_budget_gb * 2**30,
                                            mesh=mesh)
        print(f"memory budget {cfg.run.memory_budget_gb} GiB: eval_chunk={chunk} (planned GiB per round: "
              + ", ".join(f"{c}: {b / 2**30:.2f}" for c, b in plan.items()) + ")", flush=True)
        cfg = dataclasses.replace(cfg, config=dataclasses.replace(cfg.config, eval_chunk=chunk))
    elif cfg.run.memory_budget_gb is not None:  # say so rather than accept it without a word
        print(f"memory budget {cfg.run.memory_budget_gb} GiB: not used by {cfg.algorithm} (it sizes FedCBO's "
              f"eval_chunk only)", flush=True)
    model, algorithm = build(cfg, data.num_agents, mesh=mesh)
    data.check(model)
    chunk = getattr(cfg.config, "eval_chunk", 8)
    key = _checks.as_key("seed", cfg.run.seed)
    if resume and out_dir is not None:
        # A finished run: its results are read back, not computed again (with a checkpoint it
        # would be restored and its summary rewritten with the seconds of the resume). Records
        # of older versions, whose config.json did not name the model, lack "model"; those
        # before data.dataset and data.model lack them (MNIST and its MLP, then the only ones).
        recorded = _as_recorded(cfg, Path(out_dir))
        done = finished(out_dir, algorithm, data, cfg.run.rounds, key, every=cfg.run.eval_every,
                        config=_record(recorded, model), earlier=[recorded, *_before_datasets(recorded, model)])
        if done is not None:
            print(f"{out_dir}: finished earlier, its results read back", flush=True)
            return done
    round_metrics, metrics = fm.default_metrics(model, data, chunk=chunk, test_size=cfg.run.test_size, log=None)
    res = run(algorithm, data, cfg.run.rounds, key, metrics=metrics, round_metrics=round_metrics,
              every=cfg.run.eval_every, out=out_dir, config=_record(cfgs.to_dict(cfg), model), mesh=mesh,
              checkpoint_every=cfg.run.checkpoint_every, resume=resume, extend=extend, overwrite=overwrite,
              progress=progress, tensorboard=cfg.run.tensorboard, on_diverged=cfg.run.on_diverged)
    return res


def _record(config: dict, model: models.Model) -> dict:
    """What ``config.json`` records: the experiment's options and the model it trains (its
    name, classes, loss and number of parameters, as :func:`cbo_jax.federated.run` records
    it without a ``config``)."""
    return {**config, "model": model_record(model)}


def _before_datasets(recorded: dict, model: models.Model) -> list[dict]:
    """``recorded`` as versions before ``data.dataset`` and ``data.model`` wrote it (with and
    without the model's record), when it is such a run: MNIST with the MLP."""
    data = recorded.get("data")
    if not isinstance(data, dict) or data.get("dataset") != "mnist" or data.get("model") != "mlp":
        return []
    older = {**recorded, "data": {k: v for k, v in data.items() if k not in ("dataset", "model")}}
    return [_record(older, model), older]


# Options a resumed run may change: where the data is read from (the data's hash is in the
# run's fingerprint), how often it checkpoints, what it writes besides the rows, and the
# memory budget (the eval_chunk it picks is in the fingerprint).
_RESUME_MAY_CHANGE = {("data", "source"), ("data", "data_dir"), ("run", "checkpoint_every"), ("run", "tensorboard"),
                      ("run", "memory_budget_gb"), ("config", "eval_chunk"), ("run", "on_diverged")}


def _as_recorded(cfg, out: Path) -> dict:
    """``cfg`` as ``out/config.json`` records it, with the options a resume may change
    (:data:`_RESUME_MAY_CHANGE`) taken from the record: a finished run read back on a
    resume that adds ``--checkpoint-every`` is the same run."""
    now = json.loads(json.dumps(json_safe(to_python(cfgs.to_dict(cfg))), default=stable_text))
    try:
        recorded = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return now
    for section, field in _RESUME_MAY_CHANGE:
        if isinstance(recorded.get(section), dict) and field in recorded[section] and isinstance(now.get(section), dict):
            now[section][field] = recorded[section][field]
    return now


def _leaves(d: dict, path: tuple[str, ...] = ()) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_leaves(v, path + (k,)))
        else:
            out[path + (k,)] = v
    return out


def _check_resume(cfg, out: Path, extend: bool) -> None:
    """Refuse to resume ``out`` with options other than those its ``config.json`` records, by flag.

    The run's fingerprint (checked by :func:`cbo_jax.federated.run`) holds the algorithm's
    config, the seed's key and a hash of the training data, but not the evaluation's
    ``test_size``: a resume with another ``--test-size`` would go on, its later rows measured on
    another test set than the earlier ones. The other differences the fingerprint reports under
    its own names (``key``, ``data_sha256``); here they name the flag.
    """
    path = out / "config.json"
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet (a run killed at its start) or cut short: the fingerprint decides
        return
    if not isinstance(recorded, dict):
        return
    now = json.loads(json.dumps(json_safe(to_python(cfgs.to_dict(cfg))), default=stable_text))
    saved, current = _leaves(recorded), _leaves(now)
    diffs = []
    for p, v in current.items():
        if p in saved and saved[p] != v and p not in _RESUME_MAY_CHANGE and not (extend and p == ("run", "rounds")):
            name = "ALGORITHM" if p == ("algorithm",) else cfgs.flag_name(p, flat=FLAT_SECTIONS)
            diffs.append(f"{name}: {saved[p]!r} in {path}, {v!r} now")
    if diffs:
        hint = " (--extend allows more rounds)" if any(d.startswith("--rounds:") for d in diffs) else ""
        raise ValueError(f"cannot resume {out}: it holds another run{hint}:\n  " + "\n  ".join(diffs))


def comparison(data: RotatedMNISTConfig, local, run_options: RunOptions, fedcbo_config: FedCBOConfig,
               algorithms=("fedcbo", "ifca", "fedavg", "local")) -> dict:
    """One experiment config per algorithm, all with the same data, local SGD and run options
    (FedCBO with ``fedcbo_config``; IFCA with one server model per cluster)."""
    out = {}
    for name in algorithms:
        if name == "fedcbo":
            algo = dataclasses.replace(fedcbo_config, local=local)
        elif name == "ifca":
            algo = IFCAConfig(k=data.clusters, local=local)
        else:
            algo = ALGORITHMS[name](local=local)
        out[name] = default_config(name, data=data, config=algo, run=run_options)
    return out


def replace(cfg, **kw: Any):
    """``cfg`` with fields replaced by dotted name: ``replace(cfg, **{"run.rounds": 5, "config.M": 3})``."""
    return cfgs.build(cfg, {tuple(k.split(".")): v for k, v in kw.items()})
