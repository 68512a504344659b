#!/usr/bin/env bash
# check_layers.sh SRC: fails when a file in one layer of src/ includes a header of a layer above
# it. Layers, lowest first: core; jit and cuda (siblings, neither includes the other);
# families; api.
set -euo pipefail
src=$1
allowed() {  # the layers a layer may include
  case $1 in
    core) echo "core" ;;
    jit) echo "core jit" ;;
    cuda) echo "core cuda" ;;
    families) echo "core jit cuda families" ;;
    api) echo "core jit cuda families api" ;;
  esac
}
status=0
for layer in core jit cuda families api; do
  [ -d "$src/$layer" ] || { echo "missing layer src/$layer"; status=1; continue; }
  while IFS=: read -r file _ included; do
    target=$(sed -E 's@.*#include "([a-z_]+)/.*@\1@' <<<"$included")
    case $target in core|jit|cuda|families|api) ;; *) continue ;; esac  # public or kernel headers
    if ! grep -qw "$target" <<<"$(allowed "$layer")"; then
      echo "${file#$src/} ($layer) includes $target: ${included}"
      status=1
    fi
  done < <(grep -rn '#include "' "$src/$layer" || true)
done
stray=$(find "$src" -maxdepth 1 -type f | head -5)
if [ -n "$stray" ]; then echo "files outside the layers: $stray"; status=1; fi
[ $status -eq 0 ] && echo "src/ layers point down"
exit $status
