#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up, lint, then pytest (real nsys, real Slurm,
# real torch, real DuckDB). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
py=${PYTHON:-python3}
"$py" -m ruff check orchestrator tests scripts
shellcheck scripts/*.sh
"$py" -m pytest -q -p no:cacheprovider "$@"
