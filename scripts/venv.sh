# shellcheck shell=bash
# Sourced by the project's scripts: use the environment scripts/setup.sh made, so `python3`,
# `orch`, and the jobs these scripts submit (which run `python3` from PATH) are that
# environment's, whatever the interpreter on PATH is.
venv=${ORCH_VENV:-$PWD/.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "no environment at $venv: run bash scripts/setup.sh first" >&2
  exit 2
fi
export VIRTUAL_ENV=$venv
export PATH="$venv/bin:$PATH"
# shellcheck disable=SC2034  # read by the scripts that source this file
py=$venv/bin/python
