#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test suite with ctest.
# Without a GPU the GPU suite reports itself as Skipped, with the reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHJIT_BUILD_DIR:-$root/build}
"$root/tools/install_deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j 1 "$@"
# ctest prints nothing of a skipped test: say here why the GPU suite did not run, if it did not,
# and which Python tests skipped and why.
{ ./tests/flashjit_gpu_tests --list-test-cases || true; } | grep '^SKIPPED' || true
cat tests/python_*.skipped 2>/dev/null || true
