"""ctypes binding of flashjit's C API (include/flashjit/flashjit.h).

Stdlib only, so it loads (and reports what is wrong) on a machine without torch or a GPU.
Tensors are passed as raw device pointers plus element strides; `tensor_from_torch` builds
one from a torch tensor viewed as [batch, seqlen, heads, head_dim].

    lib = Flashjit(find_library())
    lib.families()  # ('wgmma', 'mma', 'simt'): the kernel families built in, fastest first
    with lib.create_engine(device=0) as engine:
        engine.forward(q, k, v, out, causal=True, lse=lse_ptr, stream=stream_handle)
        # dense or paged KV cache, torch tensors (flashjit_forward_kv; needs a build that has it)
        engine.forward_kv(q, k_pages, v_pages, out, page_table=table, seqused_k=lens)
        # a packed variable-length batch (flashjit_forward_varlen)
        engine.forward_varlen(q, k, v, out, cu_seqlens, max_len, cu_seqlens, max_len)
        # gradients of a forward that wrote lse (flashjit_backward; torch tensors or views)
        engine.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=True)
        # ... of a varlen forward (flashjit_backward_varlen; prebuilt structs, make_varlen)
        engine.backward_varlen_raw(q, k, v, out, dout, lse_ptr, dq, dk, dv, varlen, options)
        # user functions (score_mod / mask_mod CUDA C) and a block mask of the same arguments
        doc = lib.user_functions(mask_mod=MASK_MOD_SOURCE)
        views = [tensor_from_torch(t) for t in (q, k, v, out)]
        options = engine.options(True, user_functions=doc, user_args=[doc_ids])
        mask = engine.create_block_mask_raw(*views, options)  # keep it while options use it
        options.block_mask = mask.pointer
        engine.forward_raw(*views, options)
"""

import ctypes
import os
import struct
from pathlib import Path

from ._loader import FlashjitLoadError, find_library, load_library, loaded_path  # noqa: F401

# flashjit_status, in the order of the C enum.
STATUS_NAMES = {
    0: "FLASHJIT_OK",
    1: "FLASHJIT_INVALID_ARGUMENT",
    2: "FLASHJIT_NO_DRIVER",
    3: "FLASHJIT_NO_DEVICE",
    4: "FLASHJIT_COMPILE_FAILED",
    5: "FLASHJIT_CUDA_ERROR",
    6: "FLASHJIT_CACHE_ERROR",
    7: "FLASHJIT_UNSUPPORTED",
    8: "FLASHJIT_INTERNAL_ERROR",
}
OK = 0
INVALID_ARGUMENT = 1
NO_DRIVER = 2
NO_DEVICE = 3
COMPILE_FAILED = 4
CUDA_ERROR = 5
CACHE_ERROR = 6
UNSUPPORTED = 7
INTERNAL_ERROR = 8

BF16 = 0
FP16 = 1
DTYPES = {"bf16": BF16, "fp16": FP16}
MAX_USER_ARGS = 8  # FLASHJIT_MAX_USER_ARGS: the pointers user functions see as args.ptr[i]


class FlashjitTensor(ctypes.Structure):
    """flashjit_tensor: a [batch, seqlen, heads, head_dim] view, strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]

    def __repr__(self):
        return (f"FlashjitTensor(data=0x{self.data or 0:x}, dtype={self.dtype}, "
                f"shape={list(self.shape)}, stride={list(self.stride)})")


TENSOR_BYTES = ctypes.sizeof(FlashjitTensor)


class FlashjitForwardOptions(ctypes.Structure):
    """flashjit_forward_options, field for field as the header declares it."""

    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("lse", ctypes.POINTER(ctypes.c_float)),
        ("family", ctypes.c_char_p),
        ("tile_m", ctypes.c_int32),
        ("tile_n", ctypes.c_int32),
        ("stages", ctypes.c_int32),
        # Trailing fields, absent from builds before split-KV: an older library reads only the
        # prefix it knows, so the same struct serves both.
        ("num_splits", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        ("softcap", ctypes.c_float),  # absent before soft-capping: older builds ignore it
        # Absent before sliding windows: older builds ignore them (and run no window).
        ("sliding_window", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        # Absent before attention sinks: older builds ignore it (and run no sink).
        ("sink_logits", ctypes.c_void_p),
        # Absent before ALiBi: older builds ignore it (and add no bias).
        ("alibi_slopes", ctypes.c_void_p),
        # Absent before sink tokens: older builds ignore it (ctypes pads the struct as C does).
        ("sink_tokens", ctypes.c_int32),
        # Absent before user functions: older builds ignore them, but they also lack the
        # functions that make the handles, so none can be set there.
        ("user_functions", ctypes.c_void_p),
        ("user_args", ctypes.c_void_p * MAX_USER_ARGS),
        ("block_mask", ctypes.c_void_p),
    ]


class FlashjitBackwardOptions(ctypes.Structure):
    """flashjit_backward_options, field for field as the header declares it (no padding: the
    int32 fields come first). Zeroed, it is the default."""

    _fields_ = [
        ("softmax_scale", ctypes.c_float),  # the forward's; <= 0: 1/sqrt(head_dim)
        ("causal", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),  # nonzero: bitwise repeatable gradients
        ("tile_m", ctypes.c_int32),  # all three 0: the family's tile table
        ("tile_n", ctypes.c_int32),
        ("stages", ctypes.c_int32),
        ("family", ctypes.c_char_p),  # None: the dispatcher's dK/dV family
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        # The forward's score variants (as FlashjitForwardOptions'), the sinks' gradient.
        ("alibi_slopes", ctypes.c_void_p),
        ("sink_logits", ctypes.c_void_p),
        ("d_sink_logits", ctypes.c_void_p),
        # The forward's user functions and their arguments (a score_mod needs its
        # score_mod_grad).
        ("user_functions", ctypes.c_void_p),
        ("user_args", ctypes.c_void_p * MAX_USER_ARGS),
        ("softcap", ctypes.c_float),
        ("sliding_window", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("sink_tokens", ctypes.c_int32),
        ("block_mask", ctypes.c_void_p),  # appended in session 18 (create_backward_block_mask)
    ]


class FlashjitKvCache(ctypes.Structure):
    """flashjit_kv_cache: dense k/v [batch, seqlen_k, heads_kv, head_dim], or with page_table set
    pages [num_pages, page_size, heads_kv, head_dim] (NHD; HND through bhsd strides) read through
    page_table [batch, page_table_stride] int32 on the device; seqused_k NULL or [batch] int32."""

    _fields_ = [
        ("k", FlashjitTensor),
        ("v", FlashjitTensor),
        ("page_table", ctypes.POINTER(ctypes.c_int32)),
        ("pages_per_seq", ctypes.c_int64),
        ("page_table_stride", ctypes.c_int64),  # 0: pages_per_seq
        ("seqused_k", ctypes.POINTER(ctypes.c_int32)),
    ]


class FlashjitVarlen(ctypes.Structure):
    """flashjit_varlen: q/out packed [1, total_q, ...], cu_seqlens_* int32 [batch + 1] on the
    device (cu_seqlens_k NULL for a paged cache), max_seqlen_* bounding every length."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
        ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
        ("batch", ctypes.c_int32),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
    ]


