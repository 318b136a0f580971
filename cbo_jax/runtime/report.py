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

import datetime as _dt
import math
import sys
from pathlib import Path
from typing import Any

# What the report reads, draws and writes, one module each; the sections and tables are here.
from cbo_jax.runtime._report_curves import _curves_png
from cbo_jax.runtime._report_data import (_LINK, _SKIP_DIRS, _categorical, _mean_rows, _metrics_children, _number,
                                          _read_bytes, _read_json, _read_jsonl, _real_dir, _recorded_runs, _regular,
                                          _run_series, _try_read_json, _walk)
from cbo_jax.runtime._report_format import _Code, _to_html, _to_markdown

# Private names of the modules above, importable from here too (tests and callers that reach in use this module).
from cbo_jax.runtime._report_curves import _MAX_CURVES, _entry, _numeric_columns  # noqa: F401
from cbo_jax.runtime._report_data import (_CATEGORICAL_WORDS, _MAX_LINES, _count, _drawable, _mean,  # noqa: F401
                                          _report_images)
from cbo_jax.runtime._report_format import (_CSS, _LINE_BREAKS, _html_parts, _md_cell, _md_code,  # noqa: F401
                                            _md_text)

__all__ = ["render", "flatten"]

_MAX_TABLE_ROWS = 200    # key/value rows shown per JSON file
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


def _kv_table(obj: dict) -> tuple[list[str], list[list[str]]]:
    flat = flatten(obj)
    rows = [[k, _fmt(v)] for k, v in list(flat.items())[:_MAX_TABLE_ROWS]]
    if len(flat) > _MAX_TABLE_ROWS:
        rows.append(["…", f"{len(flat) - _MAX_TABLE_ROWS} more keys"])
    return ["key", "value"], rows


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
        # regular files only: a directory or a broken link named *.png would fail with a traceback, and a
        # link would put its target's bytes in the page
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
        # `-o run/metrics.jsonl` would replace the run's own rows with the report's HTML
        what = "an existing file" if out_path.exists() else f"a {suffix} file, which later reports read as results"
        raise ValueError(f"will not write the report to {out_path}: it is {what}; give a path ending in .html or .md "
                         f"(or a directory)")
    if out_path.is_symlink():  # a results directory's report.html -> ~/.bashrc: writing would replace the target
        raise ValueError(f"will not write the report to {out_path}: it is a symbolic link; give the path it points "
                         f"to, or remove the link")
    try:  # before the report is built: an unwritable path is one line naming it, not an OSError traceback
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file stands where a directory of the path should be (OSError says "File exists")
        from cbo_jax.runtime.results import _not_a_directory

        raise ValueError(f"cannot write the report to {out_path}: {_not_a_directory(out_path.parent)} is a file, "
                         f"not a directory") from None
    except OSError as err:
        raise ValueError(f"cannot write the report to {out_path}: {err.strerror or err}") from None
    found, links = _walk(root, None)
    if not found:  # an empty page and exit status 0 would hide a wrong path
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
