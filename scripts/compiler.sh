#!/usr/bin/env bash
# The chunk loop (src/atari_zarr/storage/_chunk_loop.c) is compiled when the package is
# installed: a C compiler and Python's headers. Where either is missing, Debian's are
# installed with apt-get; where that fails, the install goes on without the loop (chunks
# then decode one call each, on one core). $1 is the venv's python.
set -euo pipefail
VPY="${1:-python3}"
include=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if command -v cc >/dev/null 2>&1 && [ -f "$include/Python.h" ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
version=$("$VPY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
packages=(gcc libc6-dev)
[ -f "$include/Python.h" ] || packages+=("python${version}-dev")
$SUDO apt-get install -y -q --no-install-recommends "${packages[@]}" \
  || { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends "${packages[@]}"; } \
  || echo "no C compiler could be installed: atari-zarr installs without its chunk loop"