class FlashjitError(RuntimeError):
    """A call returned a status other than FLASHJIT_OK; `message` is flashjit_last_error().
    raise_status() raises the subclass of the status (InvalidArgumentError, ...)."""

    def __init__(self, function, status, message):
        self.function = function
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"status {status}")
        self.message = message
        super().__init__(f"{function}: {self.status_name}: {message}")

    @property
    def unsupported(self):
        return self.status == UNSUPPORTED


# One class per status, so callers catch what they can handle (bad input is also a ValueError).
class InvalidArgumentError(FlashjitError, ValueError):
    pass


class NoDriverError(FlashjitError):
    pass


class NoDeviceError(FlashjitError):
    pass


class CompileError(FlashjitError):
    pass


class CudaError(FlashjitError):
    pass


class CacheError(FlashjitError):
    pass


class UnsupportedError(FlashjitError):
    pass


class InternalError(FlashjitError):
    pass


ERROR_CLASSES = {INVALID_ARGUMENT: InvalidArgumentError, NO_DRIVER: NoDriverError,
                 NO_DEVICE: NoDeviceError, COMPILE_FAILED: CompileError, CUDA_ERROR: CudaError,
                 CACHE_ERROR: CacheError, UNSUPPORTED: UnsupportedError,
                 INTERNAL_ERROR: InternalError}


def raise_status(function, status, message):
    """Raises the FlashjitError subclass of `status` (an unknown status: FlashjitError)."""
    raise ERROR_CLASSES.get(status, FlashjitError)(function, status, message)


def make_tensor(data_ptr, dtype, shape, stride):
    """A FlashjitTensor from a pointer (int), a dtype ('bf16'/'fp16'), 4 sizes and 4 strides."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    if len(shape) != 4 or len(stride) != 4:
        raise ValueError(f"shape {tuple(shape)} / stride {tuple(stride)}: expected 4 entries each "
                         "([batch, seqlen, heads, head_dim])")
    # One constructor call: field-by-field assignment costs microseconds on the hot path.
    return FlashjitTensor(int(data_ptr), DTYPES[dtype], tuple(int(x) for x in shape),
                          tuple(int(x) for x in stride))


def tensor_from_torch(t):
    """A FlashjitTensor viewing a torch CUDA tensor of shape [batch, seqlen, heads, head_dim].

    The tensor must stay alive while flashjit uses the view: this keeps only its pointer."""
    names = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
    dtype = names.get(str(t.dtype))
    if dtype is None:
        raise ValueError(f"tensor dtype {t.dtype}: flashjit takes torch.bfloat16 or torch.float16")
    if t.dim() != 4:
        raise ValueError(f"tensor of shape {tuple(t.shape)}: expected 4 dims "
                         "[batch, seqlen, heads, head_dim]")
    return make_tensor(t.data_ptr(), dtype, tuple(t.shape), tuple(t.stride()))


def _int32_ptr(address):
    return ctypes.cast(int(address), ctypes.POINTER(ctypes.c_int32)) if address else None


def make_kv_cache(k, v, page_table=0, pages_per_seq=0, page_table_stride=0, seqused_k=0):
    """A FlashjitKvCache from two FlashjitTensors and device pointers (ints; 0: none)."""
    kv = FlashjitKvCache()
    kv.k, kv.v = k, v
    kv.page_table = _int32_ptr(page_table)
    kv.pages_per_seq = int(pages_per_seq)
    kv.page_table_stride = int(page_table_stride)
    kv.seqused_k = _int32_ptr(seqused_k)
    return kv


def make_varlen(cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k):
    """A FlashjitVarlen from device pointers (ints; cu_seqlens_k 0 for a paged cache)."""
    varlen = FlashjitVarlen()
    varlen.cu_seqlens_q = _int32_ptr(cu_seqlens_q)
    varlen.cu_seqlens_k = _int32_ptr(cu_seqlens_k)
    varlen.batch = int(batch)
    varlen.max_seqlen_q, varlen.max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    return varlen


def _view(t):
    return t if isinstance(t, FlashjitTensor) else tensor_from_torch(t)


def _address(x, what, dtype=None, dim=None):
    """A device pointer from None, an int or a torch tensor (checked for dtype and dims)."""
    if x is None or isinstance(x, int):
        return int(x or 0)
    if dtype is not None and str(x.dtype) != dtype:
        raise ValueError(f"{what}: dtype {x.dtype}, expected {dtype}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{what}: shape {tuple(x.shape)}, expected {dim} dims")
    if x.dim() and x.stride(-1) != 1:
        raise ValueError(f"{what}: stride {tuple(x.stride())}, expected a unit last stride")
    return x.data_ptr()


def kv_cache_from_torch(k, v, page_table=None, seqused_k=None):
    """A FlashjitKvCache over torch tensors (or FlashjitTensors): dense k/v [batch, seqlen_k,
    heads_kv, head_dim], or pages [num_pages, page_size, heads_kv, head_dim] with page_table an
    int32 [batch, pages_per_seq] tensor (row stride taken from it); seqused_k int32 [batch].
    The tensors must stay alive while flashjit uses the struct: it keeps only pointers."""
    pages_per_seq = stride = 0
    if page_table is not None and not isinstance(page_table, int):
        if page_table.dim() != 2:
            raise ValueError(f"page_table: shape {tuple(page_table.shape)}, expected "
                             "[batch, pages_per_seq]")
        pages_per_seq, stride = page_table.shape[1], page_table.stride(0)
    return make_kv_cache(_view(k), _view(v),
                         _address(page_table, "page_table", "torch.int32", 2), pages_per_seq,
                         stride, _address(seqused_k, "seqused_k", "torch.int32", 1))


def _encode(text):
    return None if text is None else str(text).encode()


def user_arg_pointers(user_args):
    """The MAX_USER_ARGS pointers of flashjit_forward_options.user_args from a sequence of at
    most that many entries, each None (null), an int (a device pointer) or a torch tensor (its
    data pointer; it must be contiguous, as the user functions index raw memory)."""
    user_args = list(user_args or ())
    if len(user_args) > MAX_USER_ARGS:
        raise ValueError(f"user_args has {len(user_args)} entries: expected at most "
                         f"{MAX_USER_ARGS} (FLASHJIT_MAX_USER_ARGS)")
    pointers = []
    for i, arg in enumerate(user_args):
        if arg is None or isinstance(arg, int):
            pointers.append(int(arg or 0))
        elif hasattr(arg, "data_ptr"):
            if not arg.is_contiguous():
                raise ValueError(f"user_args[{i}] has strides {tuple(arg.stride())}: expected a "
                                 "contiguous tensor (user functions index its memory directly)")
            pointers.append(arg.data_ptr())
        else:
            raise TypeError(f"user_args[{i}] has type {type(arg).__name__}: expected a torch "
                            "tensor on the device, an int (a device pointer) or None")
    return pointers + [0] * (MAX_USER_ARGS - len(pointers))


class _Handle:
    """A C API object that Python owns: `_destroy` (its C function) frees it on close() or when
    the object is dropped."""

    _destroy = None

    def __init__(self, owner, pointer):
        self.owner, self.pointer = owner, pointer

    def close(self):
        if self.pointer:
            self.owner.optional_function(self._destroy, [ctypes.c_void_p], None)(self.pointer)
            self.pointer = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class UserFunctions(_Handle):
    """A flashjit_user_functions handle (flashjit::UserFunctions): score_mod / mask_mod CUDA C
    sources compiled into the kernels of a forward that names it (Engine.options
    user_functions=). Made by Flashjit.user_functions or user_functions_from_files; `hash` is
    the 32 hex digits that variant names carry as ".user<hash>"."""

    _destroy = "flashjit_user_functions_destroy"

    def __init__(self, owner, pointer, differentiable=True):
        super().__init__(owner, pointer)
        # Whether a backward can run them: no score_mod, or one with its score_mod_grad.
        self.differentiable = differentiable
        hash_of = owner.optional_function("flashjit_user_functions_hash", [ctypes.c_void_p],
                                          ctypes.c_char_p)
        self.hash = hash_of(pointer).decode()

    def __repr__(self):
        return f"{type(self).__name__}(hash={self.hash!r})"


class BlockMask(_Handle):
    """A flashjit_block_mask handle (flashjit::BlockMask): the key tiles one forward's mask_mod
    lets through, made by Engine.create_block_mask*; Engine.options(block_mask=) passes it to
    the forward with the same arguments. Engine.create_backward_block_mask_raw makes a
    backward's (FlashjitBackwardOptions.block_mask). Close it (or drop it) before its engine."""

    _destroy = "flashjit_block_mask_destroy"

    def counts(self):
        """(partial, full, total): key tiles visited partly masked, not masked, and those the
        causal / window masks leave, summed over the map (waits for it to be built)."""
        values = [ctypes.c_int64() for _ in range(3)]
        function = self.owner.optional_function(
            "flashjit_block_mask_counts", [ctypes.c_void_p] + [ctypes.POINTER(ctypes.c_int64)] * 3)
        self.owner.check("flashjit_block_mask_counts",
                         function(self.pointer, *(ctypes.byref(v) for v in values)))
        return tuple(v.value for v in values)

    def variant(self):
        """The attention variant it was built for: what the forward given it runs."""
        buf = ctypes.create_string_buffer(256)
        function = self.owner.optional_function(
            "flashjit_block_mask_variant", [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32])
        self.owner.check("flashjit_block_mask_variant", function(self.pointer, buf, len(buf)))
        return buf.value.decode()


