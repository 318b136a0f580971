# Sourced by the .ci scripts (not run on its own).
# fresh_venv: a new virtual environment in a temporary directory, activated, with an up-to-date pip.
fresh_venv() {
  local venv
  venv="$(mktemp -d)/venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  python -m pip install --quiet --upgrade pip
}

# read_floors [ARGS...]: the pinned lower bounds `.ci/floors.py ARGS` prints, into the array `floors`
# (the step fails on a requirement without a lower bound).
read_floors() {
  local lines
  lines="$(python .ci/floors.py "$@")"
  mapfile -t floors <<< "$lines"
}
