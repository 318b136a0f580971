#!/usr/bin/env bash
# The accelerator suite (benchmarks/gpu_suite.py) on a machine lent for a few minutes, in one command.
#
#   bash benchmarks/gpu_lease.sh prepare        # where pip works: .whl/ (CBXpy) and .gpu_data/mnist (MNIST)
#   bash benchmarks/gpu_lease.sh run [BUDGET]   # on the accelerator: every part within BUDGET s (default 330)
#
# `prepare` fills two git-ignored folders that the lent machine cannot fetch for itself: the CBXpy
# wheel (the CBO peer; pure Python, for the machine's Python, PYVER, default 3.12) and the four real
# MNIST files (from CBO_JAX_DATA_DIR, else ../shared/data) for the fedcbo-table1 part. Carry both
# with the command. `run` needs no network and no install of cbo_jax: the package runs from this
# tree (PYTHONPATH). It writes to $OUT (default ./gpu_out) at most eight files, none in a folder:
# RESULTS_gpu.md and .json (the table, rewritten after every part), suite.log (every part's
# progress), device.txt (nvidia-smi, JAX and its devices), meanfield_scaling.png and
# table1_summary.json; the table is printed last. Copy RESULTS_gpu.md and .json into benchmarks/.
# docs/development.md ("Running the GPU suite") has the steps.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

case "${1:-}" in
prepare)
  set -e
  rm -rf .whl && mkdir -p .whl
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl cbx==1.0.4
  src=${CBO_JAX_DATA_DIR:-../shared/data}
  [ -d "$src/mnist" ] || { echo "no MNIST files in $src/mnist: set CBO_JAX_DATA_DIR" >&2; exit 1; }
  rm -rf .gpu_data && mkdir -p .gpu_data/mnist
  cp "$src"/mnist/*-ubyte* .gpu_data/mnist/
  du -sh .whl .gpu_data
  echo "carry: [\".whl\", \".gpu_data\"]"
  ;;
run)
  budget=${2:-330}
  out=${OUT:-$PWD/gpu_out}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT  # the parts' own files and CBXpy's install; what is kept is copied to $out
  mkdir -p "$out"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  # Parts and their subprocesses (the float64 worker) share the device one after another: each takes
  # memory as it needs it instead of 75 % of the card at start.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps --target "$work/site" .whl/*.whl \
      && export PYTHONPATH="$work/site:$PYTHONPATH"
  fi
  [ -d .gpu_data/mnist ] && export CBO_JAX_DATA_DIR="$PWD/.gpu_data"
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu \
      --format=csv 2>&1 || echo "nvidia-smi: not available"
    "$PY" -c 'import sys, jax, jaxlib; print("python", sys.version.split()[0], "| jax", jax.__version__, "| jaxlib", jaxlib.__version__); print(jax.devices())' 2>&1
    "$PY" -c 'import importlib.metadata as m, cbx; print("cbx", m.version("cbx"))' 2>&1 | tail -n 1
    echo "CBO_JAX_DATA_DIR=${CBO_JAX_DATA_DIR:-<unset>} budget=${budget}s"
  } | tee "$out/device.txt"
  "$PY" benchmarks/gpu_suite.py --budget "$budget" --out "$out/RESULTS_gpu.md" --work "$work" 2> >(tee "$out/suite.log" >&2)
  rc=$?
  cp "$work/meanfield-scaling/meanfield_scaling.png" "$out/" 2>/dev/null
  cp "$work/fedcbo-table1/summary.json" "$out/table1_summary.json" 2>/dev/null
  sleep 1  # the tee of stderr
  echo "gpu_lease: suite exit status $rc; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
  exit $rc
  ;;
*)
  echo "usage: bash benchmarks/gpu_lease.sh prepare | run [BUDGET_SECONDS]" >&2
  exit 2
  ;;
esac
