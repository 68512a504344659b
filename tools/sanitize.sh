#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and synccheck over every default variant of every family
# on this GPU (flashjit_every_variant: small ragged GQA problems, causal rows with no key, each
# tensor in an allocation of its exact size; the backward families through Engine::backward), in
# one go: one summary line per tool. Exits 1 when a tool reports an error, does not finish, or
# cannot run on this machine.
#
#   tools/sanitize.sh [DIR [PREFIX]]  DIR holds flashjit_every_variant (default: build/tools);
#                                     PREFIX (the tool's first argument): only the families
#                                     whose names start with it, e.g. bwd_ or decode
#   SANITIZE_LOG_DIR=...              where the full reports go (default: a temp dir, printed)
#   SANITIZE_TIMEOUT=...              seconds allowed per tool (default 200)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/tools}/flashjit_every_variant
args=()
[[ $# -ge 2 ]] && args=("$2")
logs=${SANITIZE_LOG_DIR:-$(mktemp -d)}
limit=${SANITIZE_TIMEOUT:-200}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mkdir -p "$logs"
[[ -x "$bin" ]] || { echo "sanitize: no $bin (build the flashjit_every_variant target)"; exit 1; }
[[ -x "$sanitizer" ]] || { echo "sanitize: compute-sanitizer not found"; exit 1; }

# One cache for all runs: the first, unsanitized run compiles every variant; the tool runs load
# them, so their time goes to the launches.
export FLASHJIT_CACHE_DIR=${FLASHJIT_CACHE_DIR:-$(mktemp -d)}
start=$(date +%s)
if ! "$bin" "${args[@]}" > "$logs/plain.log" 2>&1; then
  echo "sanitize: the workload fails without a sanitizer:"; tail -20 "$logs/plain.log"; exit 1
fi
printf '%-10s %4ds  %s\n' plain $(( $(date +%s) - start )) "$(tail -1 "$logs/plain.log")"

failed=0
for tool in memcheck racecheck synccheck; do
  extra=()
  [[ $tool == memcheck ]] && extra=(--leak-check full)
  start=$(date +%s)
  timeout "$limit" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 50 \
    "$bin" "${args[@]}" > "$logs/$tool.log" 2>&1
  rc=$?
  # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"; errors fail, warnings show.
  summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$logs/$tool.log" | tail -1 | sed 's/^=* *//')
  verdict=clean
  if [[ $rc -eq 124 ]]; then verdict="TIMED OUT after ${limit}s"
  elif [[ $rc -ne 0 || -z "$summary" ]]; then verdict="FAILED (exit $rc)"
  elif [[ $tool == racecheck && ! "$summary" =~ \(0\ errors ]]; then verdict=FAILED
  elif [[ $tool != racecheck && ! "$summary" =~ ERROR\ SUMMARY:\ 0\ errors ]]; then verdict=FAILED
  fi
  [[ $verdict == clean ]] || failed=1
  printf '%-10s %4ds  %-8s %s | %s\n' "$tool" $(( $(date +%s) - start )) "$verdict" \
    "${summary:-no summary}" "$(grep -E 'launches of' "$logs/$tool.log" | tail -1)"
  [[ $verdict == clean ]] || grep -m 20 -E '=========' "$logs/$tool.log" | head -20
done
echo "sanitize: full reports in $logs"
exit $failed
