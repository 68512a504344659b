"""The harness's name for the flashjit package's ctypes binding (python/flashjit/_capi.py), kept
so tools/ and tools/compare/ import it as before: this module *is* that one, not a copy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from flashjit import _capi  # noqa: E402

sys.modules[__name__] = _capi
