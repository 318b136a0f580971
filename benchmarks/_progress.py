"""Rows written as they finish, so that a benchmark stopped part-way leaves what it measured.

A benchmark given ``--progress PATH`` appends one JSON line per finished row (one N of a
throughput table, say) and flushes it at once. ``benchmarks/gpu_suite.py`` passes a path to
each part and, when a part runs out of its time, reads back the rows it finished instead of
losing the whole part (a lent accelerator gives few minutes, and a timeout must not cost
everything measured before it).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--progress", metavar="PATH", default=None,
                    help="append each finished row to PATH as one JSON line, at once (read back when a run is stopped)")


def append(path: str | os.PathLike | None, row: dict) -> None:
    """Append ``row`` to ``path`` as one JSON line and flush it to disk (no-op without a path)."""
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read(path: str | os.PathLike) -> list[dict]:
    """The rows in ``path`` (a last line cut short by a kill is dropped)."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
