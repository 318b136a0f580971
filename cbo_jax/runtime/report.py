"""Render a results directory into one HTML or Markdown report (``cbo-jax report``).

Every run of cbo_jax writes plain files: ``summary.json`` (final numbers),
``metrics.jsonl`` (one JSON row per round or step), ``config.json`` and ``*.png`` plots.
:func:`render` walks a results directory and turns them into a single document:

* one section per directory that holds results, in path order;
* its ``summary.json`` (and any other ``*.json`` object) as a key/value table, with the
  ``environment`` block (:mod:`cbo_jax.runtime.provenance`) as one line above it: command,
  versions, device, commit, date;
* when the directory's sub-directories each hold a ``summary.json`` (methods of one
  comparison, seeds of one method), a comparison table with one row per sub-directory
  over the numbers they share;
* the curves of every ``metrics.jsonl`` below it, sub-directories overlaid, drawn with
  matplotlib;
* the ``*.png`` files it contains.

HTML reports are self-contained (images embedded as base64). Markdown reports write their
images next to the report, in ``<report stem>_files/``.

The report reads no file through a symbolic link: a link below the directory (to a file or to
a directory) is listed in its section as skipped, never followed, so a results directory from
elsewhere cannot put another file's contents in the report. Every text taken from the
directory (names, keys, values) is escaped in both formats; in Markdown, names are code spans
whose fence is longer than any run of backticks in them.

Curves: a value written as a list is drawn one line per entry (``*_per_cluster``: one line per
cluster), unless the directory records that its lists are over runs (``cbo-jax optimize``:
``runs`` in ``summary.json``; ``simulate(..., out=)``: ``num_runs``); the length of a list
says nothing. Runs are drawn one line per run, or their mean where several directories are
overlaid. Categorical values (indices, assignments: names holding ``server_model``,
``assign``, ``index``, ``idx``, ``id``, ``argmin``, ``argmax``, ``label``) are drawn as steps
and never averaged, over runs or over a reproduction's seeds.

Example::

    cbo-jax demo --output results/demo
    cbo-jax report results/demo                       # results/demo/report.html
    cbo-jax report results --format md -o report.md   # every run under results/
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
import os
import re
import stat
import sys
import urllib.parse
from pathlib import Path
from typing import Any

__all__ = ["render", "flatten"]

_MAX_CURVES = 6          # numeric metrics columns drawn per figure
_MAX_LINES = 12          # entries of a list drawn one line each (wider lists are not drawn)
_MAX_TABLE_ROWS = 200    # key/value rows shown per JSON file
_SKIP_DIRS = {"checkpoint", "__pycache__"}
_REPORT_SUFFIXES = (".html", ".htm", ".md", ".markdown")
_RESULT_SUFFIXES = (".json", ".jsonl", ".png", ".npz")


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool)) or v is None


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.4g}"
        return f"{v:.6g}" if abs(v) < 1 else f"{v:.2f}".rstrip("0").rstrip(".")
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def flatten(obj: dict, prefix: str = "", max_list: int = 8) -> dict[str, Any]:
    """Nested dicts to ``{"a.b.c": value}``; short lists of scalars kept, long ones summarised."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + ".", max_list))
        elif isinstance(v, list):
            if len(v) <= max_list and all(_scalar(x) for x in v):
                out[key] = v
            else:
                out[key] = f"[{len(v)} values]"
        else:
            out[key] = v
    return out


# --------------------------------------------------------------------------- blocks
# A report is a list of blocks, rendered to HTML or Markdown at the end:
#   ("h", level, text) ("p", text) ("table", header, rows) ("img", png_bytes, caption, name)


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
        # undecodable bytes (a damaged file) spoil their line only: a UnicodeDecodeError stopped the whole report
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


def _numeric_columns(rows: list[dict]) -> list[str]:
    cols: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k in ("round", "step") or _drawable(v) is None:
                continue
            cols[k] = cols.get(k, 0) + 1
    # curves need two points; prefer accuracy and loss curves, timings last
    if len(rows) > 1:
        cols = {k: n for k, n in cols.items() if n >= 2}

    def rank(k: str) -> tuple:
        pri = 0 if "acc" in k else 1 if ("loss" in k or k in ("sr", "energy")) else \
            3 if ("elapsed" in k or "seconds" in k) else 2
        return (pri, -cols[k], k)

    return sorted(cols, key=rank)[:_MAX_CURVES]


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


def _entry(column: str, i: int) -> str:
    """The name of entry ``i`` of a list-valued column, as its legend shows it."""
    return f"cluster {i}" if column.endswith("per_cluster") else f"[{i}]"


