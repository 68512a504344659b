"""`python -m flashjit`: what `flashjit info` shows, plus what the Python side found.

Versions, the NVRTC in use and the kernel families come from the C API. The C API cannot list
GPUs or describe the cache, so those lines come from the CLI's `info --json` when the CLI binary
is found (flashjit.cache.cli_path), and say so when it is not. No GPU or torch is needed.
"""

import importlib.util
import json

from ._capi import loaded_nvrtc
from ._loader import FlashjitLoadError


def info(cache_dir=None):
    """A dict: library (path, version, nvrtc, driver, families, backward_families, preloaded),
    cli (the CLI's `info --json`, or why it is missing), torch (version and CUDA, or why not)."""
    from . import __version__, cache, library
    result = {"package_version": __version__}
    try:
        lib = library()
    except FlashjitLoadError as e:
        result["library"] = {"error": str(e)}
    else:
        nvrtc = loaded_nvrtc(lib.path) or {}
        result["library"] = {"path": lib.path, "version": lib.version(),
                             "nvrtc_version": lib.nvrtc_version(),
                             "nvrtc_path": nvrtc.get("path"),
                             "driver_version": lib.driver_version(),
                             "families": list(lib.families()),
                             "backward_families": list(lib.backward_families()),
                             "preloaded": [str(p) for p in lib.preloaded]}
    try:
        result["cli"] = {"path": cache.cli_path(),
                         "info": json.loads(cache.run_cli(["info", "--json"], cache_dir).stdout)}
    except FlashjitLoadError as e:
        result["cli"] = {"error": str(e)}
    result["torch"] = _torch_status()
    return result


def _torch_status():
    if importlib.util.find_spec("torch") is None:
        return {"error": "not installed: the torch entry points (flashjit.attention, ...) "
                         "need torch >= 2.4"}
    try:
        import torch
    except Exception as e:  # a broken install says why here rather than at first use
        return {"error": f"import failed: {e}"}
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}


def format_info(result):
    """The dict of info() as `flashjit info`-style lines."""
    rows = [("flashjit (Python)", result["package_version"])]
    lib = result["library"]
    if "error" in lib:
        rows.append(("library", f"not loaded: {lib['error']}"))
    else:
        rows += [("library", f"{lib['path']} ({lib['version']})"),
                 ("NVRTC", f"{lib['nvrtc_version']} ({lib['nvrtc_path'] or 'path unknown'})"),
                 ("CUDA driver", lib["driver_version"] or "none"),
                 ("families", " ".join(lib["families"])),
                 ("backward", " ".join(lib["backward_families"]) or "no backward kernels")]
        if lib["preloaded"]:
            rows.append(("preloaded", " ".join(lib["preloaded"])))
    cli = result["cli"]
    if "error" in cli:
        rows.append(("GPU, cache", f"unknown: {cli['error']}"))
    else:
        details = cli["info"]
        rows.append(("NVRTC archs", " ".join(details.get("nvrtc_archs", []))))
        for gpu in details.get("gpus", []):
            rows.append((f"GPU {gpu['ordinal']}",
                         f"{gpu['name']}, compute capability {gpu['compute_capability']} "
                         f"(compiles for {gpu['arch']}), {gpu['multiprocessors']} SMs"))
        if not details.get("gpus"):
            rows.append(("GPU", f"no GPU: {details.get('gpu_error')}"))
        store = details.get("cache", {})
        rows.append(("cache", f"{store.get('dir')}: {store.get('entries')} entries "
                              f"({store.get('bytes')} bytes)"))
        rows.append(("CLI", cli["path"]))
    torch = result["torch"]
    rows.append(("torch", torch.get("error") or
                 f"{torch['version']} (CUDA {torch['cuda']}, "
                 f"{'a GPU' if torch['cuda_available'] else 'no GPU'} visible)"))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{value}" for label, value in rows)
