"""What a run ran on, for results.json: library versions, NVRTC, driver, torch, cuDNN, GPU,
FlashAttention-4."""

import importlib.metadata
import os
import sys
import time
from pathlib import Path

import flashjit_ctypes as fj

from . import gpu


def environment(lib, ordinal):
    """The environment record; ordinal: the CUDA device the run uses."""
    import torch
    env = {"flashjit": lib.version(), "flashjit_library": os.path.realpath(lib.path)}
    nvrtc = fj.loaded_nvrtc(lib.path)
    env["nvrtc"] = lib.nvrtc_version() or "unknown"
    env["nvrtc_library"] = nvrtc["path"] if nvrtc else "unknown"
    env["cuda_driver"] = lib.driver_version() or "unknown"
    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["cudnn"] = f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else "unavailable"
    if gpu.DEVICE == "cuda":
        props = torch.cuda.get_device_properties(ordinal)
        env["gpu"] = props.name
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["sm_count"] = props.multi_processor_count
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        import numpy
        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import matplotlib
        env["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    for dist, key in (("flash-attn-4", "flash_attn_4"), ("nvidia-cutlass-dsl", "cutlass_dsl")):
        try:  # FlashAttention-4, the KV cases' peer, when its bundle is on PYTHONPATH
            env[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[key] = None
    env["python"] = sys.version.split()[0]
    env["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env["command"] = " ".join([Path(sys.argv[0]).name] + sys.argv[1:])
    return env
