"""Finding libflashjit, and the shared libraries it needs that the system loader does not find.

libflashjit links NVRTC (NEEDED libnvrtc.so.<major>) and fmt, spdlog and xxhash. When the system
has one of them, the loader finds it as usual. When it has none, a copy is looked for where a
Python user keeps it: beside libflashjit itself (the wheel's lib/ folder, or a folder packed for
another machine), and for NVRTC in the `nvidia-cuda-nvrtc` wheel (nvidia/cu13/lib,
nvidia/cuda_nvrtc/lib for CUDA 12). The copy is loaded first with RTLD_GLOBAL: the dynamic
loader then satisfies libflashjit's NEEDED entry with the library already loaded under that
soname (what torch does with the nvidia wheels), so no environment variable has to be set before
Python starts.
"""

import ctypes
import importlib.util
import os
import re
from pathlib import Path

SONAME = "libflashjit.so.0"
PACKAGE_DIR = Path(__file__).resolve().parent
# What the wheel holds (python/CMakeLists.txt installs them there).
BUNDLED_LIBRARY = PACKAGE_DIR / "lib" / SONAME
BUNDLED_CLI = PACKAGE_DIR / "bin" / "flashjit"
# python/flashjit/ inside a source checkout: the checkout's own build, when there is one.
CHECKOUT = PACKAGE_DIR.parent.parent

# glibc's dlerror() for a NEEDED entry it cannot find.
_MISSING = re.compile(r"(lib[\w+-]+(?:\.[\w+-]+)*\.so(?:\.\d+)*): cannot open shared object file")


class FlashjitLoadError(RuntimeError):
    """libflashjit (or a library it needs) could not be found or loaded."""


def library_candidates(explicit=None):
    """(where, path) pairs in the order find_library tries them."""
    if explicit:
        return [("explicit path", Path(explicit))]
    for variable in ("FLASHJIT_LIBRARY", "FLASHJIT_LIB"):  # FLASHJIT_LIB: the harness's old name
        if os.environ.get(variable):
            return [(f"${variable}", Path(os.environ[variable]))]
    return [("bundled in the package", BUNDLED_LIBRARY),
            ("this checkout's build", CHECKOUT / "build" / "libflashjit.so"),
            ("./build", Path.cwd() / "build" / "libflashjit.so")]


def find_library(explicit=None):
    """Path of libflashjit: explicit, else $FLASHJIT_LIBRARY, else the copy bundled in the
    package, else this checkout's build/libflashjit.so, else the bare soname for the system
    loader (LD_LIBRARY_PATH, ld.so.cache). An explicit path or variable that names no file
    raises FlashjitLoadError."""
    candidates = library_candidates(explicit)
    for _, path in candidates:
        if path.is_file():
            return str(path)
    if explicit or len(candidates) == 1:
        where, path = candidates[0]
        raise FlashjitLoadError(f"libflashjit not found: {path} ({where}) is not a file")
    return SONAME


def wheel_library_dirs(search_path=None):
    """Folders of the nvidia-* wheels' shared libraries (nvidia/<name>/lib) on sys.path."""
    if search_path is None:
        spec = importlib.util.find_spec("nvidia")
        search_path = list(spec.submodule_search_locations or []) if spec else []
    else:
        search_path = [Path(p) / "nvidia" for p in search_path]
    dirs = []
    for root in search_path:
        dirs.extend(sorted(p for p in Path(root).glob("*/lib") if p.is_dir()))
    return dirs


def locate_dependency(soname, library_dir, search_path=None):
    """A file for `soname` beside libflashjit, or for NVRTC in an nvidia wheel; None if none."""
    places = [Path(library_dir)]
    if soname.startswith("libnvrtc"):
        places += wheel_library_dirs(search_path)
    for place in places:
        candidate = place / soname
        if candidate.is_file():
            return candidate
    return None


def load_library(path, cdll=ctypes.CDLL, search_path=None):
    """(ctypes library, [dependencies preloaded]) for libflashjit at `path`. A NEEDED library
    the system loader misses is looked for (locate_dependency), preloaded, and the load
    retried; anything still missing raises FlashjitLoadError with the loader's message."""
    preloaded = []
    library_dir = Path(path).parent if os.sep in str(path) else Path.cwd()
    while True:
        try:
            return cdll(str(path)), preloaded
        except OSError as e:
            missing = _MISSING.search(str(e))
            found = missing and Path(missing.group(1)).name != Path(path).name and \
                locate_dependency(missing.group(1), library_dir, search_path)
            if not found or found in preloaded:
                hint = ("set FLASHJIT_LIBRARY to libflashjit.so, or pip install ./python"
                        if str(path) == SONAME else
                        "put the missing library beside libflashjit (../shared/device/pack does), "
                        "pip install nvidia-cuda-nvrtc for NVRTC, or set LD_LIBRARY_PATH")
                raise FlashjitLoadError(f"cannot load {path}: {e}; {hint}") from e
            cdll(str(found), mode=ctypes.RTLD_GLOBAL)
            preloaded.append(found)


def loaded_path(soname_prefix):
    """The file this process mapped for a library whose name starts with soname_prefix."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) >= 6 and os.path.basename(parts[5]).startswith(soname_prefix):
            return parts[5]
    return None
