"""What a federated run records about itself, and how a resume recognises it.

``config.json`` (:func:`_config_record`: the algorithm and its config, the rounds, the key's
data and the model, :func:`model_record`) says what ran; ``fingerprint.json`` and every
checkpoint's meta (:func:`fingerprint`) hold what must be equal for a run to be the same run:
the algorithm's config, ``rounds``, ``every``, the key, a hash of the training data, the model's
name, classes, loss, parameter shapes and a hash of its traced ``apply``. :func:`_resume`
restores the state and rows of the run a results directory holds, refusing another run there
with the fields that differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax.federated.algorithms.base import Algorithm
from cbo_jax.runtime import checkpoint as ckpt
from cbo_jax.runtime.writer import json_safe, read_jsonl, stable_text, to_python

__all__ = ["fingerprint", "model_record"]


def _config_dict(cfg) -> Any:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    return cfg


def _config_record(algorithm: Algorithm, config: Any, rounds: int, every: int, key: jax.Array) -> Any:
    """What ``config.json`` records, as JSON reads it back. Without ``config``: the
    algorithm, ``rounds``, ``every``, the run's PRNG key (:func:`_key_data`), the
    algorithm's config and the model it trains (:func:`model_record`; records of older
    versions, which did not hold the key or the model, lack them)."""
    if config is not None:
        cfg = _config_dict(config)
    else:
        cfg = {"algorithm": algorithm.name, "rounds": rounds, "every": every, "key": _key_data(key),
               "config": _config_dict(algorithm.config)}
        model = model_record(getattr(algorithm, "model", None))
        if model is not None:
            cfg["model"] = model
    return json.loads(json.dumps(json_safe(to_python(cfg)), default=stable_text))


def model_record(model) -> dict | None:
    """The model as ``config.json`` records it: its name, classes, loss and number of
    parameters (the last when ``init`` traces abstractly); ``None`` for ``None`` (an
    algorithm without a model). A ``config`` of your own given to :func:`run` can hold it
    (``{**my_config, "model": model_record(model)}``), as ``cbo-jax run`` records do."""
    if model is None:
        return None
    out: dict[str, Any] = {"name": model.name, "num_classes": model.num_classes, "loss": _loss_name(model)}
    try:
        params = jax.eval_shape(model.init, jax.random.key(0))
        out["parameters"] = sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))
    except Exception:  # noqa: BLE001 - a model that cannot be traced abstractly is named, not counted
        pass
    return out


def _loss_name(model) -> str:
    from cbo_jax.models import loss_name

    return loss_name(model.loss)


def _key_data(key: jax.Array) -> list:
    """The key's data as a list of integers: ``jax.random.key(seed)`` is ``[0, seed]`` for a
    seed below 2**32 (JAX's default threefry keys); ``jax.random.wrap_key_data`` makes the
    key again."""
    return np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key).tolist()


def _fingerprint_hash(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(algorithm: Algorithm, data, key: jax.Array, rounds: int, every: int) -> dict:
    """What makes a run the run it is: algorithm, its config, rounds, every, key, data (a hash)
    and the model (:func:`_model_fingerprint`)."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(data):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    fp = {"algorithm": algorithm.name, "num_agents": data.num_agents, "rounds": rounds, "every": every,
          "key": _key_data(key),
          "data_sha256": h.hexdigest()}
    fp.update(_flatten("config", json.loads(json.dumps(json_safe(to_python(_config_dict(algorithm.config))),
                                                       default=stable_text))))
    fp.update(_model_fingerprint(getattr(algorithm, "model", None), data))
    return fp


def _model_fingerprint(model, data) -> dict:
    """The model a run trains: its name, classes and loss, its parameters' shapes, and a hash
    of the computation ``apply`` traces on one input (a changed activation changes it)."""
    if model is None:
        return {}
    out: dict[str, Any] = {"model": model.name, "model.num_classes": model.num_classes, "model.loss": _loss_name(model)}
    x = getattr(data, "x", None)
    if x is None and hasattr(data, "benign"):
        x = data.benign.x
    try:
        params = jax.eval_shape(model.init, jax.random.key(0))
        out["model.parameters"] = [f"{jax.tree_util.keystr(p)}: {leaf.dtype}{list(leaf.shape)}"
                                   for p, leaf in jax.tree_util.tree_leaves_with_path(params)]
        if x is not None:
            one = jax.ShapeDtypeStruct((1,) + tuple(np.shape(x))[2:], x.dtype)
            out["model.apply_sha256"] = _apply_hash(model, params, one)
            out["model.apply_jax"] = jax.__version__  # the hash is of a printed jaxpr: comparable within a version
    except Exception:  # noqa: BLE001 - a model that cannot be traced abstractly is named, not hashed
        pass
    return out


