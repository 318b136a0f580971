"""Print the lower bounds pyproject.toml claims, one ``name==version`` a line.

Covers the package's dependencies and its ``test`` extra: the set `.ci/min_versions.sh` installs
to run the README's test command on the oldest versions the package says it supports. With
``--extras docs,typecheck`` it prints those extras' bounds alone (`.ci/dev_floors.sh` runs mypy
and the docs build on them). Every such requirement must carry a ``>=`` bound; one without is an
error, so a new dependency cannot join untested.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def floors(pyproject: Path, extras: tuple[str, ...] | None = None) -> list[str]:
    """``name==version`` for every lower bound: the dependencies and the ``test`` extra, or with
    ``extras`` those extras alone."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project["optional-dependencies"]
    if extras is None:
        reqs = list(project["dependencies"]) + list(optional["test"])
    else:
        unknown = sorted(set(extras) - set(optional))
        if unknown:
            raise SystemExit(f"no extra named {', '.join(unknown)} in pyproject.toml")
        reqs = [req for extra in extras for req in optional[extra]]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--extras", help="comma-separated extras to print instead (e.g. docs,typecheck)")
    args = parser.parse_args()
    print("\n".join(floors(args.root / "pyproject.toml", tuple(args.extras.split(",")) if args.extras else None)))
