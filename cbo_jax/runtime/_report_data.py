"""What a report reads from a results directory (:mod:`cbo_jax.runtime.report`).

The directories below it that hold results; files read as bytes, JSON and JSON lines, never
through a symbolic link; the rows of a ``metrics.jsonl`` as curves: which values are drawn,
which are categorical (never averaged), how many runs a directory records, one series per
run or their mean, and several runs' rows averaged row by row.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

_MAX_LINES = 12          # entries of a list drawn one line each (wider lists are not drawn)
_SKIP_DIRS = {"checkpoint", "__pycache__"}
_LINK = "a symbolic link (the report reads no file through a link)"


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself: not a link to one (``lstat``), not a FIFO."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory itself, not a link to one."""
    return path.is_dir() and not path.is_symlink()


def _read_bytes(path: Path) -> bytes:
    """The bytes of the regular file ``path``; a symbolic link is refused (``O_NOFOLLOW``, also for a
    link put there after the directory was walked) with an ``OSError``."""
    if not _regular(path):
        raise OSError(f"{path.name}: " + (_LINK if path.is_symlink() else "not a regular file"))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _read_json(path: Path) -> Any:
    return _try_read_json(path)[0]


def _try_read_json(path: Path) -> tuple[Any, str | None]:
    """``(object, None)``, or ``(None, reason)`` for a file that cannot be read or parsed."""
    try:
        return json.loads(_read_bytes(path)), None
    except (OSError, ValueError) as err:
        return None, str(err) or type(err).__name__


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        # undecodable bytes (a damaged file) spoil their line only: a UnicodeDecodeError would stop the whole report
        for line in _read_bytes(path).decode("utf-8", errors="replace").splitlines():
            line = line.strip()
            if line:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except OSError:
        return []
    return rows


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _drawable(v: Any) -> Any:
    """``v`` as a curve draws it: a number; a list of numbers (and gaps, ``None``), one line per
    entry (up to ``_MAX_LINES``); else ``None`` (not drawn)."""
    if _number(v):
        return v
    if (isinstance(v, list) and 0 < len(v) <= _MAX_LINES and all(_number(e) or e is None for e in v)
            and any(_number(e) for e in v)):
        return v
    return None


_CATEGORICAL_WORDS = {"index", "indices", "idx", "id", "ids", "argmin", "argmax", "label", "labels"}


def _categorical(key: str) -> bool:
    """Whether the values of ``key`` are indices or categories (``server_model_per_cluster``,
    assignments, ``*_index``, ``*_id``, ...): drawn as steps, never averaged."""
    k = key.lower()
    return ("server_model" in k or "assign" in k
            or any(w in _CATEGORICAL_WORDS for w in re.split(r"[^a-z0-9]+", k)))


def _mean(values: list) -> Any:
    """The mean of drawable values (numbers, or lists of one length, entry by entry), non-finite
    entries and gaps left out; ``None`` where nothing is left or the values do not match."""
    vals = [v for v in values if v is not None]
    if vals and all(_number(v) for v in vals):
        fin = [v for v in vals if math.isfinite(v)]
        return sum(fin) / len(fin) if fin else None
    if vals and all(isinstance(v, list) for v in vals) and len({len(v) for v in vals}) == 1:
        out = []
        for j in range(len(vals[0])):
            fin = [v[j] for v in vals if _number(v[j]) and math.isfinite(v[j])]
            out.append(sum(fin) / len(fin) if fin else None)
        return out if any(e is not None for e in out) else None
    return None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _recorded_runs(d: Path) -> int | None:
    """The number of runs ``R`` when ``d/metrics.jsonl`` holds its values as lists over runs
    ``[v_1, ..., v_R]`` (also for ``R = 1``), as the directory records it; ``None`` when it
    records none (a federated run, ``simulate`` without ``num_runs``, no record at all).

    ``simulate(..., out=)`` writes ``num_runs`` (``null`` without runs) into ``summary.json``,
    with a sweep's ``grid_shape``, whose axes come before the runs' (its lists are the grid's,
    not runs); ``cbo-jax optimize`` writes ``runs`` into ``summary.json`` and the options
    into ``config.json``. The length of a list says nothing: 4 clusters are not 4 runs."""
    summary = _read_json(d / "summary.json")
    if isinstance(summary, dict):
        if "num_runs" in summary:
            return None if summary.get("grid_shape") else _count(summary["num_runs"])
        if "runs" in summary:
            return _count(summary["runs"])
    config = _read_json(d / "config.json")
    options = config.get("options") if isinstance(config, dict) else None
    if isinstance(options, dict) and "runs" in options:
        return _count(options["runs"])
    return None