def _apply_hash(model, params, one) -> str:
    return hashlib.sha256(str(jax.make_jaxpr(model.apply)(params, one)).encode()).hexdigest()[:16]


def _comparable(saved: dict, now: dict, out, stacklevel: int) -> dict:
    """``now`` as it compares with a recorded fingerprint ``saved``: without the model keys a
    run recorded by an older version (which did not fingerprint the model) lacks, and, when
    ``saved`` hashed the model's ``apply`` under another JAX version (whose jaxprs may print
    otherwise), without that hash (a warning says the computation was not compared)."""
    now = {k: v for k, v in now.items() if not (k.startswith("model") and k not in saved)}
    then = saved.get("model.apply_jax")
    if then is not None and now.get("model.apply_jax") not in (None, then):
        warnings.warn(f"{out} recorded its model under JAX {then}, this is JAX {now['model.apply_jax']}: the "
                      "model's name, classes, loss and parameter shapes are compared, its traced computation is "
                      "not", stacklevel=stacklevel + 1)
        now = {**now, "model.apply_jax": then}
        if "model.apply_sha256" in saved and "model.apply_sha256" in now:
            now["model.apply_sha256"] = saved["model.apply_sha256"]
    return now


def _flatten(prefix: str, value) -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(f"{prefix}.{k}", v))
        return out
    return {prefix: value}


def _resume_differences(saved: dict, now: dict, extend: bool, where) -> list[str]:
    now = _comparable(saved, now, where, 5)  # _resume_differences, _resume, _run, run, the caller
    out = []
    for k in sorted(set(saved) | set(now)):
        if saved.get(k) != now.get(k) and not (extend and k == "rounds"):
            out.append(f"{k}: {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now")
    return out


def _read_fingerprint(out: Path) -> dict | None:
    path = out / "fingerprint.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # cut short by a kill: the run had not started rounds yet


def _resume(out: Path, state, fp: dict, rounds: int, extend: bool):
    """``(state, rounds done, rows kept, seconds of work so far)`` of the run ``out`` holds: from its
    checkpoint, or from the fingerprint written at its start (a run killed before its first
    checkpoint starts again from round 0). Another run there is refused, naming what differs."""
    has_ckpt = ckpt.exists(out / "checkpoint")
    saved = ckpt.read_meta(out / "checkpoint").get("run") if has_ckpt else _read_fingerprint(out)
    if saved is None and read_jsonl(out / "metrics.jsonl"):
        raise ValueError(f"cannot resume {out}: it holds results of a run that recorded no fingerprint; "
                         f"overwrite them instead")
    diffs = _resume_differences(saved, fp, extend, out) if saved is not None else []
    if diffs:
        hint = " (extend=True / --extend allows more rounds)" if any(d.startswith("rounds:") for d in diffs) else ""
        raise ValueError(f"cannot resume {out}: it holds another run{hint}:\n  " + "\n  ".join(diffs))
    rows = read_jsonl(out / "metrics.jsonl")
    if any("round" not in r for r in rows):  # e.g. a particle run's rows (`optimize --overwrite` into it)
        raise ValueError(f"cannot resume {out}: {out / 'metrics.jsonl'} holds rows without a round (not a "
                         f"federated run's); overwrite them instead")
    if not has_ckpt:
        if rows:  # its rows are replaced as the run goes again: say so, it may have been long
            warnings.warn(f"resuming {out}: it holds {len(rows)} rows but no checkpoint (the run saved none: "
                          f"checkpoint_every / --checkpoint-every saves them), so the run starts again from round 0",
                          stacklevel=4)
        return state, 0, [], 0.0
    state, meta = ckpt.restore(out / "checkpoint", state)
    done = int(meta["step"])
    if done > rounds:
        raise ValueError(f"the checkpoint is at round {done}, beyond rounds={rounds}")
    history = [r for r in rows if r["round"] <= done]
    if len(history) != done:
        raise ValueError(f"{out / 'metrics.jsonl'} has {len(history)} rows up to round {done} (the "
                         f"checkpoint's); cannot resume")
    # elapsed_s and the summary's seconds go on from the kept rounds' time, as in one process
    seconds = max((r["elapsed_s"] for r in history if isinstance(r.get("elapsed_s"), (int, float))), default=0.0)
    return state, done, history, seconds