class Flashjit:
    """The loaded shared library, with prototypes declared for every C API function."""

    def __init__(self, path):
        self.lib, self.preloaded = load_library(path)
        # A bare soname: the file the system's search path found.
        self.path = str(path) if os.sep in str(path) else loaded_path(str(path)) or str(path)
        self._families = None
        self._optional = {}
        lib = self.lib
        P = ctypes.POINTER
        lib.flashjit_version.restype = ctypes.c_char_p
        lib.flashjit_version.argtypes = []
        lib.flashjit_last_error.restype = ctypes.c_char_p
        lib.flashjit_last_error.argtypes = []
        lib.flashjit_engine_create.restype = ctypes.c_int
        lib.flashjit_engine_create.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                               P(ctypes.c_void_p)]
        lib.flashjit_engine_destroy.restype = None
        lib.flashjit_engine_destroy.argtypes = [ctypes.c_void_p]
        tensor_args = [ctypes.c_void_p] + [P(FlashjitTensor)] * 4 + [P(FlashjitForwardOptions)]
        lib.flashjit_forward.restype = ctypes.c_int
        lib.flashjit_forward.argtypes = tensor_args + [ctypes.c_void_p]
        # The same function taking plain addresses (ints): for callers that pack the structs into
        # buffers of their own (the package's eager hot path). A CFUNCTYPE call with ints costs
        # a third of one that converts byref() arguments.
        self.forward_at = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 7)(
            ctypes.cast(lib.flashjit_forward, ctypes.c_void_p).value)
        lib.flashjit_select_variant.restype = ctypes.c_int
        lib.flashjit_select_variant.argtypes = tensor_args + [ctypes.c_char_p, ctypes.c_int32]
        lib.flashjit_precompile.restype = ctypes.c_int
        lib.flashjit_precompile.argtypes = [ctypes.c_char_p, P(ctypes.c_char_p), ctypes.c_int32]
        lib.flashjit_nvrtc_version.restype = ctypes.c_char_p
        lib.flashjit_nvrtc_version.argtypes = []
        lib.flashjit_driver_version.restype = ctypes.c_int
        lib.flashjit_driver_version.argtypes = [P(ctypes.c_int32)]

    def last_error(self):
        return (self.lib.flashjit_last_error() or b"").decode(errors="replace")

    def check(self, function, status):
        if status != OK:
            raise_status(function, status, self.last_error())

    def version(self):
        return self.lib.flashjit_version().decode()

    def nvrtc_version(self):
        """The NVRTC flashjit compiles with, as 'major.minor' (it may be torch's copy of
        libnvrtc when the sonames match: see loaded_nvrtc for its path)."""
        return self.lib.flashjit_nvrtc_version().decode()

    def driver_version(self):
        """The CUDA driver's version as 'major.minor', or None without a driver."""
        version = ctypes.c_int32()
        if self.lib.flashjit_driver_version(ctypes.byref(version)) != OK:
            return None
        return f"{version.value // 1000}.{version.value % 1000 // 10}"

    def families(self):
        """The attention families built into this library, fastest first, e.g. ('decode',
        'wgmma', 'mma', 'simt'): read once through flashjit_family_count and flashjit_family_name. Raises
        FlashjitLoadError for a build older than those functions (it still loads, so the
        dispatcher's own choice stays usable, e.g. as the base of an A/B run)."""
        if self._families is None:
            count = self.optional_function("flashjit_family_count", [], ctypes.c_int32)
            name = self.optional_function("flashjit_family_name", [ctypes.c_int32],
                                          ctypes.c_char_p)
            indices = range(count())
            if self.has_function("flashjit_family_is_attention"):  # newer builds list merge too
                is_attention = self.optional_function("flashjit_family_is_attention",
                                                      [ctypes.c_int32], ctypes.c_int32)
                indices = [i for i in indices if is_attention(i)]
            names = [name(i) for i in indices]
            if None in names:
                raise FlashjitLoadError(f"{self.path}: flashjit_family_name({names.index(None)}) "
                                        f"is NULL, below flashjit_family_count() = {count()}")
            self._families = tuple(n.decode() for n in names)
        return self._families

    def backward_families(self):
        """The families of the backward pass, e.g. ('bwd_mma', 'bwd_mma_dq', 'bwd_prep',
        'bwd_convert'): flashjit_family_is_backward's; () for a build that predates it.
        Engine.backward_options(family=) takes a dK/dV one of them."""
        if not self.has_function("flashjit_family_is_backward"):
            return ()
        count = self.optional_function("flashjit_family_count", [], ctypes.c_int32)
        name = self.optional_function("flashjit_family_name", [ctypes.c_int32], ctypes.c_char_p)
        is_backward = self.optional_function("flashjit_family_is_backward", [ctypes.c_int32],
                                             ctypes.c_int32)
        return tuple(name(i).decode() for i in range(count()) if is_backward(i))

    def backward_function(self, name):
        """One of the backward entry points, prototypes from flashjit.h (FlashjitLoadError on a
        build that predates them)."""
        P, T = ctypes.POINTER, ctypes.POINTER(FlashjitTensor)
        head = [ctypes.c_void_p, T, T, T]
        argtypes = {
            "flashjit_backward": head + [T, T, P(ctypes.c_float), T, T, T,
                                         P(FlashjitBackwardOptions), ctypes.c_void_p],
            "flashjit_backward_workspace_bytes": head + [P(FlashjitBackwardOptions),
                                                         P(ctypes.c_uint64)],
            "flashjit_select_backward_variant": head + [P(FlashjitBackwardOptions),
                                                        ctypes.c_char_p, ctypes.c_int32],
            "flashjit_backward_varlen": head + [T, T, P(ctypes.c_float), T, T, T,
                                                P(FlashjitVarlen), P(FlashjitBackwardOptions),
                                                ctypes.c_void_p],
            "flashjit_backward_workspace_bytes_varlen": head + [P(FlashjitVarlen),
                                                                P(FlashjitBackwardOptions),
                                                                P(ctypes.c_uint64)],
            "flashjit_select_backward_variant_varlen": head + [P(FlashjitVarlen),
                                                               P(FlashjitBackwardOptions),
                                                               ctypes.c_char_p, ctypes.c_int32],
        }[name]
        return self.optional_function(name, argtypes)

    def optional_function(self, name, argtypes, restype=ctypes.c_int):
        """A C API function that older builds lack (they still load, e.g. for A/B runs):
        raises FlashjitLoadError naming it when this build has none. Looked up once (the
        forward_kv timing loop calls through it)."""
        function = self._optional.get(name)
        if function is None:
            function = getattr(self.lib, name, None)
            if function is None:
                raise FlashjitLoadError(f"{self.path} predates {name}: rebuild libflashjit from "
                                        "this checkout")
            function.restype, function.argtypes = restype, argtypes
            self._optional[name] = function
        return function

    def has_function(self, name):
        """Whether this build exports `name` (e.g. flashjit_forward_kv)."""
        return getattr(self.lib, name, None) is not None

    def kv_function(self, name):
        """One of the KV-cache entry points, prototypes from flashjit.h."""
        P, T = ctypes.POINTER, ctypes.POINTER(FlashjitTensor)
        head = [ctypes.c_void_p, T, P(FlashjitKvCache), T, P(FlashjitForwardOptions)]
        argtypes = {
            "flashjit_forward_kv": head + [ctypes.c_void_p],
            "flashjit_forward_varlen": head[:4] + [P(FlashjitVarlen), P(FlashjitForwardOptions),
                                                   ctypes.c_void_p],
            "flashjit_workspace_bytes_varlen": head[:4] + [P(FlashjitVarlen),
                                                           P(FlashjitForwardOptions),
                                                           P(ctypes.c_uint64)],
            "flashjit_workspace_bytes": head + [P(ctypes.c_uint64), P(ctypes.c_int32)],
            "flashjit_select_variant_kv": head + [ctypes.c_char_p, ctypes.c_int32],
            "flashjit_merge_attention_states": [ctypes.c_void_p, T, P(ctypes.c_float), T,
                                                P(ctypes.c_float), T, P(ctypes.c_float),
                                                ctypes.c_void_p],
        }[name]
        return self.optional_function(name, argtypes)

    def check_family(self, family):
        """Raises ValueError unless `family` is one of families()."""
        if family not in self.families():
            raise ValueError(f"family {family!r}: {self.path} has {', '.join(self.families())} "
                             "(or None for the dispatcher's choice)")

    def user_functions_pointer(self, score_mod=None, mask_mod=None, score_mod_grad=None,
                               files=False):
        """A new flashjit_user_functions from sources (or, files=True, the files holding them),
        None or "" for an absent one: the pointer, for UserFunctions (which owns it)."""
        name = "flashjit_user_functions_from_files" if files else "flashjit_user_functions_create"
        function = self.optional_function(name, [ctypes.c_char_p] * 3 +
                                          [ctypes.POINTER(ctypes.c_void_p)])
        pointer = ctypes.c_void_p()
        self.check(name, function(_encode(score_mod), _encode(mask_mod), _encode(score_mod_grad),
                                  ctypes.byref(pointer)))
        return pointer.value

    def user_functions(self, score_mod=None, mask_mod=None, score_mod_grad=None):
        """UserFunctions from CUDA C source text (see flashjit.h); nothing is compiled yet."""
        return UserFunctions(self, self.user_functions_pointer(score_mod, mask_mod,
                                                               score_mod_grad),
                             differentiable=not score_mod or bool(score_mod_grad))

    def user_functions_from_files(self, score_mod_file=None, mask_mod_file=None,
                                  score_mod_grad_file=None):
        """UserFunctions from source files; a file that cannot be read: InvalidArgumentError."""
        files = [None if f is None else os.fspath(f)
                 for f in (score_mod_file, mask_mod_file, score_mod_grad_file)]
        return UserFunctions(self, self.user_functions_pointer(*files, files=True),
                             differentiable=not files[0] or bool(files[2]))

    def create_engine(self, device=0, cache_dir=None):
        handle = ctypes.c_void_p()
        self.check("flashjit_engine_create",
                   self.lib.flashjit_engine_create(int(device), _encode(cache_dir),
                                                   ctypes.byref(handle)))
        return Engine(self, handle)

    def precompile(self, variant_names, cache_dir=None):
        """Compiles the named variants into the disk cache (parallel, no GPU needed)."""
        names = [_encode(n) for n in variant_names]
        array = (ctypes.c_char_p * max(1, len(names)))(*names)
        self.check("flashjit_precompile",
                   self.lib.flashjit_precompile(_encode(cache_dir), array, len(names)))


