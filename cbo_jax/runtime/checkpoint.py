"""Checkpoints of any run state: orbax's checkpoint manager, verified on restore.

A state is any pytree of arrays: a federated algorithm's state, a
:class:`~cbo_jax.dynamics.cbo.CBOState` or a clustered state. Layout of a checkpoint
directory (orbax ``CheckpointManager``)::

    PATH/<step>/state/   the arrays (PRNG keys stored as their key data)
    PATH/<step>/meta/    JSON: format, step, SHA-256 of the arrays, key implementations,
                         the zero-size leaves (orbax writes none: their dtype and shape),
                         and what the caller adds (a run's fingerprint, for example)

    PATH/<step>/files.sha256   SHA-256 of every file of the step, written after it

Saving is atomic per step (orbax writes a step to a temporary directory and renames it
when complete) and the last ``keep`` steps stay, so a kill at any moment leaves the
previous step intact. Restoring checks, before anything is returned, that

* every file of the step has the SHA-256 recorded when it was written (a flipped byte
  anywhere is an error, never a silently different run);
* the checkpoint's structure, shapes and dtypes are those of the template ``like``
  (a state, or ``jax.eval_shape`` of one): nothing is cast or reshaped;
* the arrays read back have the SHA-256 recorded with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbo_jax.runtime import results as _results

PyTree = Any

__all__ = ["save", "restore", "read_meta", "exists", "steps", "CheckpointError"]

_FORMAT = 2


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, of another run, or of another structure."""


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_arrays(state: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x: np.asarray(jax.random.key_data(x)) if _is_key(x) else np.asarray(x), state)


def _checksum(arrays: PyTree) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(arrays):
        a = np.ascontiguousarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


_DIGEST = "files.sha256"


def _file_digests(step_dir: Path) -> dict[str, str]:
    out = {}
    for f in sorted(step_dir.rglob("*")):
        if f.is_file() and f.name != _DIGEST:
            out[str(f.relative_to(step_dir))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _write_digest(step_dir: Path) -> None:
    tmp = step_dir / (_DIGEST + ".tmp")
    tmp.write_text(json.dumps(_file_digests(step_dir), indent=0))
    tmp.rename(step_dir / _DIGEST)  # atomic: a step has its digest whole or not at all


def _verify_digest(path: Path, step: int, others: str) -> None:
    step_dir = path / str(step)
    digest = step_dir / _DIGEST
    if not digest.is_file():
        return  # killed between orbax's commit and the digest: the arrays' own checksum still applies
    try:
        want = json.loads(digest.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path} step {step} is corrupt: its file digest is unreadable{others}") from None
    got = _file_digests(step_dir)
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if bad:
        raise CheckpointError(f"{path} step {step} is corrupt: {len(bad)} file(s) differ from what was written "
                              f"({', '.join(bad[:3])}){others}")


def _manager(path: Path, keep: int | None = None, create: bool = False):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create, enable_async_checkpointing=False)
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(path, options=options, item_handlers=handlers)


def _step(step) -> int:
    """An integer step ``>= 0``: a Python or NumPy integer, or a 0-d integer array (not a bool, not 1.5)."""
    if not isinstance(step, (bool, np.bool_)) and np.ndim(step) == 0 and np.issubdtype(np.asarray(step).dtype,
                                                                                        np.integer):
        value = int(step)
        if value >= 0:
            return value
    raise ValueError(f"step must be an integer >= 0, got {step!r}")


