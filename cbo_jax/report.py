"""Render a results directory into one HTML or Markdown report (``cbo-jax report``).

Every run of cbo_jax writes plain files: ``summary.json`` (final numbers),
``metrics.jsonl`` (one JSON row per round or step), ``config.json`` and ``*.png`` plots.
:func:`render` walks a results directory and turns them into a single document:

* one section per directory that holds results, in path order;
* its ``summary.json`` (and any other ``*.json`` object) as a key/value table, with the
  ``environment`` block (:mod:`cbo_jax.provenance`) as one line above it: command,
  versions, device, commit, date;
* when the directory's sub-directories each hold a ``summary.json`` (methods of one
  comparison, seeds of one method), a comparison table with one row per sub-directory
  over the numbers they share;
* the curves of every ``metrics.jsonl`` below it, sub-directories overlaid, drawn with
  matplotlib;
* the ``*.png`` files it contains.

HTML reports are self-contained (images embedded as base64). Markdown reports write their
images next to the report, in ``<report stem>_files/``.

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
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Iterable

__all__ = ["render", "flatten"]

_MAX_CURVES = 6          # numeric metrics columns drawn per figure
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


def _read_json(path: Path) -> Any:
    return _try_read_json(path)[0]


def _try_read_json(path: Path) -> tuple[Any, str | None]:
    """``(object, None)``, or ``(None, reason)`` for a file that cannot be read or parsed."""
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as err:
        return None, str(err) or type(err).__name__


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        # undecodable bytes (a damaged file) spoil their line only: a UnicodeDecodeError stopped the whole report
        for line in path.read_text(errors="replace").splitlines():
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


def _numeric_columns(rows: list[dict]) -> list[str]:
    cols: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k in ("round", "step") or isinstance(v, bool) or not isinstance(v, (int, float)):
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


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _runs_in(rows: list[dict]) -> int | None:
    """The number of runs ``R`` when the rows hold numeric columns as lists over runs (``cbo-jax
    optimize`` and ``simulate(..., out=)`` write ``[v_1, ..., v_R]``, also for ``R = 1``);
    ``None`` when they do not."""
    lengths = {len(v) for r in rows for v in r.values()
               if isinstance(v, list) and v and all(_number(e) or e is None for e in v) and any(_number(e) for e in v)}
    return lengths.pop() if len(lengths) == 1 else None


def _run_series(rows: list[dict], label: str, mean: bool = False) -> dict[str, list[dict]]:
    """The rows as curves: as they are; with per-run lists, one series per run (``label run i``,
    up to 8 runs), else, or with ``mean``, their mean over the runs (non-finite entries left out)."""
    runs = _runs_in(rows)
    if runs is None:
        return {label: rows}

    def pick(r: dict, i: int | None) -> dict:
        out = {}
        for k, v in r.items():
            if isinstance(v, list) and len(v) == runs:
                vals = [e for e in v if _number(e) and math.isfinite(e)]
                if i is None:
                    if vals:
                        out[k] = sum(vals) / len(vals)
                elif _number(v[i]):
                    out[k] = v[i]
            elif _number(v) or k in ("round", "step"):
                out[k] = v
        return out

    if runs == 1:
        return {label: [pick(r, 0) for r in rows]}
    if mean or runs > 8:
        return {f"{label} (mean of {runs} runs)": [pick(r, None) for r in rows]}
    return {f"{label} run {i}": [pick(r, i) for r in rows] for i in range(runs)}


def _curves_png(series: dict[str, list[dict]], title: str) -> bytes | None:
    """Small multiples: one panel per numeric column, one line per labelled run."""
    from cbo_jax._plotting import subplots

    columns: list[str] = []
    for rows in series.values():
        for c in _numeric_columns(rows):
            if c not in columns:
                columns.append(c)
    columns = columns[:_MAX_CURVES]
    if not columns:
        return None
    ncol = min(3, len(columns))
    nrow = math.ceil(len(columns) / ncol)
    fig, axes = subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    colour = {label: f"C{i % 10}" for i, label in enumerate(series)}  # one colour per run in every panel
    for ax, col in zip(axes.flat, columns):
        for label, rows in series.items():
            pts = [(r.get("round", r.get("step", i + 1)), r[col]) for i, r in enumerate(rows)
                   if isinstance(r.get(col), (int, float)) and not isinstance(r.get(col), bool)]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label, color=colour[label])
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("round" if any("round" in r for rows in series.values() for r in rows[:1]) else "step",
                      fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    if 1 < len(series) <= 12:
        from matplotlib.lines import Line2D  # every run, also one the first panel has no points of

        axes.flat[0].legend(handles=[Line2D([], [], color=colour[lab], label=lab) for lab in series], fontsize=7)
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


def _provenance_line(env: dict) -> str:
    """A summary's ``environment`` block (:mod:`cbo_jax.provenance`) as one sentence."""
    parts = []
    if env.get("command"):
        parts.append(f"`{env['command']}`")
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
    return "Produced by " + "; ".join(parts) + "." if parts else "Produced by: (no environment recorded)."


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
        if (c / "summary.json").is_file():
            continue
        runs = [g for g in sorted(c.iterdir()) if g.is_dir() and g.name not in _SKIP_DIRS]
        flats = [flatten({k: v for k, v in s.items() if k != "environment"}) for g in runs
                 if isinstance(s := _read_json(g / "summary.json"), dict)]
        if not flats:
            continue
        keys = [k for k, v in flats[0].items() if _number(v) and all(_number(f.get(k)) for f in flats[1:])]
        means = {k: sum(f[k] for f in flats) / len(flats) for k in keys}
        label = f"{c.name} (mean of {len(flats)})" if len(flats) > 1 else c.name
        curves = [_read_jsonl(g / "metrics.jsonl") for g in runs if (g / "metrics.jsonl").is_file()]
        out.append((label, means, _mean_rows([r for r in curves if r])))
    return out


