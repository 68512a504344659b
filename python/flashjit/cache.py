"""The kernel cache, as the `flashjit` CLI sees it: list, precompile, clear.

`precompile(variants)` calls the C API (flashjit_precompile). The C API has no call to list or
clear the cache, or to name an arch's default variants, so `list`, `clear` and
`precompile(arch=...)` run the CLI binary, which shares the library's code for them: the copy
bundled in the package, else $FLASHJIT_CLI, else the one built beside the loaded library
(build/tools/flashjit), else `flashjit` on PATH. No GPU is needed for any of them.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

from ._loader import BUNDLED_CLI, FlashjitLoadError


class CliNotFoundError(FlashjitLoadError):
    """The flashjit CLI binary (needed for list, clear and precompile by arch) is not here."""


def cli_path():
    """Path of the flashjit CLI binary, or raises CliNotFoundError listing where it looked."""
    tried = []
    if os.environ.get("FLASHJIT_CLI"):
        path = Path(os.environ["FLASHJIT_CLI"])
        if path.is_file():
            return str(path)
        raise CliNotFoundError(f"$FLASHJIT_CLI={path} is not a file")
    candidates = [BUNDLED_CLI]
    library_dir = _library_dir()
    if library_dir:
        candidates.append(library_dir / "tools" / "flashjit")  # a build tree's layout
    for path in candidates:
        tried.append(str(path))
        if path.is_file():
            return str(path)
    on_path = shutil.which("flashjit")
    if on_path:
        return on_path
    raise CliNotFoundError(
        f"the flashjit CLI binary was not found (tried {', '.join(tried)} and PATH); "
        "flashjit.cache.list/clear and precompile(arch=...) run it: set FLASHJIT_CLI to "
        "build/tools/flashjit, or pass variant names to precompile (the C API needs no CLI)")


def run_cli(args, cache_dir=None, check=True):
    """Runs `flashjit [--cache-dir DIR] ARGS...` and returns the CompletedProcess (text output
    captured). The CLI finds the library this process loaded, and the libraries preloaded for
    it (NVRTC from its wheel, say), through LD_LIBRARY_PATH. check: a nonzero exit raises
    CacheError with the CLI's stderr."""
    command = [cli_path()] + (["--cache-dir", str(cache_dir)] if cache_dir else []) + \
        [str(a) for a in args]
    result = subprocess.run(command, capture_output=True, text=True, env=_cli_environment())
    if check and result.returncode != 0:
        from ._capi import CACHE_ERROR, CacheError
        raise CacheError(" ".join(command), CACHE_ERROR,
                         (result.stderr or result.stdout).strip() or
                         f"exit status {result.returncode}")
    return result


def list(arch=None, cache_dir=None):  # noqa: A001 (mirrors `flashjit list`)
    """The cached kernels (`flashjit list --json`): one dict per entry with name, family, arch,
    dtype, head_dim, causal, tiles, registers, spill_bytes, shared_mem_bytes, cubin_bytes,
    compile_ms, created, last_used, state ('current', 'stale', 'unknown'), layer and path."""
    return json.loads(run_cli(["list", "--json"] + (["--arch", arch] if arch else []),
                              cache_dir).stdout)


def precompile(variants=None, *, arch=None, cache_dir=None, options=()):
    """Compiles kernels into the cache, no GPU needed. variants: canonical names (e.g.
    'wgmma.sm90a.bf16.d128.m128n128s2.causal'), through the C API; or arch ('sm_90a', 'h100',
    ...): the library's default set for it, through `flashjit precompile --arch ARCH OPTIONS`
    (options: more CLI flags, e.g. ['--head-dim', '128', '--dtype', 'bf16']); returns the
    CLI's summary then."""
    if (variants is None) == (arch is None):
        raise ValueError("precompile: pass variant names or arch=, not both or neither")
    if variants is not None:
        if isinstance(variants, str):
            variants = [variants]
        from . import library
        library().precompile(variants, cache_dir=cache_dir)
        return None
    return run_cli(["precompile", "--arch", arch] + [str(o) for o in options],
                   cache_dir).stdout.strip()


def clear(arch=None, cache_dir=None):
    """Removes cached kernels, all or one arch's (`flashjit clear`); returns the CLI's line
    ('removed N entries ... from DIR')."""
    return run_cli(["clear"] + (["--arch", arch] if arch else []), cache_dir).stdout.strip()


def _library_dir():
    """The folder of the libflashjit this process uses, if it loads."""
    try:
        from . import library
        return Path(library().path).resolve().parent
    except FlashjitLoadError:
        return None


def _cli_environment():
    env = dict(os.environ)
    dirs = [str(_library_dir() or "")]
    try:
        from . import library
        dirs += [str(Path(p).parent) for p in library().preloaded]
    except FlashjitLoadError:
        pass
    dirs = [d for d in dirs if d] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
    if dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
    return env
