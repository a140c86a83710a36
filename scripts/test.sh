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