def _mean_rows(runs: list[list[dict]]) -> list[dict]:
    """Row by row (by ``round``/``step``), the mean of each numeric column over the runs holding it."""
    by_x: dict[Any, list[dict]] = {}
    for rows in runs:
        for i, r in enumerate(rows):
            by_x.setdefault(r.get("round", r.get("step", i + 1)), []).append(r)
    out = []
    for x in sorted(by_x, key=lambda v: (not _number(v), v if _number(v) else 0)):
        rows = by_x[x]
        row: dict[str, Any] = {"round" if "round" in rows[0] else "step": x}
        for k in {k for r in rows for k, v in r.items() if _number(v)} - {"round", "step"}:
            vals = [r[k] for r in rows if _number(r.get(k)) and math.isfinite(r[k])]
            if vals:
                row[k] = sum(vals) / len(vals)
        out.append(row)
    return out


def _metrics_children(d: Path) -> int:
    return sum((c / "metrics.jsonl").is_file() for c in d.iterdir() if c.is_dir())


def _report_images(d: Path) -> bool:
    """Whether ``d`` is a Markdown report's image folder (``X_files/`` beside ``X.md``): not results."""
    return d.name.endswith("_files") and (d.parent / (d.name[: -len("_files")] + ".md")).is_file()


def _dirs_with_results(root: Path, skip: Path | None) -> Iterable[Path]:
    seen = []
    for p in sorted(root.rglob("*")):
        if any(part in _SKIP_DIRS for part in p.relative_to(root).parts):
            continue
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if any(_report_images(a) for a in p.parents if root in a.parents):  # an earlier report's images
            continue
        if p.is_file() and p.suffix in (".json", ".jsonl", ".png"):
            if p.parent not in seen:
                seen.append(p.parent)
    for d in sorted(seen, key=lambda d: (len(d.relative_to(root).parts) > 0, str(d.relative_to(root)))):
        yield d


