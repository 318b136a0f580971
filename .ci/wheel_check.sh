#!/usr/bin/env bash
# The distribution as a user gets it: build the sdist and the wheel, check them with twine, install the wheel
# (not editable) into a fresh virtual environment outside the source tree, then check that
#   - cbo_jax is imported from that environment's site-packages, not from the source tree;
#   - `cbo-jax --version` prints the version in the installed metadata (and in the wheel's file name);
#   - the wheel holds the bundled MNIST subset, its README, py.typed and cbo_jax.runtime, no test helper, and at
#     most 20 modules directly under cbo_jax/;
#   - `cbo-jax demo --rounds 2` runs from the wheel;
#   - the tests that need no source tree pass against the installed wheel.
# Called by .ci/run after the README's two commands; runs on its own too (`bash .ci/wheel_check.sh`), with the
# python on PATH used for building (it installs `build` and `twine` into that environment).
set -euo pipefail
cd "$(dirname "$0")/.."
src="$(pwd)"
work="$(mktemp -d)"
elapsed() { echo "  ($(( $(date +%s) - $1 )) s)"; }

# Test files that import only the installed package (no docs/, examples/, benchmarks/ or test helpers), as paths
# under tests/; they run from a copy of tests/ that holds them, conftest.py and the __init__.py of their folders.
SOURCE_FREE_TESTS=(test_release.py test_consensus.py federated/test_mnist.py federated/test_data.py runtime/test_report.py)

echo "+ build sdist and wheel"
start=$(date +%s)
python -m pip install --quiet build twine
python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
ls -l "$work/dist"
elapsed "$start"

echo "+ twine check"
start=$(date +%s)
python -m twine check --strict "$work/dist"/*
elapsed "$start"

wheel="$(ls "$work"/dist/*.whl)"
python - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"cbo_jax/py.typed", "cbo_jax/data/README.md", "cbo_jax/data/mnist_subset.npz", "cbo_jax/runtime/__init__.py"}
missing = need - names
assert not missing, f"the wheel lacks {sorted(missing)}"
print(f"  the wheel holds {', '.join(sorted(need))}")
# test helpers stay in tests/ (issue 58); the package's top level stays small
test_only = sorted(n for n in names if n.startswith("tests/") or n.endswith("_cbx_compare.py"))
assert not test_only, f"the wheel holds test-only files: {test_only}"
top = sorted(n for n in names if n.count("/") == 1 and n.startswith("cbo_jax/") and n.endswith(".py"))
assert len(top) <= 20, f"{len(top)} modules directly under cbo_jax/ (at most 20): {top}"
PY

echo "+ install the wheel into a fresh virtual environment outside the source tree"
start=$(date +%s)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
"$work/venv/bin/python" -m pip install --quiet "$wheel" pytest
elapsed "$start"

cd "$work"  # from here on nothing of the source tree is on the import path
export PATH="$work/venv/bin:$PATH"
location="$(python -c 'import cbo_jax; print(cbo_jax.__file__)')"
case "$location" in
  "$work/venv/"*) echo "  cbo_jax imported from $location" ;;
  *) echo "cbo_jax imported from $location, not from the fresh environment" >&2; exit 1 ;;
esac

echo "+ cbo-jax --version"
metadata_version="$(python -c 'from importlib.metadata import version; print(version("cbo-jax"))')"
wheel_version="$(basename "$wheel" | cut -d- -f2)"
printed="$(cbo-jax --version)"
echo "  $printed (metadata $metadata_version, wheel file $wheel_version)"
if [ "$printed" != "cbo-jax $metadata_version" ] || [ "$metadata_version" != "$wheel_version" ]; then
  echo "cbo-jax --version disagrees with the installed metadata or the wheel" >&2
  exit 1
fi

echo "+ cbo-jax demo --rounds 2 (from the wheel)"
start=$(date +%s)
cbo-jax demo --rounds 2 --no-progress --output "$work/demo" | tail -n 1 | python -c '
import json, sys
r = json.loads(sys.stdin.read())
assert set(r) >= {"fedcbo", "ifca", "fedavg", "local"}, r
print("  demo:", r)'
elapsed "$start"

echo "+ source-tree-free tests against the installed wheel"
start=$(date +%s)
mkdir "$work/tests"
for f in "${SOURCE_FREE_TESTS[@]}"; do
  dir="$(dirname "$f")"
  mkdir -p "$work/tests/$dir"
  cp "$src/tests/$f" "$work/tests/$f"
  while [ "$dir" != "." ]; do  # the test packages on the way (tests/federated/__init__.py, ...)
    cp "$src/tests/$dir/__init__.py" "$work/tests/$dir/"
    dir="$(dirname "$dir")"
  done
done
cp "$src/tests/conftest.py" "$work/tests/"
python -m pytest -q -p no:cacheprovider --rootdir "$work/tests" "$work/tests"
elapsed "$start"
rm -rf "$work"  # kept when a step fails, for a look at what went wrong
echo "wheel check passed"