def _curves_png(series: dict[str, list[dict]], title: str) -> bytes | None:
    """Small multiples: one panel per numeric column, one line per labelled run; a list-valued
    column one line per entry (per cluster), steps for a categorical one (indices)."""
    from cbo_jax.runtime.plotting import subplots

    # ranked over every run drawn: the first run's columns did not push out the others'
    columns = _numeric_columns([r for rows in series.values() for r in rows])
    if not columns:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ncol = min(3, len(columns))
    nrow = math.ceil(len(columns) / ncol)
    fig, axes = subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    colour = {label: f"C{i % 10}" for i, label in enumerate(series)}  # one colour per run in every panel
    styles, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v", "P", "X", "*")
    single = len(series) == 1
    for ax, col in zip(axes.flat, columns):
        cat = _categorical(col)
        width = max((len(r[col]) for rows in series.values() for r in rows if isinstance(r.get(col), list)),
                    default=0)
        entries: list[int | None] = list(range(width)) if width else [None]
        for label, rows in series.items():
            for e in entries:
                pts = []
                for i, r in enumerate(rows):
                    v = r.get(col)
                    y = v if e is None else (v[e] if isinstance(v, list) and e < len(v) else None)
                    if _number(y):
                        pts.append((r.get("round", r.get("step", i + 1)), y))
                if not pts:
                    continue
                xs, ys = zip(*pts)
                kw: dict[str, Any] = {"color": colour[label], "label": label,
                                      "marker": "." if len(xs) < 30 else None}
                if e is not None:  # one line per entry: by colour alone, else by line style and marker
                    kw.update(label=_entry(col, e) if single else f"{label} {_entry(col, e)}",
                              color=f"C{e % 10}" if single else colour[label],
                              linestyle="-" if single else styles[e % len(styles)])
                    if not single or cat:
                        kw["marker"] = markers[e % len(markers)]
                if cat:  # a category holds until it changes; equal ones stay visible (smaller marks on top)
                    kw.update(drawstyle="steps-post", markersize=8 - 5 * (e or 0) / max(width, 1),
                              linewidth=2.5 - 1.5 * (e or 0) / max(width, 1))
                ax.plot(xs, ys, **kw)
        if cat:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if width and single:
            ax.legend(fontsize=6)
        elif width:  # the runs' colours are in the first panel's legend; here the entries' styles
            ax.legend(handles=[Line2D([], [], color="0.35", linestyle=styles[e % len(styles)],
                                      marker=markers[e % len(markers)], label=_entry(col, e))
                               for e in range(width)], fontsize=6)
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("round" if any("round" in r for rows in series.values() for r in rows[:1]) else "step",
                      fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    if 1 < len(series) <= 12:  # every run, also one the first panel has no points of
        first = axes.flat[0]
        entries_legend = first.get_legend()
        if entries_legend is not None:
            first.add_artist(entries_legend)  # kept beside the runs' legend
        first.legend(handles=[Line2D([], [], color=colour[lab], label=lab) for lab in series], fontsize=7,
                     loc="best" if entries_legend is None else "lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def _kv_table(obj: dict) -> tuple[list[str], list[list[str]]]:
    flat = flatten(obj)
    rows = [[k, _fmt(v)] for k, v in list(flat.items())[:_MAX_TABLE_ROWS]]
    if len(flat) > _MAX_TABLE_ROWS:
        rows.append(["…", f"{len(flat) - _MAX_TABLE_ROWS} more keys"])
    return ["key", "value"], rows


class _Code(str):
    """A part of a paragraph shown as code (a file name, a command); other parts are plain text."""


def _provenance_line(env: dict) -> tuple:
    """A summary's ``environment`` block (:mod:`cbo_jax.runtime.provenance`) as one sentence (paragraph parts)."""
    parts: list = []
    command = env.get("command")
    versions = ", ".join(f"{name} {env[key]}" for key, name in (("cbo_jax", "cbo_jax"), ("jax", "JAX"),
                                                                 ("jaxlib", "jaxlib")) if env.get(key))
    if versions:
        parts.append(versions)
    if env.get("backend"):
        host = ", ".join(str(x) for x in (env.get("cpu_model"), env.get("cpu_count") and f"{env['cpu_count']} cores")
                         if x)
        kind, backend = str(env.get("device_kind", "")), str(env["backend"])  # a hand-edited value: any JSON
        device = backend.upper() + (f" {kind}" if kind and kind.lower() != backend else "")
        if env.get("device_count", 1) != 1:
            device += f" x {env['device_count']}"
        parts.append(device + (f" (host: {host})" if host else ""))
    if env.get("git_commit"):
        parts.append(f"commit {str(env['git_commit'])[:10]}" + (" with uncommitted changes" if env.get("git_dirty") else ""))
    if env.get("date_utc"):
        parts.append(str(env["date_utc"]))
    if command:
        return ("Produced by ", _Code(str(command)), "; " if parts else "", "; ".join(parts) + ".")
    return ("Produced by " + "; ".join(parts) + ".",) if parts else ("Produced by: (no environment recorded).",)


def _comparison(children: list[tuple[str, dict]]) -> tuple[list[str], list[list[str]]] | None:
    # The environment block (versions, device, command) is shown per run, not compared.
    flats = [(name, flatten({k: v for k, v in s.items() if k != "environment"})) for name, s in children]
    shared = [k for k, v in flats[0][1].items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)
              and all(isinstance(f.get(k), (int, float)) and not isinstance(f.get(k), bool) for _, f in flats[1:])]
    if not shared:
        return None
    varying = [k for k in shared if len({f[k] for _, f in flats}) > 1] or shared
    if all(k.split(".")[-1] in ("seconds", "wall_seconds") for k in varying):
        return None  # runs of different kinds that share only their timings
    header = ["run"] + varying[:12]
    return header, [[name] + [_fmt(f[k]) for k in varying[:12]] for name, f in flats]


def _seed_groups(kids: list[Path]) -> list[tuple[str, dict, list[dict]]]:
    """Children without a summary of their own whose sub-directories hold runs (a reproduction's
    ``METHOD/seedK/``): ``(name, mean of the runs' numeric summary values, mean curves)`` each."""
    out = []
    for c in kids:
        if _regular(c / "summary.json"):
            continue
        runs = [g for g in sorted(c.iterdir()) if _real_dir(g) and g.name not in _SKIP_DIRS]
        flats = [flatten({k: v for k, v in s.items() if k != "environment"}) for g in runs
                 if isinstance(s := _read_json(g / "summary.json"), dict)]
        if not flats:
            continue
        # an index or a category (an assignment) has no mean: left out where there are several runs
        keys = [k for k, v in flats[0].items() if _number(v) and all(_number(f.get(k)) for f in flats[1:])
                and not (len(flats) > 1 and _categorical(k))]
        means = {k: sum(f[k] for f in flats) / len(flats) for k in keys}
        label = f"{c.name} (mean of {len(flats)})" if len(flats) > 1 else c.name
        curves = []  # each run's rows, a run's own lists over runs by their mean
        for g in runs:
            if _regular(g / "metrics.jsonl") and (rows := _read_jsonl(g / "metrics.jsonl")):
                curves.extend(_run_series(rows, g.name, _recorded_runs(g), mean=True).values())
        out.append((label, means, _mean_rows(curves)))
    return out


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


def _blocks(root: Path, out_path: Path | None) -> list[tuple]:
    blocks: list[tuple] = [("h", 1, f"cbo_jax results: {root.name or root}"),
                           ("p", (f"Rendered {_dt.datetime.now().isoformat(timespec='seconds')} from ",
                                  _Code(str(root)), " by ", _Code("cbo-jax report"), "."))]
    skip = out_path.parent / f"{out_path.stem}_files" if out_path is not None else None
    dirs, links = _walk(root, skip)
    # parents whose children hold summaries also get a section (comparison tables, curves)
    parents = {d.parent for d in dirs if d != root and _regular(d / "summary.json")}
    # and their parents, where those have no summary (METHOD/SEED/: the methods compared)
    parents |= {p.parent for p in parents if p != root and not _regular(p / "summary.json")}
    # and the directories of skipped links, to say so
    dirs = sorted(set(dirs) | {p for p in parents if root in (p, *p.parents)} | set(links),
                  key=lambda d: str(d.relative_to(root)))
    if not dirs:
        blocks.append(("p", ("No results found (no .json, .jsonl or .png files).",)))
        return blocks
    for d in dirs:
        rel = d.relative_to(root)
        title = str(rel) if str(rel) != "." else (root.name or str(root))
        level = 2 if len(rel.parts) <= 1 else 3
        section: list[tuple] = []
        for link in links.get(d, []):  # listed, never followed: its target may be any file
            print(f"cbo-jax report: skipped: {link.relative_to(root)}: {_LINK}", file=sys.stderr)
            section.append(("p", ("skipped: ", _Code(link.name), f": {_LINK}.")))
        for js in sorted(p for p in d.glob("*.json") if not p.is_symlink()):
            obj, err = _try_read_json(js)
            if err is not None:  # shown, not skipped: a corrupt summary must not give an empty page
                note = f"unreadable: {js.relative_to(root)}: {err}"
                print(f"cbo-jax report: {note}", file=sys.stderr)
                section.append(("p", ("unreadable: ", _Code(js.name), f": {err}")))
            elif isinstance(obj, dict) and obj:
                env = obj.get("environment")
                if isinstance(env, dict):
                    obj = {k: v for k, v in obj.items() if k != "environment"}
                section.append(("p", (_Code(js.name),)))
                if isinstance(env, dict):
                    section.append(("p", _provenance_line(env)))
                if obj:
                    section.append(("table", *_kv_table(obj)))
        kids = [c for c in sorted(d.iterdir()) if _real_dir(c) and c.name not in _SKIP_DIRS]
        summaries = [(c.name, s) for c in kids if isinstance(s := _read_json(c / "summary.json"), dict)]
        if len(summaries) >= 2:
            comp = _comparison(summaries)
            if comp is not None:
                section.append(("p", ("Comparison of the sub-directories' ", _Code("summary.json"),
                                      " (numbers that differ):")))
                section.append(("table", *comp))
        grouped = _seed_groups(kids) if len(summaries) < 2 else []
        if len(grouped) >= 2:  # METHOD/SEED/ (a reproduction): the methods by their runs' means
            comp = _comparison([(name, means) for name, means, _ in grouped])
            if comp is not None:
                section.append(("p", ("Comparison of the sub-directories by the mean over the runs below each "
                                      "(their ", _Code("summary.json"), "; numbers that differ):")))
                section.append(("table", *comp))
        series = {}  # siblings' curves: a child's runs (lists over runs, as it records them) by their mean
        for c in kids:
            if _regular(c / "metrics.jsonl") and (rows := _read_jsonl(c / "metrics.jsonl")):
                series.update(_run_series(rows, c.name, _recorded_runs(c), mean=True))
        if len(grouped) >= 2:
            for name, _, rows in grouped:
                if rows:
                    series[name] = rows
        if len(series) < 2:  # a single child's curves are drawn in its own section
            series = {}
        own = _read_jsonl(d / "metrics.jsonl") if _regular(d / "metrics.jsonl") else []
        if own and not (d != root and _metrics_children(d.parent) >= 2):
            series = {**_run_series(own, d.name or "run", _recorded_runs(d)), **series}
        if series:
            png = _curves_png(series, f"{title}: metrics.jsonl")
            if png is not None:
                section.append(("img", png, f"{title}: curves from metrics.jsonl", f"{_slug(title)}_curves.png"))
        # regular files only: a directory or a broken link named *.png failed with a traceback, and a
        # link put its target's bytes in the page
        for img in sorted(p for p in d.glob("*.png") if _regular(p)):
            try:
                section.append(("img", _read_bytes(img), f"{title}/{img.name}", f"{_slug(title)}_{img.name}"))
            except OSError as err:
                section.append(("p", ("unreadable: ", _Code(img.name), f": {err.strerror or err}")))
        if section:
            blocks.append(("h", level, title))
            blocks.extend(section)
    return blocks


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text).strip("_") or "root"


