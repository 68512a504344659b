#!/usr/bin/env bash
# Installs the Debian packages in tools/debian-packages.txt that are missing (root or sudo), and
# checks for the CUDA toolkit (NVRTC + cuda.h) that the build needs but Debian does not provide.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t wanted < <(grep -v '^\s*#' "$here/debian-packages.txt" | grep -v '^\s*$')
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nvrtc.h" ] || [ ! -f "$cuda/include/cuda.h" ]; then
  echo "error: the CUDA toolkit (nvrtc.h, cuda.h, libnvrtc) was not found under $cuda;" \
       "install CUDA 12.x/13.x there or set CUDA_HOME" >&2
  exit 1
fi
