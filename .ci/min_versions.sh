#!/usr/bin/env bash
# The README's test command against the oldest versions pyproject.toml allows for the libraries
# the numerics rest on: Python 3.11 (this machine's python3), jax and jaxlib 0.7.0, flax 0.11.2;
# every other dependency as pip resolves it. Called by .ci/run; runs on its own too.
#
# Checks pinned bit for bit with the JAX the main run installs hold to stated rounding
# tolerances here (tests/_stack.py).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[test]" "jax==0.7.0" "jaxlib==0.7.0" "flax==0.11.2"
python -c "import sys, jax, flax; print(f'Python {sys.version.split()[0]}, jax {jax.__version__}, flax {flax.__version__}')"
python -m pytest -q -p no:cacheprovider
