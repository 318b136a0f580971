#!/usr/bin/env bash
# mypy and the docs build (-W) with the docs and typecheck extras at the lower bounds pyproject.toml
# states (sphinx, myst-parser, furo, mypy; `.ci/floors.py --extras docs,typecheck` reads them), in a
# fresh environment with the package's dependencies as pip resolves them: these are tools run on the
# source, not against the oldest jax (whose jaxlib ships without stubs). About 2.5 min; run by hand
# when a bound or the tools' configuration changes (not part of .ci/run, to keep CI under 45 min).
set -euo pipefail
cd "$(dirname "$0")/.."

dev_venv="$(mktemp -d)/venv"
python3 -m venv "$dev_venv"
# shellcheck disable=SC1091
. "$dev_venv/bin/activate"
python -m pip install --quiet --upgrade pip
dev_lines="$(python .ci/floors.py --extras docs,typecheck)"
mapfile -t dev_floors <<< "$dev_lines"
echo "oldest docs and typecheck versions: ${dev_floors[*]}"
python -m pip install --quiet -e ".[docs,typecheck]" "${dev_floors[@]}"
python -m mypy --cache-dir "$(mktemp -d)"
python -m sphinx -W --keep-going -q -b html docs "$(mktemp -d)/html"
echo "docs and type check passed on their extras' lower bounds"