def _blocks(root: Path, out_path: Path | None) -> list[tuple]:
    blocks: list[tuple] = [("h", 1, f"cbo_jax results: {root.name or root}"),
                           ("p", f"Rendered {_dt.datetime.now().isoformat(timespec='seconds')} from `{root}` "
                                 f"by `cbo-jax report`.")]
    skip = out_path.parent / f"{out_path.stem}_files" if out_path is not None else None
    dirs = list(_dirs_with_results(root, skip))
    # parents whose children hold summaries also get a section (comparison tables, curves)
    parents = {d.parent for d in dirs if d != root and (d / "summary.json").is_file()}
    # and their parents, where those have no summary (METHOD/SEED/: the methods compared)
    parents |= {p.parent for p in parents if p != root and not (p / "summary.json").is_file()}
    dirs = sorted(set(dirs) | {p for p in parents if root in (p, *p.parents)},
                  key=lambda d: str(d.relative_to(root)))
    if not dirs:
        blocks.append(("p", "No results found (no .json, .jsonl or .png files)."))
        return blocks
    for d in dirs:
        rel = d.relative_to(root)
        title = str(rel) if str(rel) != "." else (root.name or str(root))
        level = 2 if len(rel.parts) <= 1 else 3
        section: list[tuple] = []
        for js in sorted(d.glob("*.json")):
            obj, err = _try_read_json(js)
            if err is not None:  # shown, not skipped: a corrupt summary must not give an empty page
                note = f"unreadable: {js.relative_to(root)}: {err}"
                print(f"cbo-jax report: {note}", file=sys.stderr)
                section.append(("p", f"unreadable: `{js.name}`: {err}"))
            elif isinstance(obj, dict) and obj:
                env = obj.get("environment")
                if isinstance(env, dict):
                    obj = {k: v for k, v in obj.items() if k != "environment"}
                section.append(("p", f"`{js.name}`"))
                if isinstance(env, dict):
                    section.append(("p", _provenance_line(env)))
                if obj:
                    section.append(("table", *_kv_table(obj)))
        kids = [c for c in sorted(d.iterdir()) if c.is_dir() and c.name not in _SKIP_DIRS]
        summaries = [(c.name, s) for c in kids if isinstance(s := _read_json(c / "summary.json"), dict)]
        if len(summaries) >= 2:
            comp = _comparison(summaries)
            if comp is not None:
                section.append(("p", "Comparison of the sub-directories' `summary.json` (numbers that differ):"))
                section.append(("table", *comp))
        grouped = _seed_groups(kids) if len(summaries) < 2 else []
        if len(grouped) >= 2:  # METHOD/SEED/ (a reproduction): the methods by their runs' means
            comp = _comparison([(name, means) for name, means, _ in grouped])
            if comp is not None:
                section.append(("p", "Comparison of the sub-directories by the mean over the runs below each "
                                     "(their `summary.json`; numbers that differ):"))
                section.append(("table", *comp))
        series = {}  # siblings' curves: a child's runs (lists over runs) by their mean
        for c in kids:
            if (c / "metrics.jsonl").is_file() and (rows := _read_jsonl(c / "metrics.jsonl")):
                series.update(_run_series(rows, c.name, mean=True))
        if len(grouped) >= 2:
            for name, _, rows in grouped:
                if rows:
                    series[name] = rows
        if len(series) < 2:  # a single child's curves are drawn in its own section
            series = {}
        own = _read_jsonl(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
        if own and not (d != root and _metrics_children(d.parent) >= 2):
            series = {**_run_series(own, d.name or "run"), **series}
        if series:
            png = _curves_png(series, f"{title}: metrics.jsonl")
            if png is not None:
                section.append(("img", png, f"{title}: curves from metrics.jsonl", f"{_slug(title)}_curves.png"))
        # a directory or a broken link named *.png is skipped (read_bytes failed with a traceback)
        for img in sorted(p for p in d.glob("*.png") if p.is_file()):
            section.append(("img", img.read_bytes(), f"{title}/{img.name}", f"{_slug(title)}_{img.name}"))
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


def _inline_code(text: str, md: bool) -> str:
    if md:
        return text
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _to_html(blocks: list[tuple]) -> str:
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline_code(b[1], md=False)}</p>")
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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _to_markdown(blocks: list[tuple], out_path: Path) -> str:
    files = out_path.parent / f"{out_path.stem}_files"
    lines = []
    for b in blocks:
        if b[0] == "h":
            lines.append(f"{'#' * b[1]} {b[2]}\n")
        elif b[0] == "p":
            lines.append(b[1] + "\n")
        elif b[0] == "table":
            lines.append("| " + " | ".join(_md_cell(h) for h in b[1]) + " |")
            lines.append("|" + " --- |" * len(b[1]))
            lines.extend("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b[2])
            lines.append("")
        elif b[0] == "img":
            files.mkdir(parents=True, exist_ok=True)
            (files / b[3]).write_bytes(b[1])
            lines.append(f"![{b[2]}]({urllib.parse.quote(f'{files.name}/{b[3]}')})\n")  # a space ends a link
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
      ValueError: unknown ``fmt``; ``results_dir`` holds no results; the report cannot be
        written at ``out``, or ``out`` is an existing file that is not a report (``.html``,
        ``.md``) or a results file (``.json``, ``.jsonl``, ``.png``, ``.npz``).
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
    try:  # before the report is built: an unwritable path was an OSError traceback
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # was "File exists": a file stands where a directory of the path should be
        from cbo_jax._results import _not_a_directory

        raise ValueError(f"cannot write the report to {out_path}: {_not_a_directory(out_path.parent)} is a file, "
                         f"not a directory") from None
    except OSError as err:
        raise ValueError(f"cannot write the report to {out_path}: {err.strerror or err}") from None
    if not any(True for _ in _dirs_with_results(root, None)):  # an empty page and exit status 0 hid a wrong path
        raise ValueError(f"no results found in {root}: no .json, .jsonl or .png files below it")
    blocks = _blocks(root, out_path)
    try:
        text = _to_html(blocks) if fmt == "html" else _to_markdown(blocks, out_path)
        out_path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot write the report to {out_path}: {err.strerror or err}") from None
    return out_path
