#!/usr/bin/env bash
# Install orch and what its tests and demo use into the project's own virtual environment
# (.venv/ beside this checkout, or $ORCH_VENV), never into the interpreter it is given:
# Debian 12 marks its Python as managed by apt (PEP 668), and two checkouts sharing one
# interpreter would overwrite each other's editable `orch`.
#   1. system packages (as root on Debian: nsys, Slurm, munge, MariaDB, shellcheck, chromium,
#      python3-venv);
#   2. the environment, made from $PYTHON (default python3), reused while it matches that
#      interpreter's version;
#   3. the CPU build of torch, and orch itself (editable) with its test extras, skipped when
#      the stamp says this pyproject.toml and torch pin are already installed.
# Prints the environment's path on its last line; scripts source scripts/venv.sh to use it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -eq 0 ]; then
  bash scripts/install_system_deps.sh
else
  echo "setup: not root, skipping system packages (see scripts/install_system_deps.sh)" >&2
fi

py=${PYTHON:-python3}
venv=${ORCH_VENV:-$PWD/.venv}
torch_pin="torch==${ORCH_TORCH_VERSION:-2.13.0}"
if ! command -v "$py" >/dev/null 2>&1; then
  echo "setup: error: PYTHON=$py is not an interpreter on PATH; set PYTHON to a Python >= 3.10" >&2
  exit 2
fi
want=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
have=$("$venv/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  [ -z "$have" ] || echo "setup: $venv is Python $have, $py is $want: making it anew" >&2
  if ! "$py" -m venv --clear "$venv"; then
    echo "setup: error: '$py -m venv' failed; on Debian install python3-venv (apt-get install python3-venv)" >&2
    exit 2
  fi
fi

# The stamp names what was installed: the interpreter, the torch pin and pyproject.toml's hash.
stamp="$venv/.orch-setup"
want_stamp="$want $torch_pin $(sha256sum pyproject.toml | cut -d' ' -f1) $PWD"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
  # --no-compile, then every installed module to bytecode at once on all cores: pip compiles one
  # file at a time, most of torch's install (docs/benchmarks-code.md). Bytecode is still made
  # here, once: these machines set PYTHONDONTWRITEBYTECODE, so what is not compiled now is
  # compiled again by every process that imports it.
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile)
  # torch first, pinned to the CPU build this machine carries; a later `torch>=2.1` in the
  # extras is then already satisfied instead of pulling a multi-GB CUDA build.
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    "${pip[@]}" "$torch_pin"
  fi
  "${pip[@]}" -e ".[test]"
  # A few files are not this Python's (torch's tests of newer syntax): pip skips them the same way.
  "$venv/bin/python" -m compileall -q -j 0 "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  printf '%s\n' "$want_stamp" >"$stamp"
fi
echo "setup: orch is installed in $venv (run $venv/bin/orch, or: source $venv/bin/activate)" >&2
echo "$venv"
