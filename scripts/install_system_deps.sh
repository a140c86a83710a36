#!/usr/bin/env bash
# Install the system pieces orch's real tests use on Debian 12 (bookworm), as root:
# Nsight Systems 2022.4 (Debian non-free), Slurm 22.05 + munge (+ slurmdbd/MariaDB for
# accounting), shellcheck, chromium and python3-venv. Idempotent: what is already there is kept,
# an nsys already on PATH (or $NSYS) is used as is.
set -euo pipefail

log() { printf 'install_system_deps: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "needs root (apt-get); run it with sudo or install the packages listed in this script by hand"
  exit 2
fi
if [ ! -r /etc/os-release ] || ! grep -q '^ID=debian' /etc/os-release; then
  log "not Debian: install nsight-systems, slurm-wlm, munge, shellcheck with your distribution's tools"
  exit 2
fi
# shellcheck disable=SC1091
. /etc/os-release
codename=${VERSION_CODENAME:-bookworm}

# nsight-systems lives in non-free and pulls libcuda1, whose nvidia-support is in contrib.
src=/etc/apt/sources.list.d/orch-nonfree.sources
if [ ! -e "$src" ]; then
  log "enabling contrib + non-free for $codename in $src"
  cat >"$src" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: $codename
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
fi

# chromium renders the HTML report in the tests (headless); python3-venv lets Debian's own
# Python make the project's environment (scripts/setup.sh).
pkgs=(slurm-wlm munge slurmdbd mariadb-server shellcheck chromium python3-venv)
nsys_bin=${NSYS:-$(command -v nsys || true)}
if [ -z "$nsys_bin" ] && [ ! -x /usr/lib/nsight-systems/target-linux-x64/nsys ]; then
  pkgs+=(nsight-systems)
else
  log "nsys already present: ${nsys_bin:-/usr/lib/nsight-systems/target-linux-x64/nsys}"
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's package misses one link: without it nsys leaves only a .qdstrm ("importer missing").
if [ -d /usr/lib/nsight-systems/host-linux-x64 ] && [ ! -e /usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64 ]; then
  mkdir -p /usr/lib/x86_64-linux-gnu/nsight-systems
  ln -s /usr/lib/nsight-systems/host-linux-x64 /usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
fi
log "ok: nsys=$(command -v nsys || echo missing) slurmctld=$(command -v slurmctld || echo missing)"
