"""One metrics writer for every run: JSON lines always, TensorBoard event files on request.

:class:`MetricsWriter` appends one JSON object per row (a communication round of a
federated run, or a recorded step of a particle simulation) to ``metrics.jsonl``;
values may be numbers, lists or nested dicts, and non-finite numbers are written as
``null`` (the file stays valid JSON). With ``tensorboard=True`` every numeric value is
also written as a TensorBoard scalar through ``tensorboardX`` (the ``tensorboard``
extra: ``pip install "cbo-jax[tensorboard]"``), nested keys joined by ``/`` and list
entries numbered, so ``tensorboard --logdir results`` shows every curve.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MetricsWriter", "json_safe", "to_python", "read_jsonl", "replace_bytes", "replace_text", "write_summary"]


def to_python(value: Any) -> Any:
    """Arrays and NumPy scalars as Python numbers and (nested) lists; dicts recursively."""
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if hasattr(value, "shape") or isinstance(value, np.generic):
        arr = np.asarray(value)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    return value


def describe(value: Any) -> Any:
    """A configuration as JSON-ready data that names what it holds: dataclasses (configs,
    α schedules, schedule rules) and named tuples (:class:`~cbo_jax.params.Params`) as dicts
    with their ``"type"``, a mirror map by its name, a function by its qualified name,
    paths as strings, arrays as lists."""
    import dataclasses

    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **{f.name: describe(getattr(value, f.name))
                                                 for f in dataclasses.fields(value)}}
    if hasattr(value, "grad_conj"):  # a mirror map: its functions by its name
        return {"type": type(value).__name__, "name": value.name}
    if hasattr(value, "_asdict"):
        return {"type": type(value).__name__, **{k: describe(x) for k, x in value._asdict().items()}}
    if hasattr(value, "rules") and hasattr(value, "update"):  # a schedules.Chain
        return {"type": type(value).__name__, "rules": [describe(r) for r in value.rules]}
    if isinstance(value, dict):
        return {str(k): describe(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(x) for x in value]
    if hasattr(value, "shape") or isinstance(value, np.generic):
        return to_python(value)
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


def stable_text(value: Any) -> str:
    """A JSON stand-in for a value JSON cannot hold, the same in every process.

    A function or class is written as its module and qualified name, anything else as its
    text less the memory address of a default ``repr`` (``at 0x7f3a...``), which differs
    from process to process: with it, a run with a function in its config could never be resumed."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', None) or '?'}.{value.__qualname__}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", str(value))


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (valid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_summary(path: str | Path, summary: dict) -> None:
    """Write ``summary`` to ``path`` (a ``summary.json``) with the ``"environment"`` block added.

    The file holds ``summary``'s entries as valid JSON (arrays as lists, non-finite numbers
    as ``null``) and, under ``"environment"``, :func:`cbo_jax.runtime.provenance.environment`: the
    versions, device and command that produced the numbers. ``summary`` itself is left as
    it is, so what a command prints stays the result alone.
    """
    from cbo_jax.runtime.provenance import environment

    recorded = {**summary, "environment": environment()}
    replace_text(Path(path), json.dumps(json_safe(to_python(recorded)), indent=2) + "\n")


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a kill (or an error) while writing leaves the old file.

    The text goes to a temporary file beside ``path`` that replaces it when complete; a
    ``summary.json`` or a resumed run's ``metrics.jsonl`` rewritten in place would be left
    cut short or empty by a kill while it is written. See :func:`replace_bytes`.
    """
    replace_bytes(path, text.encode("utf-8"))


def replace_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (as :func:`replace_text`), never through a link.

    A symbolic link at ``path`` or at the temporary file's name is refused with a
    ``ValueError`` naming it (the text would be written into the link's target: a colleague's
    file, outside the results directory); the temporary file is created anew
    (``O_EXCL | O_NOFOLLOW``), and the rename replaces ``path`` itself. A full disk or quota
    is a :class:`~cbo_jax.runtime.results.DiskFullError` naming ``path`` and the space.
    """
    from cbo_jax.runtime.results import full_disk, refuse_link

    path = Path(path)
    refuse_link(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    refuse_link(tmp)
    tmp.unlink(missing_ok=True)  # left by a killed process that had this pid
    with full_disk(path, len(data)):
        try:
            _write_new(tmp, data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a file created at ``path`` (which must not exist: nor a link there)."""
    from cbo_jax.runtime.results import open_nofollow

    with open(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as fh:
        fh.write(data)


def _scalars(prefix: str, value: Any):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _scalars(f"{prefix}/{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _scalars(f"{prefix}/{i}", v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        yield prefix, float(value)


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file (a missing file has none).

    A last line cut short (the writer was killed while appending it) is dropped; any other
    line that is not a JSON object (a row) is an error naming the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    try:
        text = path.read_text()
    except UnicodeDecodeError:  # rows are ASCII (json.dumps): this is damage, and the codec's message names no file
        raise ValueError(f"{path} is damaged: it holds bytes that are not text") from None
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i + 1} is not a row (a JSON object), got {type(row).__name__}")
        rows.append(row)
    return rows


class MetricsWriter:
    """Append metric rows to ``directory/metrics.jsonl`` (and TensorBoard event files).

    Args:
      directory: where ``metrics.jsonl`` (and the event files) go; created if needed.
      tensorboard: also write TensorBoard scalars (needs ``tensorboardX``).
      keep: rows already in the file to keep (a resumed run); ``None`` starts a new file. With
        TensorBoard, the new event file then hides the earlier files' events after the last
        kept step (TensorBoard's purge), so the re-run rounds are not shown twice.
      step_key: the row field used as the TensorBoard step (``"round"`` or ``"step"``).
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = False, keep: list[dict] | None = None,
                 step_key: str = "round"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        self.step_key = step_key
        replace_text(self.path, "".join(json.dumps(json_safe(to_python(r)), allow_nan=False) + "\n"  # as write()
                                         for r in (keep or [])))
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError as err:
                raise ValueError("tensorboard=True needs tensorboardX: pip install 'cbo-jax[tensorboard]'") from err
            purge = None if keep is None else 1 + max((int(r.get(step_key, 0)) for r in keep), default=-1)
            self._tb = SummaryWriter(str(self.directory), flush_secs=5, purge_step=purge)

    def write(self, row: dict) -> None:
        from cbo_jax.runtime.results import full_disk, open_nofollow

        row = json_safe(to_python(row))
        line = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        with full_disk(self.path, len(line)):  # never appended through a link planted in the file's place
            with open(open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as fh:
                fh.write(line)
        if self._tb is not None:
            step = int(row.get(self.step_key, 0))
            for name, v in _scalars("", {k: v for k, v in row.items() if k != self.step_key}):
                self._tb.add_scalar(name.lstrip("/"), v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
