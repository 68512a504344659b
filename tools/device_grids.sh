#!/usr/bin/env bash
# The published grids in one device call, FA4 in every process (docs/compare.md, "The grids in
# one call"): run on the GPU machine from the repository root, carrying LIBDIR (a packed
# libflashjit and what it links) and .fa4 (shared/device/fa4/bundle.sh).
#
#   bash tools/device_grids.sh LIBDIR [GRID...]    GRID: decode backward bwdk standard features
#                                                  (default: all five, in that order)
#   BUDGET=575 (seconds for all of them), OUT (the call's output folder)
set -uo pipefail
cd "$(dirname "$0")/.."
lib_dir=$(cd "${1:?usage: device_grids.sh LIBDIR [GRID...]}" && pwd) || exit 2
shift
grids=("$@")
[[ ${#grids[@]} -gt 0 ]] || grids=(decode backward bwdk standard features)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
[[ -d /tmp/site/flash_attn ]] || python3 -c "import tarfile; \
tarfile.open('.fa4/fa4-site.tar.xz').extractall('/tmp/site', filter='data')"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD/python
export PYTHONWARNINGS=ignore LD_LIBRARY_PATH=$lib_dir FLASHJIT_CACHE_DIR=/tmp/fjc
lib=$lib_dir/libflashjit.so.0
harness="python3 tools/compare_sdpa.py --lib $lib --cache-dir /tmp/fjc --out {dir} --grid"
steps=()
for grid in "${grids[@]}"; do
  case $grid in
    decode) steps+=(--step "decode:120:$harness decode") ;;
    backward) steps+=(--step "backward:150:$harness backward") ;;
    # Where the two backward cells that trailed FA4 longest spend their time, kernel by kernel.
    bwdk) steps+=(--step "bwdk:60:python3 tools/bwd_kernel_times.py --lib $lib \
--case bwd:32,16,16,512,512,128,1 --case bwd:8,32,32,2048,2048,64,1") ;;
    standard) steps+=(--step "standard:90:$harness standard") ;;
    features) steps+=(--step "features:120:$harness features") ;;
    *) echo "device_grids: unknown grid $grid (decode backward bwdk standard features)"; exit 2 ;;
  esac
done
python3 tools/device_steps.py --budget "${BUDGET:-575}" --out "${OUT:?set OUT}" \
  --show 'SUMMARY|geomean|x best' "${steps[@]}"
