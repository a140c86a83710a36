#!/usr/bin/env bash
# Install orch and what its tests and demo use, into the current Python:
# system packages (as root on Debian: nsys, Slurm, munge, MariaDB, shellcheck, chromium),
# the CPU build of torch, and orch itself (editable) with its test extras.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -eq 0 ]; then
  bash scripts/install_system_deps.sh
else
  echo "setup: not root, skipping system packages (see scripts/install_system_deps.sh)" >&2
fi
py=${PYTHON:-python3}
# torch first, pinned to the CPU build this machine carries; a later `torch>=2.1` in the
# extras is then already satisfied instead of pulling a multi-GB CUDA build.
if ! "$py" -c 'import torch' 2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check "torch==${ORCH_TORCH_VERSION:-2.13.0}"
fi
"$py" -m pip install -q --disable-pip-version-check -e ".[test]"
