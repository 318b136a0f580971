#!/usr/bin/env bash
# mypy and the docs build (-W) with the docs and typecheck extras at the lower bounds pyproject.toml
# states (sphinx, myst-parser, furo, mypy; `.ci/floors.py --extras docs,typecheck` reads them), in a
# fresh environment with the package's dependencies as pip resolves them: these are tools run on the
# source, not against the oldest jax (whose jaxlib ships without stubs). About 2.5 min; run by hand
# when a bound or the tools' configuration changes (not part of .ci/run, to keep CI under 45 min).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=.ci/_venv.sh
. .ci/_venv.sh
fresh_venv
read_floors --extras docs,typecheck
echo "oldest docs and typecheck versions: ${floors[*]}"
python -m pip install --quiet -e ".[docs,typecheck]" "${floors[@]}"
python -m mypy --cache-dir "$(mktemp -d)"
python -m sphinx -W --keep-going -q -b html docs "$(mktemp -d)/html"
echo "docs and type check passed on their extras' lower bounds"
