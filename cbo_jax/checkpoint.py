"""Checkpoints of any run state with orbax-checkpoint.

A state is any pytree of arrays: a federated algorithm's state, a
:class:`~cbo_jax.dynamics.cbo.CBOState` or a clustered state. Typed PRNG keys are
stored as their raw key data and re-wrapped on restore (with the implementation of
the matching leaf of ``like``). Restoring needs a template of the same structure,
``like``: for a federated run ``algorithm.init(key)``, for a particle system
``dynamics.init(x0, key)`` (or the state itself); ``jax.eval_shape`` of those works too.

Layout of a checkpoint directory::

    PATH/state/     orbax StandardCheckpointer tree
    PATH/meta.json  {"format": 1, "step": ..., plus what the caller adds}

Saving overwrites ``PATH`` atomically from the reader's point of view: the new
checkpoint is written to ``PATH.tmp`` and then renamed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = ["save", "restore", "exists"]

_FORMAT = 1


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_arrays(state: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x: np.asarray(jax.random.key_data(x)) if _is_key(x) else np.asarray(x), state)


def save(path: str | Path, state: PyTree, *, step: int, meta: dict | None = None) -> Path:
    """Write ``state`` (and ``step`` plus JSON-serialisable ``meta``) to directory ``path``."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp / "state", _to_arrays(jax.device_get(state)))
        ckpt.wait_until_finished()
    (tmp / "meta.json").write_text(json.dumps({"format": _FORMAT, "step": int(step), **(meta or {})}, indent=1))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def exists(path: str | Path) -> bool:
    path = Path(path)
    return (path / "meta.json").is_file() and (path / "state").is_dir()


def restore(path: str | Path, like: PyTree) -> tuple[PyTree, dict]:
    """Read a checkpoint written by :func:`save`; returns ``(state, meta)``.

    ``like`` gives the structure, shapes, dtypes and PRNG-key implementations; a
    mismatch (for example a checkpoint of another configuration) is a ``ValueError``.
    """
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    if not exists(path):
        raise ValueError(f"{path}: not a cbo_jax checkpoint (expected {path}/meta.json and {path}/state/)")
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: checkpoint format {meta.get('format')} is not supported (expected {_FORMAT})")
    template = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(jax.random.key_data(x).shape, jax.random.key_data(x).dtype) if _is_key(x)
        else jax.ShapeDtypeStruct(np.shape(x), x.dtype), like)
    try:
        with ocp.StandardCheckpointer() as ckpt:
            raw = ckpt.restore(path / "state", template)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise ValueError(f"{path}: checkpoint does not match the run's state structure: {err}") from err
    state = jax.tree_util.tree_map(
        lambda r, x: jax.random.wrap_key_data(jnp.asarray(r), impl=jax.random.key_impl(x)) if _is_key(x)
        else jnp.asarray(r, x.dtype), raw, like)
    return state, meta
