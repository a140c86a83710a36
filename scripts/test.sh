#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up (the project's .venv), lint, then pytest (real nsys, real Slurm,
# real torch, real DuckDB). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The whole run's wall time, printed last, also when a step fails.
wall() { echo "test.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s wall"; }
trap wall EXIT

bash scripts/setup.sh >/dev/null
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
"$py" -m ruff check orchestrator tests scripts
# The package to bytecode first, as `pip install` does: an editable install started with
# PYTHONDONTWRITEBYTECODE set (these machines' default) compiles every module again in each of the
# suite's hundreds of orch processes (0.1 to 0.2 s of CPU each).
"$py" -m compileall -q orchestrator
shellcheck scripts/*.sh
# The run writes stores, captures and Slurm spools under the temp directory (a passed test's
# files go at once, pyproject.toml): a disk that fills mid-run fails tests at random, so too
# little room fails here, in one line.
tmp=${TMPDIR:-/tmp}
free_kb=$(df -Pk "$tmp" 2>/dev/null | awk 'NR == 2 {print $4}' || true)
free_gb=$(( ${free_kb:-0} / 1048576 ))
if [ -n "$free_kb" ] && [ "$free_gb" -lt 6 ]; then
  echo "test.sh: only ${free_gb} GB free under $tmp, and the suite writes up to about 5 GB there:" \
       "free some space, or point TMPDIR at a larger disk" >&2
  exit 1
fi
# A pytest-xdist worker per core and two more (ORCH_TEST_WORKERS=1: one process): tests/conftest.py
# hands each group whole to one worker, the jobs in order first on one, the Slurm tests in order
# first on another, each other module whole beside and after them, largest first. The two job
# chains mostly wait for their jobs, so the other workers keep every core busy meanwhile; each
# worker's orch processes take their share of the cores, ORCH_DUCKDB_THREADS (docs/development.md).
# The slowest tests, each lane's time and CPU, and the modules that spent most CPU close every
# run: where the time goes.
workers=${ORCH_TEST_WORKERS:-$(( $(nproc) + 2 ))}
xdist=()
if [ "$workers" -gt 1 ]; then xdist=(-n "$workers"); fi
"$py" -m pytest -q -p no:cacheprovider "${xdist[@]}" --durations=25 "$@"
