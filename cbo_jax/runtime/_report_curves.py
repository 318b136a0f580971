"""The curves of a report (:mod:`cbo_jax.runtime.report`): one PNG of small multiples,
drawn with matplotlib from the series :mod:`cbo_jax.runtime._report_data` reads."""

from __future__ import annotations

import io
import math
from typing import Any

from cbo_jax.runtime._report_data import _categorical, _drawable, _number

_MAX_CURVES = 6          # numeric metrics columns drawn per figure


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


def _entry(column: str, i: int) -> str:
    """The name of entry ``i`` of a list-valued column, as its legend shows it."""
    return f"cluster {i}" if column.endswith("per_cluster") else f"[{i}]"


def _curves_png(series: dict[str, list[dict]], title: str) -> bytes | None:
    """Small multiples: one panel per numeric column, one line per labelled run; a list-valued
    column one line per entry (per cluster), steps for a categorical one (indices)."""
    from cbo_jax.runtime.plotting import subplots

    # ranked over every run drawn, so that the first run's columns do not push out the others'
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
