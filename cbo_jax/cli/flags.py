"""The command line generated from the configs.

* :class:`Defaults`: the help of a generated parser shows each option's default.
* ``cbo-jax run ALGORITHM`` (:func:`add_run_arguments`, :func:`config_from_args`): one flag per
  field of the experiment's config (:func:`cbo_jax.experiments.federated.experiment_class`),
  ``--data.agents``, ``--M``, ``--local.lr``, ``--rounds`` (the sections in
  :data:`~cbo_jax.experiments.federated.FLAT_SECTIONS` without their name), the short names of
  earlier versions (:data:`SHORT_NAMES`: ``--agents``, ``--epochs``, ...) as aliases, and
  ``--config FILE`` (JSON, nested as ``config.json`` records it, or flat names) under them
  (``--dataset cifar10`` is ``--data.dataset cifar10``, ``--partition dirichlet:0.3`` is
  ``--data.partition dirichlet:0.3``).
* ``cbo-jax optimize``'s flags come from :class:`~cbo_jax.CBOConfig` and
  :class:`cbo_jax.cli.optimize.OptimizeOptions` through :func:`cbo_jax.config.add_options`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from cbo_jax import config as cfgs
from cbo_jax import models
from cbo_jax.experiments.federated import FLAT_SECTIONS, default_config, experiment_class, model_of
from cbo_jax.federated.runner import model_record

__all__ = ["Defaults", "SHORT_NAMES", "add_run_arguments", "config_from_args"]


class Defaults(argparse.HelpFormatter):
    """Help that shows an option's default where it has one to show (not ``None`` or a switch's
    ``False``) and its help does not state it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        shown = not (default is None or default is False or default is argparse.SUPPRESS)  # 0 and 0.0 are shown
        if action.option_strings and shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


# The short names of the data and local-training options, as flags (--agents, --epochs) and as top-level
# names of a flat --config file -> their place in the nested config (--data.agents, --local.epochs).
SHORT_NAMES = {
    "dataset": ("data", "dataset"), "partition": ("data", "partition"), "source": ("data", "source"),
    "data_dir": ("data", "data_dir"),
    "agents": ("data", "agents"),
    "clusters": ("data", "clusters"), "samples_per_agent": ("data", "samples_per_agent"), "data_seed": ("data", "seed"),
    "epochs": ("config", "local", "epochs"), "batch_size": ("config", "local", "batch_size"),
    "lr": ("config", "local", "lr"), "momentum": ("config", "local", "momentum"),
    "reset_optimizer": ("config", "local", "reset_optimizer"),
}


def _sections(algorithm: str) -> set[str]:
    return {f.path[1] for f in cfgs.fields(experiment_class(algorithm)) if len(f.path) > 2}


def _short_names(algorithm: str, section: str | None = None) -> dict[str, tuple[str, ...]]:
    """The :data:`SHORT_NAMES` that ``algorithm``'s config has (those of ``section``)."""
    has_local = "local" in _sections(algorithm)
    return {k: v for k, v in SHORT_NAMES.items()
            if (v[1:2] != ("local",) or has_local) and (section is None or v[0] == section)}


def _flat_names(algorithm: str) -> dict[str, tuple[str, ...]]:
    """Top-level names of a flat config file: the flat sections' fields, and the short names."""
    flat = {".".join(f.path[1:]): f.path
            for f in cfgs.fields(experiment_class(algorithm)) if f.path[0] in FLAT_SECTIONS}
    flat.update(_short_names(algorithm))
    return flat


def add_run_arguments(p: argparse.ArgumentParser, algorithm: str) -> dict:
    """The flags of ``cbo-jax run ALGORITHM``, generated from its config; returns their fields."""
    sections = {f.name: f.type for f in dataclasses.fields(experiment_class(algorithm))}
    dests = {}
    for section, title in (("data", "data (rotated MNIST, or --dataset: another image set)"), ("config", algorithm),
                           ("run", "run")):
        strip = (section,) if section in FLAT_SECTIONS else ()
        aliases = {"--" + k.replace("_", "-"): ".".join(path[len(strip):])
                   for k, path in _short_names(algorithm, section).items()}
        dests.update(cfgs.add_flags(p, sections[section], prefix=(section,), strip=strip, aliases=aliases, group=title))
    return dests


def config_from_args(algorithm: str, args: argparse.Namespace, dests: dict, base=None):
    """``--config FILE`` (JSON) first, then every explicitly given flag over it."""
    cfg = base if base is not None else default_config(algorithm)
    values: dict = {}
    recorded_model = None  # a --config file's record of the model trained: checked against this run's
    if getattr(args, "config", None):
        path = Path(args.config)
        raw = _read_config_file(path)
        if isinstance(raw, dict) and raw.get("algorithm", algorithm) != algorithm:
            raise ValueError(f"--config {path} is a {raw['algorithm']!r} config, not {algorithm!r}")
        if isinstance(raw, dict) and "model" in raw:
            recorded_model = (raw["model"], path)
            _check_model(raw["model"], path, None)  # the record's form, before the options are read
        raw = {k: v for k, v in raw.items() if k not in ("algorithm", "model")} if isinstance(raw, dict) else raw
        values.update(cfgs.values_from_dict(raw, experiment_class(algorithm), flat=_flat_names(algorithm),
                                            source=f"--config {path}"))
    values.update(cfgs.values_from_args(args, dests))
    if algorithm == "ifca" and ("config", "k") not in values and ("data", "clusters") in values:
        values[("config", "k")] = values[("data", "clusters")]
    built = cfgs.build(cfg, values)
    if recorded_model is not None:
        _check_model(*recorded_model, built)
    return built


def _read_config_file(path: Path) -> Any:
    """The JSON of ``--config FILE``; a ``ValueError`` naming the file when it cannot be read."""
    if path.is_dir():  # not "no such file" (is_file() is False for it)
        raise ValueError(f"--config {path} is a directory, not a file: give its config.json (or another JSON "
                         f"file of options)")
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"--config {path}: not valid JSON ({err})") from None
    except UnicodeDecodeError as err:  # a binary file, or another encoding: the message named no file
        raise ValueError(f"--config {path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise ValueError(f"--config {path}: cannot be read ({err.strerror or err})") from None


def _check_model(recorded: Any, path: Path, cfg: Any) -> None:
    """A ``--config`` file's ``"model"`` (what ``config.json`` records) must name the model this
    command trains for ``cfg`` (:func:`cbo_jax.experiments.federated.model_of`: MLP 784-200-10 on
    MNIST): its name, and its classes, loss and number of parameters where the record has them.
    It is a record, not an option: another model was trained by other code, and a rerun from its
    file here would train this one under that record's name. ``cfg`` ``None``: the record's form
    only (the default config's model named in the message)."""
    ours: dict = model_record(model_of(cfg.data) if cfg is not None else models.mlp_mnist()) or {}
    if not isinstance(recorded, dict) or not isinstance(recorded.get("name"), str):
        raise ValueError(f"--config {path}: model is the record of the model trained, an object with its "
                         f"\"name\" ({ours['name']!r} here), got {recorded!r}")
    if cfg is None:
        return
    differs = [k for k in ("name", "num_classes", "loss", "parameters") if k in recorded and recorded[k] != ours[k]]
    if differs:
        raise ValueError(f"--config {path} records the model {recorded['name']!r} "
                         f"({', '.join(f'{k}={recorded[k]!r}' for k in differs)}); `cbo-jax run` trains "
                         f"{ours['name']!r} ({', '.join(f'{k}={ours[k]!r}' for k in differs)}): "
                         "remove \"model\" from the file to run this model with its other options")
