#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the main job.
#   No GPU: precompile the default variants for sm_90a (H100/H200), then list the cache.
#   GPU:    precompile for the GPU found, verify against the float64 reference, short bench.
# FLASHJIT_BUILD_DIR picks the build directory (default build/); the cache follows the library's
# order ($FLASHJIT_CACHE_DIR, $XDG_CACHE_HOME/flashjit, ~/.cache/flashjit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHJIT_BUILD_DIR:-$root/build}
"$root/tools/install_deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target flashjit_cli
exec "$root/tools/main_job.sh" "$build/tools/flashjit"
