"""Print the lower bounds pyproject.toml claims, one ``name==version`` a line.

Covers the package's dependencies and its ``test`` extra: the set `.ci/min_versions.sh` installs
to run the README's test command on the oldest versions the package says it supports. Every such
requirement must carry a ``>=`` bound; one without is an error, so a new dependency cannot join
untested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def floors(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    pins: dict[str, str] = {}
    for req in reqs:
        m = _REQ.match(req.split(";")[0])
        if m is None:
            raise SystemExit(f"cannot read the requirement {req!r}")
        name, spec = m.group(1).lower(), m.group(2)
        low = re.findall(r"(?:>=|==)\s*([^,\s]+)", spec)
        if not low:
            raise SystemExit(f"{name}: no lower bound (>=) in pyproject.toml; the oldest-versions check needs one")
        if name in pins and pins[name] != low[0]:
            raise SystemExit(f"{name}: two different lower bounds ({pins[name]}, {low[0]})")
        pins[name] = low[0]
    return [f"{name}=={version}" for name, version in pins.items()]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("\n".join(floors(root / "pyproject.toml")))
