#!/usr/bin/env bash
# The README's test command, less the reference tests (below), against the oldest versions
# pyproject.toml allows: Python 3.11 (this machine's python3) and every dependency of the
# package and of its test extra pinned at its lower bound (`.ci/floors.py` reads them from
# pyproject.toml, so a bound cannot be raised or lowered without this check running on it);
# everything else as pip resolves it. Called by .ci/run; runs on its own too. The docs and
# typecheck extras' bounds: .ci/dev_floors.sh.
#
# Checks pinned bit for bit with the JAX the main run installs hold to stated rounding
# tolerances here (tests/_stack.py).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=.ci/_venv.sh
. .ci/_venv.sh
fresh_venv
read_floors
echo "oldest versions: ${floors[*]}"
python -m pip install --quiet -e ".[test]" "${floors[@]}"
python -c "import sys, jax, flax, optax, orbax.checkpoint as o; print(f'Python {sys.version.split()[0]}, jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__}, orbax-checkpoint {o.__version__}')"
# The reference tests (marker `reference`, beside the tests of the modules they guard) are left
# out here: they are float64 NumPy references of this package's own formulas, written where
# mutation testing found a formula unchecked, and they call the same jax.numpy as the rest of the
# selection; about 100 s on 2 cores. The -m expression is pyproject.toml's addopts one plus them.
python -m pytest -q -p no:cacheprovider -m "not notebooks and not slow and not reference"
