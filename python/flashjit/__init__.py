"""flashjit: fused attention kernels JIT-compiled with NVRTC, over the library's C API.

No compiled extension: the C API is called through ctypes with data pointers and strides, so one
install works with every torch >= 2.4 (and without torch for what needs none).

Without torch: `library()` (the ctypes binding of flashjit.h), `info()`, `flashjit.cache`
(list, precompile, clear), `UserFunctions` (score_mod / mask_mod in CUDA C) and the exception
classes. With torch >= 2.4: `attention`, `attention_varlen`, `attention_with_kvcache` and
`merge_attention_states` on CUDA tensors, registered as torch.library custom ops (torch.compile,
CUDA graphs), `attention` differentiable in q, k and v (autograd through `attention_backward`),
`attention_varlen` too over a dense packed k/v (through `attention_varlen_backward`), and
`create_block_mask` (`_varlen`, `_with_kvcache`) with its `BlockMask`; they load on first use.
"""

import threading

from . import cache  # noqa: F401  (stdlib only)
from ._capi import (CacheError, CompileError, CudaError, FlashjitError, FlashjitLoadError,
                    InternalError, InvalidArgumentError, NoDeviceError, NoDriverError,
                    UnsupportedError)
from .info import info  # noqa: F401
from .user_functions import UserFunctions  # noqa: F401  (stdlib only)

__version__ = "0.1.0"

__all__ = ["library", "info", "cache", "attention", "attention_backward", "attention_varlen",
           "attention_varlen_backward", "attention_with_kvcache", "merge_attention_states",
           "UserFunctions", "create_block_mask", "create_block_mask_varlen",
           "create_block_mask_with_kvcache", "BlockMask",
           "FlashjitError", "InvalidArgumentError", "NoDriverError",
           "NoDeviceError", "CompileError", "CudaError", "CacheError", "UnsupportedError",
           "InternalError", "FlashjitLoadError", "TorchUnavailableError"]

_lock = threading.Lock()
_library = None


def library():
    """The loaded libflashjit (a flashjit._capi.Flashjit), loaded on first call: from
    $FLASHJIT_LIBRARY, else the copy bundled in the package, else this checkout's build, else
    the system loader. Raises FlashjitLoadError saying what was tried."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                from ._capi import Flashjit, find_library
                _library = Flashjit(find_library())
    return _library


class TorchUnavailableError(ImportError):
    """A torch entry point was used where torch (>= 2.4) cannot be imported."""


_TORCH_ENTRY_POINTS = ("attention", "attention_backward", "attention_varlen",
                       "attention_varlen_backward", "attention_with_kvcache",
                       "merge_attention_states", "create_block_mask", "create_block_mask_varlen",
                       "create_block_mask_with_kvcache", "BlockMask")


def __getattr__(name):
    # The torch entry points import torch only when first asked for, so `import flashjit`
    # needs no torch and stays fast.
    if name in _TORCH_ENTRY_POINTS:
        from . import _torch_ops
        value = getattr(_torch_ops.load(TorchUnavailableError), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flashjit' has no attribute {name!r}")