def save(path: str | Path, state: PyTree, *, step: int, meta: dict | None = None, keep: int = 2,
         overwrite: bool = False) -> Path:
    """Write ``state`` as step ``step`` of the checkpoint directory ``path`` (keeping ``keep`` steps).

    ``meta`` (JSON-serialisable) is stored beside the arrays and returned by :func:`restore`.
    The steps of a directory are one run's, in order: a step that is already there, or a
    step below the latest one there, raises :class:`CheckpointError` unless
    ``overwrite=True``, which replaces that step and deletes the later ones (the run goes on
    from ``step``). The ``keep`` latest steps stay.
    """
    import orbax.checkpoint as ocp

    from cbo_jax import _checks

    # a negative step is written but never listed (lost); a float is truncated; keep=0 deletes the step just written
    step = _step(step)
    _checks.positive_int("keep", keep)
    path = Path(path).absolute()
    state = jax.device_get(state)
    arrays = _to_arrays(state)
    # a string or object leaf would fail inside orbax's writer threads ("Unsupported data type: str128")
    bad = [f"{jax.tree_util.keystr(p) or 'the state'} ({a.dtype})"
           for p, a in jax.tree_util.tree_leaves_with_path(arrays)
           if not (jnp.issubdtype(a.dtype, jnp.number) or jnp.issubdtype(a.dtype, jnp.bool_))]
    if bad:
        raise ValueError(f"a checkpoint holds numeric and boolean arrays (and PRNG keys) only; not "
                         f"{', '.join(bad[:5])}: pass such values in meta")
    keys = {jax.tree_util.keystr(p): str(jax.random.key_impl(x))
            for p, x in jax.tree_util.tree_leaves_with_path(state) if _is_key(x)}
    record = {**(meta or {}), "format": _FORMAT, "step": int(step), "sha256": _checksum(arrays), "key_impls": keys}
    # orbax refuses zero-size arrays ("Found empty item" for a state of none at all): listed here, not written
    record["empty_leaves"] = _empty_leaves(arrays)
    stored = jax.tree_util.tree_map(lambda a: None if _is_empty(a) else a, arrays)
    if _one_array(arrays):  # orbax 0.11 fails on a bare array ("truth value of an array"): written as [array]
        record["one_array"] = True
        stored = stored if stored is None else [stored]
    try:
        json.dumps(record)  # fail early, before anything is written, if meta is not JSON
    except (TypeError, ValueError) as err:
        raise ValueError(f"meta must be JSON-serialisable: {err}") from None
    try:  # a path that is a file, or lies under one, would fail inside orbax naming its temporary directory
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot write a checkpoint to {path}: {err.strerror or err}") from None
    held, partial = _listed(path)
    if step in partial:  # not a step (steps() leaves it out), but orbax would refuse to write over it
        _remove_step(path / str(step))
    later = [s for s in held if s > step]
    if later and not overwrite:  # orbax's keep policy would delete the later steps, or keep them beside this one
        raise CheckpointError(f"{path} holds later steps {later} than step {step}: a checkpoint directory holds one "
                              f"run's steps in order. Pass overwrite=True to continue the run from step {step} (the "
                              f"later steps are deleted), or save to another directory")
    if step in held and not overwrite:  # orbax would raise its own StepAlreadyExistsError
        raise CheckpointError(f"{path} already holds step {step}: pass overwrite=True to replace it, or "
                              f"save another step (steps there: {held})")
    replaced = [s for s in held if s >= step]
    nbytes = sum(a.nbytes for a in jax.tree_util.tree_leaves(arrays))
    # Left to orbax, a full disk is ~100 lines of its threads' tracebacks (and a ValueError of
    # tensorstore's): here it is one DiskFullError naming the step. The steps before it stay whole.
    with _quiet_threads(), _results.full_disk(path / str(step), nbytes):
        try:
            if replaced:
                with _manager(path, keep, create=True) as mgr:
                    for s in replaced:
                        mgr.delete(s)
            with _manager(path, keep, create=True) as mgr:
                items = {"meta": ocp.args.JsonSave(record)}
                if jax.tree_util.tree_leaves(stored):
                    items["state"] = ocp.args.StandardSave(stored)
                mgr.save(int(step), args=ocp.args.Composite(**items), force=True)
                mgr.wait_until_finished()
            _write_digest(path / str(int(step)))
        except Exception as err:
            code = _results.full_errno(err)
            if code is None or isinstance(err, _results.DiskFullError):
                raise
            raise _results.DiskFullError(code, path / str(step), nbytes) from None
    return path


def _remove_step(step_dir: Path) -> None:
    """Remove a step directory; one that is a link is unlinked, its target left alone."""
    step_dir.unlink() if step_dir.is_symlink() else shutil.rmtree(step_dir)


