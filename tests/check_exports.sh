#!/usr/bin/env bash
# check_exports.sh LIB: fails when the shared library exports anything but its public API:
# flashjit:: symbols outside detail, and the C API's flashjit_* functions.
set -euo pipefail
lib=$1
symbols=$(nm -D --defined-only --demangle "$lib" | awk '{ $1 = ""; $2 = ""; sub(/^  /, ""); print }')
internal=$(grep -E 'flashjit::detail::|flashjit::cli::|flashjit::test::' <<<"$symbols" || true)
foreign=$(grep -vE '^(flashjit::|flashjit_|typeinfo (name )?for flashjit::|vtable for flashjit::|_init$|_fini$)' \
          <<<"$symbols" || true)
if [ -n "$internal$foreign" ]; then
  echo "exported symbols that are not flashjit's public API:"
  printf '%s\n' "$internal" "$foreign" | sed '/^$/d' | head -50
  exit 1
fi
echo "$(wc -l <<<"$symbols") exported symbols, all public API"
