#!/usr/bin/env bash
# `pip install ./python` of this build into a fresh venv, with FLASHJIT_PREBUILT_DIR so the wheel
# takes the library and CLI already built (no second compile); then, from outside the checkout
# and with no FLASHJIT_* variable, the installed package must find its bundled copies.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
venv=$build/python-venv
skips=$build/tests/python_pip_install.skipped
rm -rf "$venv" "$skips"
python3 -m venv "$venv"
# pip's build isolation fetches scikit-build-core from PyPI: without PyPI there is nothing to test.
if ! "$venv/bin/pip" download -q --no-deps -d "$build/python-wheels" "scikit-build-core>=0.10" \
    >/dev/null 2>&1; then
  echo "SKIPPED (pip install): PyPI is not reachable (scikit-build-core), so pip install ./python" \
    "was not tried" | tee "$skips"
  exit 77
fi
start=$(date +%s)
"$venv/bin/pip" install -q --find-links "$build/python-wheels" \
  -C cmake.define.FLASHJIT_PREBUILT_DIR="$build" -C build-dir="$build/python-wheel-build" \
  "$root/python"
echo "pip install ./python: $(($(date +%s) - start)) s"
cd "$venv"
env -u FLASHJIT_LIBRARY -u FLASHJIT_LIB -u FLASHJIT_CLI -u PYTHONPATH \
  FLASHJIT_CACHE_DIR="$build/python-venv/cache" "$venv/bin/python" - <<'PY'
import os, subprocess, sys
import flashjit
from flashjit import _loader, cache
site = os.path.dirname(flashjit.__file__)
assert site.startswith(sys.prefix), f"imported {site}, not the installed copy"
lib = flashjit.library()
assert lib.path == str(_loader.BUNDLED_LIBRARY), lib.path
assert cache.cli_path() == str(_loader.BUNDLED_CLI), cache.cli_path()
assert cache.list() == []
print("installed:", lib.path, lib.version(), "families", " ".join(lib.families()))
out = subprocess.run([sys.executable, "-m", "flashjit"], capture_output=True, text=True)
assert out.returncode == 0 and "families" in out.stdout, out.stdout + out.stderr
print(out.stdout)
PY