def _run_series(rows: list[dict], label: str, runs: int | None = None, mean: bool = False) -> dict[str, list[dict]]:
    """The rows as curves. With ``runs`` (:func:`_recorded_runs`), a value that is a list of
    ``runs`` entries holds one entry per run: one series per run (``label run i``, up to 8
    runs), else, or with ``mean``, their mean over the runs (non-finite entries left out;
    categorical values are not averaged: left out). Any other list is one line per entry."""

    def pick(r: dict, i: int | None) -> dict:
        out = {}
        for k, v in r.items():
            if k in ("round", "step"):
                out[k] = v
                continue
            if runs is not None and isinstance(v, list) and len(v) == runs:
                if i is not None:
                    v = v[i]
                elif runs > 1 and _categorical(k):
                    continue  # an index or a category has no mean
                else:
                    v = _mean([_drawable(e) for e in v])
            if (v := _drawable(v)) is not None:
                out[k] = v
        return out

    if runs is None or runs == 1:
        return {label: [pick(r, None if runs is None else 0) for r in rows]}
    if mean or runs > 8:
        return {f"{label} (mean of {runs} runs)": [pick(r, None) for r in rows]}
    return {f"{label} run {i}": [pick(r, i) for r in rows] for i in range(runs)}


def _mean_rows(runs: list[list[dict]]) -> list[dict]:
    """Row by row (by ``round``/``step``), the mean of each numeric column over the runs holding it
    (a list-valued one entry by entry); a categorical column (indices) is not averaged: left out
    where there are several runs."""
    by_x: dict[Any, list[dict]] = {}
    for rows in runs:
        for i, r in enumerate(rows):
            by_x.setdefault(r.get("round", r.get("step", i + 1)), []).append(r)
    out = []
    for x in sorted(by_x, key=lambda v: (not _number(v), v if _number(v) else 0)):
        rows = by_x[x]
        row: dict[str, Any] = {"round" if "round" in rows[0] else "step": x}
        keys = dict.fromkeys(k for r in rows for k, v in r.items() if _drawable(v) is not None)
        for k in keys:
            if k in ("round", "step") or (len(runs) > 1 and _categorical(k)):
                continue
            if (v := _mean([_drawable(r.get(k)) for r in rows])) is not None:
                row[k] = v
        out.append(row)
    return out


def _metrics_children(d: Path) -> int:
    return sum(_regular(c / "metrics.jsonl") for c in d.iterdir() if _real_dir(c))


def _report_images(d: Path) -> bool:
    """Whether ``d`` is a Markdown report's image folder (``X_files/`` beside ``X.md``): not results."""
    return d.name.endswith("_files") and (d.parent / (d.name[: -len("_files")] + ".md")).is_file()


def _walk(root: Path, skip: Path | None) -> tuple[list[Path], dict[Path, list[Path]]]:
    """The directories below ``root`` holding results files (``.json``, ``.jsonl``, ``.png``), and
    the symbolic links below it by directory: links to such files or to directories, which the
    report does not follow (``rglob`` does not descend into a linked directory)."""
    seen: dict[Path, None] = {}
    links: dict[Path, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if any(part in _SKIP_DIRS for part in p.relative_to(root).parts):
            continue
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if any(_report_images(a) for a in p.parents if root in a.parents):  # an earlier report's images
            continue
        if p.is_symlink():
            if p.suffix in (".json", ".jsonl", ".png") or p.is_dir():
                links.setdefault(p.parent, []).append(p)
        elif p.suffix in (".json", ".jsonl", ".png") and _regular(p):
            seen[p.parent] = None
    return sorted(seen, key=lambda d: (len(d.relative_to(root).parts) > 0, str(d.relative_to(root)))), links