class Engine:
    """One flashjit_engine (one GPU). Use as a context manager or call close()."""

    def __init__(self, owner, handle):
        self.owner = owner
        self.lib = owner.lib
        self.handle = handle
        self.address = handle.value if handle else None  # for Flashjit.forward_at

    def forward_at(self, tensors, options, stream):
        """flashjit_forward on structs at addresses: `tensors` holds q, k, v and out as four
        consecutive flashjit_tensor, `options` a flashjit_forward_options (ints, valid for the
        call)."""
        size = TENSOR_BYTES
        status = self.owner.forward_at(self.address, tensors, tensors + size, tensors + 2 * size,
                                       tensors + 3 * size, options, stream)
        if status != OK:
            raise_status("flashjit_forward", status, self.owner.last_error())

    def close(self):
        if self.handle:
            self.lib.flashjit_engine_destroy(self.handle)
            self.handle = self.address = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def options(self, causal=False, softmax_scale=0.0, lse=None, family=None, tiles=None,
                num_splits=0, workspace=None, workspace_bytes=0, softcap=0.0, window=(-1, -1),
                sink=None, alibi=None, sink_tokens=0, user_functions=None, user_args=(),
                block_mask=None):
        """A FlashjitForwardOptions. lse: a device pointer (int) or None; family: None/'' for
        the dispatcher's choice, else one of the library's families() (checked here); tiles:
        None for the family's table, else (tile_m, tile_n, stages); num_splits: 0 for the
        split-KV heuristic, else 1..128; workspace: a device pointer of workspace_bytes, or a
        torch tensor (its size is used), or None for the engine's own; softcap: > 0 caps scores
        at softcap * tanh(score / softcap); window: (left, right) sliding window in
        FlashAttention's convention, -1 an unbounded side, (-1, -1) none; sink: attention-sink
        logits, fp32 [heads_q] (one per query head, joining each row's softmax denominator), a
        device pointer (int) or a torch float32 tensor, None for none; alibi: ALiBi slopes,
        fp32 [heads_q] (the score of row i and key j gets -slope * |i + seqlen_k - seqlen_q - j|),
        a device pointer (int) or a torch float32 tensor, None for none; sink_tokens: the first
        keys every row sees besides its window band (StreamingLLM; needs window left >= 0);
        user_functions: a UserFunctions of this library, or None; user_args: up to
        MAX_USER_ARGS device pointers (ints) or contiguous torch tensors, args.ptr[i] of the
        user functions (user_arg_pointers); block_mask: a BlockMask made for these arguments,
        or None. The struct keeps only pointers: the objects must outlive its use."""
        if family:
            self.owner.check_family(family)
        o = FlashjitForwardOptions()
        o.softmax_scale = float(softmax_scale)
        o.causal = 1 if causal else 0
        o.lse = ctypes.cast(int(lse), ctypes.POINTER(ctypes.c_float)) if lse else None
        o.family = _encode(family) if family else None
        if tiles is not None:
            o.tile_m, o.tile_n, o.stages = (int(x) for x in tiles)
        o.num_splits = int(num_splits)
        if workspace is not None and not isinstance(workspace, int):
            workspace_bytes = workspace.numel() * workspace.element_size()
            workspace = workspace.data_ptr()
        o.workspace = int(workspace) if workspace else None
        o.workspace_bytes = int(workspace_bytes) if workspace else 0
        o.softcap = float(softcap)
        left, right = (int(x) for x in window)
        o.sliding_window = 1 if (left, right) != (-1, -1) else 0
        o.window_left, o.window_right = left, right
        o.sink_logits = _address(sink, "sink", "torch.float32", 1) or None
        o.alibi_slopes = _address(alibi, "alibi", "torch.float32", 1) or None
        o.sink_tokens = int(sink_tokens)
        o.user_functions = user_functions.pointer if user_functions is not None else None
        o.user_args = tuple(user_arg_pointers(user_args))
        o.block_mask = block_mask.pointer if block_mask is not None else None
        return o

    def create_block_mask_raw(self, q, k, v, out, options, same_for_all_heads=False,
                              same_for_all_batches=False, stream=None):
        """Engine::create_block_mask for flashjit_forward's structs (options with the
        user_functions, user_args and masks of that forward): a BlockMask, built on `stream`."""
        T = ctypes.POINTER(FlashjitTensor)
        return self._block_mask("flashjit_block_mask_create", [T] * 4, (q, k, v, out), options,
                                same_for_all_heads, same_for_all_batches, stream)

    def create_block_mask_kv_raw(self, q, kv, out, options, same_for_all_heads=False,
                                 same_for_all_batches=False, stream=None):
        """The same for forward_kv_raw's structs."""
        T = ctypes.POINTER(FlashjitTensor)
        return self._block_mask("flashjit_block_mask_create_kv", [T, ctypes.POINTER(
            FlashjitKvCache), T], (q, kv, out), options, same_for_all_heads,
            same_for_all_batches, stream)

    def create_block_mask_varlen_raw(self, q, kv, out, varlen, options, same_for_all_heads=False,
                                     same_for_all_batches=False, stream=None):
        """The same for forward_varlen_raw's structs."""
        T = ctypes.POINTER(FlashjitTensor)
        return self._block_mask("flashjit_block_mask_create_varlen", [
            T, ctypes.POINTER(FlashjitKvCache), T, ctypes.POINTER(FlashjitVarlen)],
            (q, kv, out, varlen), options, same_for_all_heads, same_for_all_batches, stream)

    def create_backward_block_mask_raw(self, q, k, v, options, same_for_all_heads=False,
                                       same_for_all_batches=False, stream=None):
        """Engine::create_backward_block_mask for flashjit_backward's structs (a
        FlashjitBackwardOptions with the forward's user functions and masks, and the backward's
        deterministic, family and tiles): a BlockMask for FlashjitBackwardOptions.block_mask."""
        T = ctypes.POINTER(FlashjitTensor)
        return self._block_mask("flashjit_backward_block_mask_create", [T] * 3, (q, k, v),
                                options, same_for_all_heads, same_for_all_batches, stream,
                                FlashjitBackwardOptions)

    def _block_mask(self, name, struct_types, structs, options, same_for_all_heads,
                    same_for_all_batches, stream, options_type=None):
        P = ctypes.POINTER
        function = self.owner.optional_function(
            name, [ctypes.c_void_p] + struct_types + [P(options_type or FlashjitForwardOptions),
                                                      ctypes.c_int32, ctypes.c_int32,
                                                      ctypes.c_void_p, P(ctypes.c_void_p)])
        pointer = ctypes.c_void_p()
        self.owner.check(name, function(self.handle, *(ctypes.byref(s) for s in structs),
                                        ctypes.byref(options), 1 if same_for_all_heads else 0,
                                        1 if same_for_all_batches else 0, stream or None,
                                        ctypes.byref(pointer)))
        return BlockMask(self.owner, pointer.value)

    # --- KV cache (flashjit_forward_kv and friends; FlashjitLoadError on older builds) -------

    def kv_args(self, q, k, v, out, page_table=None, seqused_k=None, causal=False,
                softmax_scale=0.0, lse=None, family=None, tiles=None, num_splits=0,
                workspace=None, **variants):
        """(q, kv, out, options) structs from torch tensors (or FlashjitTensors / pointers);
        lse a torch fp32 [batch, heads_q, seqlen_q] tensor or a pointer; variants: softcap,
        window, sink, alibi and sink_tokens as options() takes them."""
        options = self.options(causal, softmax_scale, _address(lse, "lse", "torch.float32"),
                               family, tiles, num_splits, workspace, **variants)
        return _view(q), kv_cache_from_torch(k, v, page_table, seqused_k), _view(out), options

    def forward_kv_raw(self, q, kv, out, options, stream=None):
        """forward_kv with prebuilt structs (a timing loop's form: no per-call conversion)."""
        status = self.owner.kv_function("flashjit_forward_kv")(
            self.handle, ctypes.byref(q), ctypes.byref(kv), ctypes.byref(out),
            ctypes.byref(options), stream or None)
        if status != OK:
            raise_status("flashjit_forward_kv", status, self.owner.last_error())

    def forward_kv(self, q, k, v, out, page_table=None, seqused_k=None, causal=False,
                   softmax_scale=0.0, lse=None, family=None, tiles=None, num_splits=0,
                   workspace=None, stream=None):
        """Attention over a dense (no page_table) or paged KV cache; see kv_cache_from_torch.
        stream: a CUstream handle (e.g. torch.cuda.current_stream().cuda_stream) or None for
        the legacy default stream."""
        self.forward_kv_raw(*self.kv_args(q, k, v, out, page_table, seqused_k, causal,
                                          softmax_scale, lse, family, tiles, num_splits,
                                          workspace), stream)

    def varlen_args(self, q, k, v, out, cu_seqlens_q, max_seqlen_q, cu_seqlens_k=None,
                    max_seqlen_k=0, page_table=None, seqused_k=None, causal=False,
                    softmax_scale=0.0, lse=None, family=None, num_splits=0, workspace=None,
                    tiles=None, **variants):
        """(q, kv, out, varlen, options) structs for flashjit_forward_varlen from torch tensors
        (see forward_varlen); built once, they serve forward_varlen_raw in a timing loop."""
        q_view, kv, out_view, options = self.kv_args(q, k, v, out, page_table, seqused_k, causal,
                                                     softmax_scale, lse, family, tiles,
                                                     num_splits=num_splits, workspace=workspace,
                                                     **variants)
        varlen = make_varlen(_address(cu_seqlens_q, "cu_seqlens_q", "torch.int32", 1),
                             _address(cu_seqlens_k, "cu_seqlens_k", "torch.int32", 1),
                             int(cu_seqlens_q.numel()) - 1, max_seqlen_q, max_seqlen_k)
        return q_view, kv, out_view, varlen, options

    def forward_varlen_raw(self, q, kv, out, varlen, options, stream=None):
        """forward_varlen with prebuilt structs (varlen_args): no per-call conversion."""
        status = self.owner.kv_function("flashjit_forward_varlen")(
            self.handle, ctypes.byref(q), ctypes.byref(kv), ctypes.byref(out),
            ctypes.byref(varlen), ctypes.byref(options), stream or None)
        if status != OK:
            raise_status("flashjit_forward_varlen", status, self.owner.last_error())

    def forward_varlen(self, q, k, v, out, cu_seqlens_q, max_seqlen_q, cu_seqlens_k=None,
                       max_seqlen_k=0, page_table=None, seqused_k=None, causal=False,
                       softmax_scale=0.0, lse=None, family=None, num_splits=0, stream=None,
                       workspace=None):
        """A variable-length batch: q/out [1, total_q, h, d] torch tensors, dense k/v [1,
        total_k, h_kv, d] with cu_seqlens_k (or pages with page_table, no cu_seqlens_k);
        cu_seqlens_* int32 [batch + 1] torch tensors on the device; lse [h, total_q] fp32."""
        self.forward_varlen_raw(*self.varlen_args(
            q, k, v, out, cu_seqlens_q, max_seqlen_q, cu_seqlens_k, max_seqlen_k, page_table,
            seqused_k, causal, softmax_scale, lse, family, num_splits, workspace), stream)

    def workspace_bytes_varlen_raw(self, q, kv, out, varlen, options):
        """Bytes of workspace flashjit_forward_varlen needs for these structs (0: no split)."""
        size = ctypes.c_uint64()
        self.owner.check("flashjit_workspace_bytes_varlen", self.owner.kv_function(
            "flashjit_workspace_bytes_varlen")(self.handle, ctypes.byref(q), ctypes.byref(kv),
                                               ctypes.byref(out), ctypes.byref(varlen),
                                               ctypes.byref(options), ctypes.byref(size)))
        return size.value

    def workspace_bytes_raw(self, q, kv, out, options):
        """(bytes of workspace, splits) flashjit_forward_kv needs for these structs."""
        size, splits = ctypes.c_uint64(), ctypes.c_int32()
        self.owner.check("flashjit_workspace_bytes", self.owner.kv_function(
            "flashjit_workspace_bytes")(self.handle, ctypes.byref(q), ctypes.byref(kv),
                                        ctypes.byref(out), ctypes.byref(options),
                                        ctypes.byref(size), ctypes.byref(splits)))
        return size.value, splits.value

    def workspace_bytes(self, q, k, v, out, page_table=None, seqused_k=None, causal=False,
                        num_splits=0, family=None):
        """(bytes, splits) for forward_kv with these torch tensors (split-KV scratch; 0: none)."""
        return self.workspace_bytes_raw(*self.kv_args(q, k, v, out, page_table, seqused_k, causal,
                                                      family=family, num_splits=num_splits))

    def select_variant_kv(self, q, k, v, out, page_table=None, seqused_k=None, causal=False,
                          num_splits=0, family=None):
        """The variant forward_kv would run, e.g. 'decode.sm90a.bf16.d128.m16n64s3.paged'."""
        return self.select_variant_kv_raw(*self.kv_args(q, k, v, out, page_table, seqused_k,
                                                        causal, family=family,
                                                        num_splits=num_splits))

    def select_variant_kv_raw(self, q, kv, out, options):
        buf = ctypes.create_string_buffer(256)
        self.owner.check("flashjit_select_variant_kv", self.owner.kv_function(
            "flashjit_select_variant_kv")(self.handle, ctypes.byref(q), ctypes.byref(kv),
                                          ctypes.byref(out), ctypes.byref(options), buf,
                                          len(buf)))
        return buf.value.decode()

    def merge_attention_states(self, out_a, lse_a, out_b, lse_b, out, lse_out=None,
                               stream=None):
        """out = merge of (out_a, lse_a) and (out_b, lse_b): [batch, seqlen, heads, head_dim]
        tensors, lse_* fp32 [batch, heads, seqlen] tensors or pointers; lse_out may be None."""
        def fptr(x, what):
            address = _address(x, what, "torch.float32")
            return ctypes.cast(address, ctypes.POINTER(ctypes.c_float)) if address else None
        a, b, o = _view(out_a), _view(out_b), _view(out)
        self.owner.check("flashjit_merge_attention_states", self.owner.kv_function(
            "flashjit_merge_attention_states")(
                self.handle, ctypes.byref(a), fptr(lse_a, "lse_a"), ctypes.byref(b),
                fptr(lse_b, "lse_b"), ctypes.byref(o), fptr(lse_out, "lse_out"),
                stream or None))

    def forward_raw(self, q, k, v, out, options, stream=None):
        """forward with prebuilt structs (what a timing loop wants: no per-call conversion)."""
        status = self.lib.flashjit_forward(self.handle, ctypes.byref(q), ctypes.byref(k),
                                           ctypes.byref(v), ctypes.byref(out),
                                           ctypes.byref(options), stream or None)
        if status != OK:
            raise_status("flashjit_forward", status, self.owner.last_error())

    def forward(self, q, k, v, out, causal=False, softmax_scale=0.0, lse=None, family=None,
                stream=None, tiles=None, softcap=0.0, window=(-1, -1), sink=None, alibi=None,
                sink_tokens=0, user_functions=None, user_args=(), block_mask=None):
        self.forward_raw(q, k, v, out, self.options(causal, softmax_scale, lse, family, tiles,
                                                    softcap=softcap, window=window, sink=sink,
                                                    alibi=alibi, sink_tokens=sink_tokens,
                                                    user_functions=user_functions,
                                                    user_args=user_args, block_mask=block_mask),
                         stream)

    def select_variant(self, q, k, v, out, causal=False, softmax_scale=0.0, lse=None,
                       family=None, tiles=None):
        """The canonical variant name forward would run, e.g. 'mma.sm90.bf16.d128.m128n64s2'."""
        options = self.options(causal, softmax_scale, lse, family, tiles)
        buf = ctypes.create_string_buffer(256)
        self.owner.check("flashjit_select_variant",
                         self.lib.flashjit_select_variant(
                             self.handle, ctypes.byref(q), ctypes.byref(k), ctypes.byref(v),
                             ctypes.byref(out), ctypes.byref(options), buf, len(buf)))
        return buf.value.decode()

    # --- backward (flashjit_backward and friends; FlashjitLoadError on older builds) ----------

    def backward_options(self, causal=False, softmax_scale=0.0, deterministic=False, family=None,
                         tiles=None, workspace=None, workspace_bytes=0, softcap=0.0,
                         window=(-1, -1), sink=None, alibi=None, sink_tokens=0, d_sink=None,
                         user_functions=None, user_args=()):
        """A FlashjitBackwardOptions: causal and softmax_scale those of the forward (0.0 for
        1/sqrt(head_dim)); deterministic: bitwise repeatable gradients (dQ without atomics);
        family: None for the dispatcher's dK/dV family, else one of backward_families() (checked
        here; the library refuses one that is not a dK/dV family); tiles: None or (tile_m,
        tile_n, stages); workspace: a device pointer of workspace_bytes, a torch tensor (its size
        is used), or None for the engine's own; softcap, window, sink, alibi, sink_tokens: the
        forward's (as options()); d_sink: fp32 [heads_q] (device pointer or torch tensor) for the
        sink logits' gradient, or None; user_functions, user_args: the forward's (a score_mod
        needs its score_mod_grad)."""
        if family and family not in self.owner.backward_families():
            raise ValueError(f"family {family!r}: the backward families of {self.owner.path} are "
                             f"{', '.join(self.owner.backward_families()) or 'none'} (or None "
                             "for the dispatcher's choice)")
        o = FlashjitBackwardOptions()
        o.softmax_scale = float(softmax_scale)
        o.causal = 1 if causal else 0
        o.deterministic = 1 if deterministic else 0
        if tiles is not None:
            o.tile_m, o.tile_n, o.stages = (int(x) for x in tiles)
        o.family = _encode(family) if family else None
        if workspace is not None and not isinstance(workspace, int):
            workspace_bytes = workspace.numel() * workspace.element_size()
            workspace = workspace.data_ptr()
        o.workspace = int(workspace) if workspace else None
        o.workspace_bytes = int(workspace_bytes) if workspace else 0
        o.softcap = float(softcap)
        left, right = (int(x) for x in window)
        if (left, right) != (-1, -1):  # else all zero, as the C default
            o.sliding_window, o.window_left, o.window_right = 1, left, right
        o.sink_logits = _address(sink, "sink", "torch.float32", 1) or None
        o.alibi_slopes = _address(alibi, "alibi", "torch.float32", 1) or None
        o.d_sink_logits = _address(d_sink, "d_sink", "torch.float32", 1) or None
        o.sink_tokens = int(sink_tokens)
        o.user_functions = user_functions.pointer if user_functions is not None else None
        o.user_args = tuple(user_arg_pointers(user_args))
        return o

    def backward_raw(self, q, k, v, out, dout, lse, dq, dk, dv, options, stream=None):
        """flashjit_backward with prebuilt structs (FlashjitTensors, lse a device pointer, a
        FlashjitBackwardOptions): no per-call conversion."""
        lse = ctypes.cast(int(lse), ctypes.POINTER(ctypes.c_float)) if lse else None
        status = self.owner.backward_function("flashjit_backward")(
            self.handle, ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(out),
            ctypes.byref(dout), lse, ctypes.byref(dq), ctypes.byref(dk), ctypes.byref(dv),
            ctypes.byref(options), stream or None)
        if status != OK:
            raise_status("flashjit_backward", status, self.owner.last_error())

    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, causal=False, softmax_scale=0.0,
                 deterministic=False, family=None, tiles=None, workspace=None, stream=None):
        """Gradients of forward(q, k, v, out): writes dq, dk, dv (torch tensors or
        FlashjitTensors) from dout; lse: the forward's fp32 [batch, heads_q, seqlen_q], a torch
        tensor or a device pointer. stream as forward_kv."""
        self.backward_raw(_view(q), _view(k), _view(v), _view(out), _view(dout),
                          _address(lse, "lse", "torch.float32", 3), _view(dq), _view(dk),
                          _view(dv), self.backward_options(causal, softmax_scale, deterministic,
                                                           family, tiles, workspace), stream)

    def backward_workspace_bytes_raw(self, q, k, v, options):
        """Bytes of workspace flashjit_backward needs for these structs."""
        size = ctypes.c_uint64()
        self.owner.check("flashjit_backward_workspace_bytes", self.owner.backward_function(
            "flashjit_backward_workspace_bytes")(self.handle, ctypes.byref(q), ctypes.byref(k),
                                                 ctypes.byref(v), ctypes.byref(options),
                                                 ctypes.byref(size)))
        return size.value

    def select_backward_variant_raw(self, q, k, v, options):
        """The dK/dV variant flashjit_backward runs for these structs, e.g.
        'bwd_mma.sm90a.bf16.d128.m64n64s2.causal'."""
        buf = ctypes.create_string_buffer(256)
        self.owner.check("flashjit_select_backward_variant", self.owner.backward_function(
            "flashjit_select_backward_variant")(self.handle, ctypes.byref(q), ctypes.byref(k),
                                                ctypes.byref(v), ctypes.byref(options), buf,
                                                len(buf)))
        return buf.value.decode()

    def backward_varlen_raw(self, q, k, v, out, dout, lse, dq, dk, dv, varlen, options,
                            stream=None):
        """flashjit_backward_varlen with prebuilt structs: q, out, dout, dq packed FlashjitTensors
        [1, total_q, heads_q, head_dim], k, v, dk, dv [1, total_k, heads_kv, head_dim] (a dense
        packed k/v), lse a device pointer to the forward's fp32 [heads_q, total_q], varlen a
        FlashjitVarlen (make_varlen; cu_seqlens_k required), options a FlashjitBackwardOptions.
        Rows past cu_seqlens_q[batch] of dq and past cu_seqlens_k[batch] of dk/dv are not
        written."""
        lse = ctypes.cast(int(lse), ctypes.POINTER(ctypes.c_float)) if lse else None
        status = self.owner.backward_function("flashjit_backward_varlen")(
            self.handle, ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(out),
            ctypes.byref(dout), lse, ctypes.byref(dq), ctypes.byref(dk), ctypes.byref(dv),
            ctypes.byref(varlen), ctypes.byref(options), stream or None)
        if status != OK:
            raise_status("flashjit_backward_varlen", status, self.owner.last_error())

    def backward_workspace_bytes_varlen_raw(self, q, k, v, varlen, options):
        """Bytes of workspace flashjit_backward_varlen needs for these structs."""
        size = ctypes.c_uint64()
        self.owner.check("flashjit_backward_workspace_bytes_varlen", self.owner.backward_function(
            "flashjit_backward_workspace_bytes_varlen")(
                self.handle, ctypes.byref(q), ctypes.byref(k), ctypes.byref(v),
                ctypes.byref(varlen), ctypes.byref(options), ctypes.byref(size)))
        return size.value

    def select_backward_variant_varlen_raw(self, q, k, v, varlen, options):
        """The dK/dV variant flashjit_backward_varlen runs for these structs."""
        buf = ctypes.create_string_buffer(256)
        self.owner.check("flashjit_select_backward_variant_varlen", self.owner.backward_function(
            "flashjit_select_backward_variant_varlen")(
                self.handle, ctypes.byref(q), ctypes.byref(k), ctypes.byref(v),
                ctypes.byref(varlen), ctypes.byref(options), buf, len(buf)))
        return buf.value.decode()

    def select_backward_variant(self, q, k, v, causal=False, deterministic=False, family=None,
                                tiles=None):
        """select_backward_variant_raw for torch tensors (or FlashjitTensors)."""
        return self.select_backward_variant_raw(
            _view(q), _view(k), _view(v),
            self.backward_options(causal, deterministic=deterministic, family=family,
                                  tiles=tiles))

    def record_variants(self, manifest_path):
        """From now on, append each variant this engine runs for the first time to the manifest
        file (FLASHJIT_RECORD does it from the start); `flashjit precompile --manifest` builds
        them."""
        function = self.owner.optional_function(
            "flashjit_engine_record", [ctypes.c_void_p, ctypes.c_char_p])
        self.owner.check("flashjit_engine_record", function(self.handle, _encode(str(manifest_path))))

    def set_never_block(self, on=True):
        """on: a forward whose kernel is not compiled runs a compiled stand-in while it compiles
        in the background (FLASHJIT_NEVER_BLOCK=1 for every engine)."""
        function = self.owner.optional_function(
            "flashjit_engine_set_never_block", [ctypes.c_void_p, ctypes.c_int32])
        self.owner.check("flashjit_engine_set_never_block", function(self.handle, 1 if on else 0))


