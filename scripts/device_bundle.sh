#!/usr/bin/env bash
# What a GPU machine without a package index needs to run orch and scripts/gpu_faults.sh, in DIR:
# DIR/wheels (orch and its dependencies built for that machine's Python, default 3.12; pyarrow,
# which only orch's sqlite3 fallbacks import, is left out to keep the bundle small) and DIR/debs
# (Debian's libdw1 and libelf1, which the nsys inside Nsight Compute needs beside its host
# folder). scripts/device_faults_check.sh installs both there. Needs pip and apt-get here.
# Usage: scripts/device_bundle.sh DIR [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=$(realpath -m "${1:?usage: $0 DIR [PYTHON_VERSION]}")
pyver=${2:-3.12}
py=${PYTHON:-python3}
rm -rf "$dir/wheels" "$dir/debs"
mkdir -p "$dir/wheels" "$dir/debs"
"$py" -m pip wheel . --no-deps -q -w "$dir/wheels"
# The runtime dependencies of pyproject.toml, pyarrow left out, plus nvtx for the workloads' ranges.
deps=$("$py" - <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if not d.startswith("pyarrow")))
PY
)
# shellcheck disable=SC2086 # the requirements are words
"$py" -m pip download -q --python-version "$pyver" --only-binary :all: -d "$dir/wheels" $deps nvtx==0.2.10
(cd "$dir/debs" && apt-get download libdw1 libelf1 2>/dev/null)
du -sh "$dir"
