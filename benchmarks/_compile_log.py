"""A pytest plugin that records every XLA backend compilation, and its summary.

    PYTHONPATH=benchmarks COMPILE_LOG=/tmp/compile_log pytest -p _compile_log -p no:cacheprovider tests/...
    python benchmarks/_compile_log.py /tmp/compile_log

Each pytest process (the controller and every pytest-xdist worker) writes
``$COMPILE_LOG.<pid>.json`` at exit: one ``[fun_name, seconds, test id]`` row per
``/jax/core/compile/backend_compile_duration`` event. The summary prints the total, the
programs under 0.1 s (eager calls) and the functions that took longest.
"""

from __future__ import annotations

import atexit
import collections
import glob
import json
import os
import sys

_rows: list = []
_test = ["-"]


def _listen(event: str, duration: float, **kw) -> None:
    if event.endswith("backend_compile_duration"):
        _rows.append((kw.get("fun_name", "?"), duration, _test[0]))


def pytest_configure(config):
    from jax._src import monitoring

    monitoring.register_event_duration_secs_listener(_listen)
    atexit.register(_dump)


def pytest_runtest_setup(item):
    _test[0] = item.nodeid


def _dump() -> None:
    with open(f"{os.environ.get('COMPILE_LOG', '/tmp/compile_log')}.{os.getpid()}.json", "w") as fh:
        json.dump(_rows, fh)


def summary(prefix: str) -> dict:
    rows = [r for f in glob.glob(f"{prefix}.*.json") for r in json.load(open(f))]
    per = collections.defaultdict(lambda: [0, 0.0])
    for name, sec, _ in rows:
        per[name][0] += 1
        per[name][1] += sec
    small = [r for r in rows if r[1] < 0.1]
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:10]
    return {"programs": len(rows), "seconds": round(sum(r[1] for r in rows), 1),
            "under_0.1s": [len(small), round(sum(r[1] for r in small), 1)],
            "longest": [[k, n, round(s, 1)] for k, (n, s) in top]}


if __name__ == "__main__":
    print(json.dumps(summary(sys.argv[1] if len(sys.argv) > 1 else "/tmp/compile_log"), indent=1))