class _DropThreadErrors(logging.Filter):
    """Drops orbax's log records of an exception in one of its threads: the save raises it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "raised an exception" not in str(record.msg)


@contextlib.contextmanager
def _quiet_threads():
    """While a save runs: orbax's threads' failures are not logged (with their tracebacks) beside
    the exception the save raises; after a failure, orbax's threads still running are waited
    for (they logged theirs later, at interpreter shutdown: "cannot schedule new futures after
    interpreter shutdown"), and the callbacks of tensorstore's writes into orbax's closed event
    loop are not printed (:func:`_ignore_closed_loop_callbacks`)."""
    _ignore_closed_loop_callbacks()
    before = set(threading.enumerate())
    loggers = [logging.getLogger("absl")]
    drop = _DropThreadErrors()
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    except BaseException:
        for t in set(threading.enumerate()) - before:
            if t is not threading.current_thread() and type(t).__module__.startswith("orbax"):
                t.join(timeout=60)
        raise
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


def _closed_loop_callback(kind, value, tb) -> bool:
    """Whether an exception is a callback's into an asyncio event loop that was closed."""
    last = traceback.extract_tb(tb)[-1:] if tb is not None else []
    return (kind is RuntimeError and str(value) == "Event loop is closed" and bool(last)
            and last[0].name == "_check_closed"
            and last[0].filename.endswith(os.path.join("asyncio", "base_events.py")))


def _ignore_closed_loop_callbacks() -> None:
    """When a save fails, tensorstore's writes still under way finish after the failure ended
    orbax's event loop, and each one's callback into the closed loop would print a
    traceback ("RuntimeError: Event loop is closed", through ``sys.unraisablehook``, from
    tensorstore's threads, while the command prints its error). Those alone are not
    printed; every other exception goes to the hook installed before. Installed once, at the first save."""
    previous = sys.unraisablehook
    if getattr(previous, "_cbo_jax_closed_loop", False):
        return

    def hook(unraisable):
        if not _closed_loop_callback(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    hook._cbo_jax_closed_loop = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def steps(path: str | Path) -> list[int]:
    """The complete steps in checkpoint directory ``path`` (none when it does not exist).

    A path that exists but is not a directory, or a link whose target is missing, is a
    :class:`CheckpointError`: read as "no checkpoint", it would make a resume start the run
    again from round 0 over its rows. A step directory without the metadata every saved step
    has (an empty ``7/``, or one an interrupted copy left) is not a step: it is left out,
    with a :class:`UserWarning` naming it, so the latest whole step is the one restored.
    """
    path = Path(path).absolute()
    if not path.is_dir():
        if path.exists():
            raise CheckpointError(f"{path} is a file, not a checkpoint directory")
        if path.is_symlink():  # a link to a scratch disk that is not mounted: the checkpoints are elsewhere
            raise CheckpointError(f"{path} is a link to {os.readlink(path)}, which does not exist (a disk not "
                                  f"mounted?)")
        return []
    listed, partial = _listed(path)
    if partial and (str(path), tuple(partial)) not in _WARNED:  # once: a resume lists the steps three times
        _WARNED.add((str(path), tuple(partial)))
        warnings.warn(f"{path}: left out {', '.join(str(path / str(s)) for s in partial)}, a step directory "
                      f"without the checkpoint's metadata (an interrupted copy?); "
                      f"{'the latest whole step is ' + str(listed[-1]) if listed else 'no whole step is there'}",
                      UserWarning, stacklevel=2)
    return listed


_WARNED: set = set()


def _listed(path: Path) -> tuple[list[int], list[int]]:
    """The step directories orbax lists in ``path``: ``(whole, partial)``. A step that ``save``
    wrote has its ``meta`` item (orbax renames a step into place only once it is written)."""
    with _manager(path) as mgr:
        found = sorted(int(s) for s in mgr.all_steps())
    whole = [s for s in found if (path / str(s) / "meta").is_dir()]
    return whole, [s for s in found if s not in whole]


def exists(path: str | Path) -> bool:
    return bool(steps(path))


def _one_array(tree: PyTree) -> bool:
    """``tree`` is a single array (or shape struct), not a container of them."""
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(tree)) and tree is not None


def _is_empty(x) -> bool:
    return 0 in tuple(x.shape)


def _empty_leaves(tree: PyTree) -> dict[str, list]:
    """The zero-size leaves of ``tree`` (arrays or shape structs): ``{path: [dtype, shape]}``."""
    return {jax.tree_util.keystr(p): [str(np.dtype(x.dtype)), list(x.shape)]
            for p, x in jax.tree_util.tree_leaves_with_path(tree) if _is_empty(x)}


def _template(like: PyTree) -> PyTree:
    def one(x):
        if _is_key(x):
            return jax.eval_shape(jax.random.key_data, x)
        # a Python or NumPy scalar leaf (saved as np.asarray of it) has no .dtype of its own
        return jax.ShapeDtypeStruct(np.shape(x), np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype)

    return jax.tree_util.tree_map(one, like)


def _name(path) -> str:
    """A leaf's path as ``a/b/0``, the same for a NamedTuple field and orbax's dict of it."""
    parts = []
    for k in path:
        parts.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
    return "/".join(parts)


def _check_layout(path: Path, step: int, saved, template) -> None:
    """Structure, shapes and dtypes of the checkpoint against the template, leaf by leaf."""
    got = {_name(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(saved)}
    want = {_name(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(template)}
    if set(got) != set(want):
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        raise CheckpointError(f"{path} step {step} holds another state structure (in the checkpoint only: "
                              f"{extra[:5]}; in this run only: {missing[:5]})")
    for name, w in want.items():
        g = got[name]
        if tuple(g.shape) != tuple(w.shape) or np.dtype(g.dtype) != np.dtype(w.dtype):
            raise CheckpointError(f"{path} step {step}: {name or 'the state'} is {np.dtype(g.dtype)}{list(g.shape)} "
                                  f"in the checkpoint but {np.dtype(w.dtype)}{list(w.shape)} in this run")


def _earlier(path: Path, step: int, available: list[int]) -> str:
    """The end of a corrupt-step message: the earlier steps, and how to fall back to the latest of them."""
    earlier = [s for s in available if s < step]
    if not earlier:
        return ""
    return f"; earlier steps: {earlier} (delete {path / str(step)} to use step {earlier[-1]})"


def read_meta(path: str | Path, *, step: int | None = None) -> dict:
    """The metadata of step ``step`` (default: the latest), without reading the arrays."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    available = steps(path)
    if not available:
        raise CheckpointError(f"{path}: no checkpoint there")
    step = available[-1] if step is None else _step(step)
    if step not in available:  # else the metadata read below calls it "corrupt: unreadable metadata"
        raise CheckpointError(f"{path}: no step {step} (steps: {available})")
    # A resume reads the metadata first, so its corrupt-step message names the intact steps to fall back to
    others = _earlier(path, step, available)
    _verify_digest(path, step, others)
    with _manager(path) as mgr:
        try:
            meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as err:  # noqa: BLE001 - reported with the step
            raise CheckpointError(f"{path} step {step} is corrupt: unreadable metadata ({type(err).__name__})"
                                  f"{others}") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise CheckpointError(f"{path} step {step}: not a cbo_jax checkpoint of format {_FORMAT}")
    return meta


def restore(path: str | Path, like: PyTree, *, step: int | None = None) -> tuple[PyTree, dict]:
    """Read step ``step`` (default: the latest) of checkpoint directory ``path``.

    ``like`` gives the structure, shapes and dtypes (a state, or ``jax.eval_shape`` of one);
    its Python scalar leaves (``int``, ``float``, ``bool``) come back as Python scalars, the
    other leaves as JAX arrays. Returns ``(state, meta)``. Raises :class:`CheckpointError` (a ``ValueError``) when
    there is no checkpoint, when it was written by another structure or configuration, or
    when its arrays do not have the checksum recorded at save time.
    """
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    available = steps(path)
    if not available:
        raise CheckpointError(f"{path}: no checkpoint there")
    step = available[-1] if step is None else _step(step)  # int(1.5) would restore step 1
    if step not in available:
        raise CheckpointError(f"{path}: no step {step} (steps: {available})")
    others = _earlier(path, step, available)
    _verify_digest(path, step, others)
    template = _template(like)
    with _manager(path) as mgr:
        try:
            meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as err:  # noqa: BLE001 - reported with the step
            raise CheckpointError(f"{path} step {step} is corrupt: unreadable metadata ({type(err).__name__}){others}") \
                from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise CheckpointError(f"{path} step {step}: not a cbo_jax checkpoint of format {_FORMAT}")
        # zero-size leaves are not written (orbax refuses them): the metadata lists them
        got_empty, want_empty = meta.get("empty_leaves", {}), _empty_leaves(template)
        if got_empty != want_empty:
            diff = sorted(k for k in set(got_empty) | set(want_empty) if got_empty.get(k) != want_empty.get(k))
            raise CheckpointError(f"{path} step {step} holds another state structure (zero-size leaves differ: "
                                  f"{diff[:5]}; in the checkpoint: {got_empty}, in this run: {want_empty})")
        stored = jax.tree_util.tree_map(lambda t: None if _is_empty(t) else t, template)
        try:
            items = mgr.item_metadata(step)
            saved = items["state"] if "state" in items.keys() else None  # a step of zero-size leaves only has none
            # orbax wraps the tree in a TreeMetadata; a bare-array state's leaf is named "tree" in it
            saved = saved if isinstance(saved, (dict, list, tuple)) else getattr(saved, "tree", saved)
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"{path} step {step} is corrupt: its array metadata is unreadable "
                                  f"({type(err).__name__}){others}") from None
        one, bare = bool(meta.get("one_array")), _one_array(template)
        # (checkpoints of older versions hold one array bare, without "one_array" in their meta: accepted)
        if one != bare and (one or isinstance(saved, (dict, list, tuple))):
            raise CheckpointError(f"{path} step {step} holds another state structure (in the checkpoint: "
                                  f"{'one array' if one else 'a tree'}; in this run: {'one array' if bare else 'a tree'})")
        if one and stored is not None:
            stored = [stored]  # written as a list of the one array (save)
        _check_layout(path, step, {} if saved is None else saved, stored)
        read = []
        if jax.tree_util.tree_leaves(stored):
            try:
                read = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(stored)))["state"]
            except Exception as err:  # noqa: BLE001
                raise CheckpointError(f"{path} step {step} is corrupt: reading it failed ({type(err).__name__})"
                                      f"{others}") from None
    flat, treedef = jax.tree_util.tree_flatten(template)
    it = iter(jax.tree_util.tree_leaves(read))  # the written leaves, in the template's order
    raw = jax.tree_util.tree_unflatten(treedef, [np.zeros(t.shape, t.dtype) if _is_empty(t) else np.asarray(next(it))
                                                 for t in flat])
    if _checksum(raw) != meta.get("sha256"):
        raise CheckpointError(f"{path} step {step} is corrupt: its arrays do not match the checksum written with "
                              f"them{others}")
    impls = meta.get("key_impls", {})

    def back(p, r, x):
        if _is_key(x):
            name = jax.tree_util.keystr(p)
            key = jax.random.wrap_key_data(jnp.asarray(r), impl=impls.get(name, "threefry2x32"))
            if str(key.dtype) != str(x.dtype):
                raise CheckpointError(f"{path} step {step}: {name} is a {key.dtype} key, this run uses {x.dtype}")
            return key
        if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
            return type(x)(r.item())  # a Python scalar leaf of the template's: the same type back
        # without jax_enable_x64, jnp.asarray casts int64/float64 to 32 bits (2**40 would come back as 0):
        # a leaf JAX cannot hold as it was saved comes back as the NumPy array that was read
        return jnp.asarray(r) if jax.dtypes.canonicalize_dtype(r.dtype) == r.dtype else r

    state = jax.tree_util.tree_map_with_path(back, raw, like)
    return state, {k: v for k, v in meta.items() if k not in ("sha256", "key_impls", "empty_leaves", "one_array")}