# --------------------------------------------------------------------------- renderers

_CSS = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.85rem}td,th{border:1px solid #ccc;padding:.2rem .5rem;
text-align:left}th{background:#f3f3f3}img{max-width:100%;margin:.5rem 0}h2{border-bottom:1px solid #ddd}
code{background:#f5f5f5;padding:0 .2rem}figure{margin:0 0 1rem}figcaption{font-size:.8rem;color:#555}"""


def _html_parts(parts: tuple) -> str:
    return "".join(f"<code>{html.escape(p)}</code>" if isinstance(p, _Code) else html.escape(p) for p in parts)


def _to_html(blocks: list[tuple]) -> str:
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_html_parts(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif b[0] == "img":
            data = base64.b64encode(b[1]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(b[2])}</figcaption></figure>")
    title = html.escape(blocks[0][2]) if blocks and blocks[0][0] == "h" else "cbo_jax report"
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
            f"</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")


def _md_text(text: str) -> str:
    """Text from the results directory as Markdown shows it literally: HTML-significant characters as
    entities (no tag, no autolink), Markdown's own escaped (no code span, emphasis, link or image),
    line breaks as spaces (no new block: a heading, a table row)."""
    text = _LINE_BREAKS.sub(" ", text)
    text = re.sub(r"([\\`*\[\]#~])", r"\\\1", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)  # snake_case stays readable
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_code(text: str) -> str:
    """``text`` as a Markdown code span, shown as it is: the fence is one backtick longer than the
    longest run of backticks in it (a backtick in a name ended the span), padded with a space where
    the text begins or ends with a backtick (CommonMark strips one space on each side)."""
    text = _LINE_BREAKS.sub(" ", text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_cell(text: str) -> str:
    return _md_text(text).replace("|", "\\|")


def _to_markdown(blocks: list[tuple], out_path: Path) -> str:
    files = out_path.parent / f"{out_path.stem}_files"
    lines = []
    for b in blocks:
        if b[0] == "h":
            lines.append(f"{'#' * b[1]} {_md_text(b[2])}\n")
        elif b[0] == "p":
            lines.append("".join(_md_code(p) if isinstance(p, _Code) else _md_text(p) for p in b[1]) + "\n")
        elif b[0] == "table":
            lines.append("| " + " | ".join(_md_cell(h) for h in b[1]) + " |")
            lines.append("|" + " --- |" * len(b[1]))
            lines.extend("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b[2])
            lines.append("")
        elif b[0] == "img":
            if files.is_symlink():
                raise OSError(f"{files} is {_LINK}: the report's images are not written through it")
            files.mkdir(parents=True, exist_ok=True)
            image = files / b[3]
            if image.is_symlink():  # the report's own folder: a link there is replaced, never written through
                image.unlink()
            image.write_bytes(b[1])
            lines.append(f"![{_md_text(b[2])}]({urllib.parse.quote(f'{files.name}/{b[3]}')})\n")  # a space ends a link
    return "\n".join(lines)


def render(results_dir: str | Path, out: str | Path | None = None, fmt: str | None = None) -> Path:
    """Render ``results_dir`` into one report file and return its path.

    Args:
      results_dir: a directory written by ``cbo-jax demo``, ``run``, ``reproduce`` (or
        any directory of such directories).
      out: the report file (default ``results_dir/report.html`` or ``report.md``); an
        existing directory gets ``report.html`` or ``report.md`` inside it.
      fmt: ``"html"`` or ``"md"``; by default taken from ``out``'s suffix, else HTML.

    Raises:
      FileNotFoundError: ``results_dir`` is not a directory.
      ValueError: unknown ``fmt``; ``results_dir`` holds no results (symbolic links below it
        are not followed: listed as skipped); the report cannot be written at ``out``, or
        ``out`` is an existing file that is not a report (``.html``, ``.md``), a results file
        (``.json``, ``.jsonl``, ``.png``, ``.npz``) or a symbolic link.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist or is not a directory")
    if fmt is None:
        fmt = "md" if out is not None and Path(out).suffix.lower() in (".md", ".markdown") else "html"
    if fmt not in ("html", "md"):
        raise ValueError(f"fmt must be 'html' or 'md', got {fmt!r}")
    out_path = Path(out) if out is not None else root / f"report.{fmt}"
    if out_path.is_dir():  # ``-o reports/``: the report goes inside (writing to it would raise IsADirectoryError)
        out_path = out_path / f"report.{fmt}"
    suffix = out_path.suffix.lower()
    if suffix not in _REPORT_SUFFIXES and (out_path.exists() or suffix in _RESULT_SUFFIXES):
        # `-o run/metrics.jsonl` replaced the run's own rows with the report's HTML
        what = "an existing file" if out_path.exists() else f"a {suffix} file, which later reports read as results"
        raise ValueError(f"will not write the report to {out_path}: it is {what}; give a path ending in .html or .md "
                         f"(or a directory)")
    if out_path.is_symlink():  # a results directory's report.html -> ~/.bashrc: writing replaced the target
        raise ValueError(f"will not write the report to {out_path}: it is a symbolic link; give the path it points "
                         f"to, or remove the link")
    try:  # before the report is built: an unwritable path was an OSError traceback
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # was "File exists": a file stands where a directory of the path should be
        from cbo_jax.runtime.results import _not_a_directory

        raise ValueError(f"cannot write the report to {out_path}: {_not_a_directory(out_path.parent)} is a file, "
                         f"not a directory") from None
    except OSError as err:
        raise ValueError(f"cannot write the report to {out_path}: {err.strerror or err}") from None
    found, links = _walk(root, None)
    if not found:  # an empty page and exit status 0 hid a wrong path
        n = sum(len(v) for v in links.values())
        skipped = f" ({n} symbolic link{'s' * (n != 1)} skipped: the report reads no file through a link)" if n else ""
        raise ValueError(f"no results found in {root}: no .json, .jsonl or .png files below it{skipped}")
    blocks = _blocks(root, out_path)
    try:
        text = _to_html(blocks) if fmt == "html" else _to_markdown(blocks, out_path)
        out_path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot write the report to {out_path}: {err.strerror or err}") from None
    return out_path