# --- which libnvrtc flashjit uses (the C API does not report it) --------------------------

def elf_needed(path):
    """DT_NEEDED sonames of a 64-bit little-endian ELF shared object ([] if unreadable)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        base = shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", data, base + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, base + 0x18)
        sh_link, = struct.unpack_from("<I", data, base + 0x28)
        sections.append((sh_type, sh_offset, sh_size, sh_link))
    needed = []
    for sh_type, offset, size, link in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][1]
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab_offset + value)
                needed.append(data[strtab_offset + value:end].decode())
    return needed


def loaded_nvrtc(library_path):
    """{'path', 'version'} of the libnvrtc this process loaded for `library_path`, or None.

    Reads the NEEDED soname from the ELF file and finds the mapped file in /proc/self/maps:
    when torch preloaded a libnvrtc with the same soname, that copy is the one flashjit uses."""
    sonames = [n for n in elf_needed(os.path.realpath(library_path)) if n.startswith("libnvrtc")]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    mapped = []
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) >= 6 and "libnvrtc" in parts[5] and "builtins" not in parts[5]:
            if parts[5] not in mapped:
                mapped.append(parts[5])
    chosen = None
    for path in mapped:
        base = os.path.basename(path)
        if not sonames or any(base.startswith(s) for s in sonames):
            chosen = path
            break
    if chosen is None:
        return None
    try:
        nvrtc = ctypes.CDLL(chosen)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            return {"path": chosen, "version": None}
        return {"path": chosen, "version": f"{major.value}.{minor.value}"}
    except OSError:
        return {"path": chosen, "version": None}
