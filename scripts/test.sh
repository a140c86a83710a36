#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up (the project's .venv), lint, then pytest (real nsys, real Slurm,
# real torch, real DuckDB). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh >/dev/null
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
"$py" -m ruff check orchestrator tests scripts
shellcheck scripts/*.sh
"$py" -m pytest -q -p no:cacheprovider "$@"
