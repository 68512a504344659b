#!/usr/bin/env bash
# The main job of the quick start, given the flashjit CLI: what a user runs after building.
set -euo pipefail
flashjit=${1:?usage: main_job.sh PATH/TO/flashjit}
"$flashjit" info
if "$flashjit" info | grep -q '^GPU *no GPU'; then
  echo "== no GPU here: precompiling for sm_90a (H100/H200) =="
  "$flashjit" precompile --arch sm_90a
  "$flashjit" list --arch sm_90a
else
  echo "== precompiling for the GPU found =="
  "$flashjit" precompile
  "$flashjit" verify
  "$flashjit" bench --head-dim 128 --seqlens 1024,4096,16384
fi
