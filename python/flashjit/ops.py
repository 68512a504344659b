"""flashjit's attention on torch tensors: torch.library custom ops over the C API (ctypes).

Each entry point is a custom op (`torch.ops.flashjit.*`) with a fake implementation, so
torch.compile(fullgraph=True) traces through it, and runs on torch's current stream, so CUDA
graph capture records it. Outputs are allocated by torch's caching allocator (graph-pool aware);
split-KV scratch too, so the library never allocates during a capture.

Training: flashjit.attention is differentiable in q, k and v through
`torch.ops.flashjit.attention_backward`, and flashjit.attention_varlen (over a dense packed k/v)
through `torch.ops.flashjit.attention_varlen_backward` (flashjit.backward registers the
formulas; a forward whose inputs want gradients keeps the LSE for them). The KV-cache and merge
ops register a formula that raises NotImplementedError when a backward reaches them (their
forward still runs with inputs that require grad); under torch.compile, AOTAutograd traces that
backward when an input requires grad, so the error comes at compile time.

Bad input raises flashjit.InvalidArgumentError (a ValueError) with the library's message;
CPU tensors raise ValueError before anything reaches the library.

User functions travel through the ops' schema as their hash (the UserFunctions is found in
flashjit.user_functions' registry), user_args as a Tensor?[] list beside an int[] list of raw
pointers (one entry per slot), and a BlockMask as its id in a registry of live masks: an int, so a
new mask in a compiled function is one recompile, then a dynamic int (never a graph break).
"""

import ctypes
import itertools
import math
import struct
import threading
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi, library
from .user_functions import UserFunctions, registered

_DTYPES = (torch.bfloat16, torch.float16)
_NAMESPACE = "flashjit"

# --- engines and streams ----------------------------------------------------------------------

_engines = {}
_engines_lock = threading.Lock()


def _engine(device):
    """The flashjit engine of a CUDA device (one per GPU, bound to its primary context, which is
    torch's too), created on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    engine = _engines.get(index)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(index)
            if engine is None:
                engine = _engines[index] = library().create_engine(index)
    return engine, index


# torch's own raw-stream getter (what Inductor's generated code calls) costs a fraction of
# torch.cuda.current_stream(); fall back to the public call where it is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(index):
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


# --- argument checks, shared by the real and the fake implementations -------------------------

def _check_tensor(name, t, dims, where, dtypes=_DTYPES):
    if not isinstance(t, Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cuda", "meta"):
        raise ValueError(f"{where}: {name} is on {t.device}: flashjit runs on CUDA tensors")
    if t.dim() not in dims:
        raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}: expected "
                         f"{' or '.join(str(d) for d in dims)} dims")
    if t.dtype not in dtypes:
        raise ValueError(f"{where}: {name} is {t.dtype}: expected "
                         f"{' or '.join(str(d) for d in dtypes)}")


def _check_same_device(where, first, *others):
    for name, t in others:
        if t is not None and t.device != first.device:
            raise ValueError(f"{where}: {name} is on {t.device}, q on {first.device}")


def _check_common(where, q, sink_logits, alibi_slopes, user_functions, user_args):
    if sink_logits is not None:
        _check_tensor("sink_logits", sink_logits, (1,), where, (torch.float32,))
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, (1,), where, (torch.float32,))
    if user_functions is not None:
        registered(user_functions)
    elif any(t is not None for t in user_args):
        raise ValueError(f"{where}: user_args without user_functions: expected user functions "
                         "that read them, or no user_args")
    for i, t in enumerate(user_args):
        if t is None:
            continue
        name = f"user_args[{i}]"
        _check_same_device(where, q, (name, t))
        if not t.is_contiguous():
            raise ValueError(f"{where}: {name} has strides {tuple(t.stride())}: expected a "
                             "contiguous tensor (user functions index its memory directly)")


# --- user functions and block masks -------------------------------------------------------------

def _user_inputs(where, user_functions, user_args, block_mask):
    """(hash, tensors, pointers, mask id): the ops' encoding of user_functions (a UserFunctions
    or None), user_args (up to MAX_USER_ARGS tensors on the device, ints as raw device pointers,
    or None) and block_mask (a BlockMask or None)."""
    if user_functions is not None and not isinstance(user_functions, UserFunctions):
        raise TypeError(f"{where}: user_functions has type {type(user_functions).__name__}: "
                        "expected a flashjit.UserFunctions or None")
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError(f"{where}: block_mask has type {type(block_mask).__name__}: expected a "
                        "flashjit.BlockMask (flashjit.create_block_mask) or None")
    if block_mask is not None and user_functions is None:
        raise ValueError(f"{where}: block_mask without user_functions: expected the user "
                         "functions the mask was built from")
    args = list(user_args or ())
    if len(args) > _capi.MAX_USER_ARGS:
        raise ValueError(f"{where}: user_args has {len(args)} entries: expected at most "
                         f"{_capi.MAX_USER_ARGS}")
    tensors = [a if isinstance(a, Tensor) else None for a in args]
    pointers = []
    for i, a in enumerate(args):
        if not (a is None or isinstance(a, (Tensor, int))):
            raise TypeError(f"{where}: user_args[{i}] has type {type(a).__name__}: expected a "
                            "torch.Tensor on the device, an int (a device pointer) or None")
        pointers.append(int(a) if isinstance(a, int) else 0)
    return (user_functions.hash if user_functions is not None else None, tensors, pointers,
            block_mask._id if block_mask is not None else 0)


def _set_user(options, user_functions, user_args, user_pointers, block_mask):
    """Puts the ops' user-function arguments into a FlashjitForwardOptions (pointers only: the
    UserFunctions stays in its registry, the tensors and the mask with the caller)."""
    if user_functions is None:
        return
    options.user_functions = registered(user_functions).pointer
    options.user_args = tuple(t.data_ptr() if t is not None else int(p)
                              for t, p in zip(user_args, user_pointers)) + \
        (0,) * (_capi.MAX_USER_ARGS - len(user_args))
    if block_mask:
        options.block_mask = _block_mask_of(block_mask)._handle.pointer


class BlockMask:
    """The key tiles one attention problem's mask_mod lets through (flashjit::BlockMask), made by
    flashjit.create_block_mask* for the arguments of the forward that takes it (block_mask=):
    tiles the mask hides wholly are skipped, tiles it hides nowhere skip the per-score test. It
    holds device memory of the GPU it was made on and the user_args tensors its build reads.
    Rebuild it when the contents of user_args change: the forward cannot check those."""

    # From 2: 0 is "no mask", and torch.compile specializes the ints 0 and 1, so a first mask
    # numbered 1 cost torch 2.4 one more recompile before its id became a dynamic int.
    _ids = itertools.count(2)

    def __init__(self, handle, user_args, backward=None):
        self._handle = handle  # _capi.BlockMask
        # create_block_mask(backward=True): the backward's maps (create_backward_block_mask),
        # which flashjit.attention's autograd backward passes on; None: it masks score by score.
        self._backward = backward
        self._user_args = [t for t in user_args if t is not None]  # read while it builds
        self._id = next(self._ids)
        _block_masks[self._id] = self

    def counts(self):
        """{'partial', 'full', 'total'}: key tiles visited partly masked and not masked, and the
        tiles the causal / window masks leave, summed over the map (waits for its build)."""
        return dict(zip(("partial", "full", "total"), self._handle.counts()))

    def backward_counts(self):
        """counts() of the backward's key-major map ((key tile, query head, query tile) steps of
        its dK/dV kernel), or None when it was made without backward=True."""
        if self._backward is None:
            return None
        return dict(zip(("partial", "full", "total"), self._backward.counts()))

    @property
    def variant(self):
        """The attention variant it was built for: what the forward given it runs."""
        return self._handle.variant()

    def __repr__(self):
        return f"flashjit.BlockMask({self.variant})"


_block_masks = weakref.WeakValueDictionary()


def _block_mask_of(mask_id):
    mask = _block_masks.get(int(mask_id))
    if mask is None:
        raise ValueError(f"block_mask: flashjit.BlockMask #{mask_id} no longer exists: keep the "
                         "mask alive while calls (and captured CUDA graphs) use it")
    return mask


def _scale(softmax_scale):
    """The op's softmax_scale: 0.0 for None (the C API's 1/sqrt(head_dim)), else checked."""
    if softmax_scale is None:
        return 0.0
    scale = float(softmax_scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"softmax_scale {softmax_scale}: expected a finite positive number, "
                         "or None for 1/sqrt(head_dim)")
    return scale


def _variants(window_left, window_right, softcap, sink_logits, alibi_slopes, sink_tokens):
    # The binding's names for them (Engine.options): its encoding stays in one place.
    return {"softcap": softcap, "window": (window_left, window_right), "sink": sink_logits,
            "alibi": alibi_slopes, "sink_tokens": sink_tokens}


def _lse_pointer(lse):
    return lse.data_ptr() if lse is not None else None


def _set_workspace(options, workspace):
    if workspace is not None:
        options.workspace, options.workspace_bytes = workspace.data_ptr(), workspace.numel()


def _no_lse(q):
    return q.new_empty((0,), dtype=torch.float32)


# --- the eager hot path ------------------------------------------------------------------------
# torch's custom-op dispatch (autograd wrapper, pytree walks, redispatch to Python) costs ~25 us
# a call, more than the whole C API call (measured on the H200, python/benchmarks/overhead.py).
# So plain eager calls on CUDA tensors that need no autograd run the implementation directly;
# anything torch must see goes through the op: tracing (dynamo, make_fx, fake tensors), tensor
# subclasses, torch function or dispatch modes, the profiler, and inputs that require grad.

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", None)
_profiling = getattr(torch.autograd, "_profiler_enabled", None)
_HOT_PATH = None not in (_is_compiling, _dispatch_modes, _function_modes, _profiling)


def _eager(*tensors):
    """Whether this call may skip torch's dispatcher (see above)."""
    if not _HOT_PATH or _is_compiling() or _dispatch_modes() or _function_modes() \
            or _profiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or not t.is_cuda
                              or (grad and t.requires_grad)):
            return False
    return True


_CODES = {torch.bfloat16: _capi.DTYPES["bf16"], torch.float16: _capi.DTYPES["fp16"]}
_LSE_OFFSET = _capi.FlashjitForwardOptions.lse.offset
_OPTIONS_BYTES = ctypes.sizeof(_capi.FlashjitForwardOptions)
_ADDRESS = struct.Struct("=Q")


# FlashjitTensor's bytes packed by struct and copied in: 0.5 us, where the ctypes constructor
# takes 2.3 us (H200 host). The format mirrors the ctypes struct, and is checked against it here.
_TENSOR = struct.Struct("=Qi4x4q4q")
_T = _capi.FlashjitTensor
assert (_TENSOR.size, _T.dtype.offset, _T.shape.offset, _T.stride.offset) == \
    (ctypes.sizeof(_T), 8, 16, 48), "flashjit.ops._TENSOR no longer matches FlashjitTensor"
# q, k, v and out of one forward, packed by one call into the calling thread's buffer (the C API
# reads them before it returns): a third of the time of four FlashjitTensor objects.
_TENSORS = struct.Struct("=" + _TENSOR.format.lstrip("=") * 4)


def _view(t):
    # tensor_from_torch without its checks (done by the caller).
    return _T.from_buffer_copy(_TENSOR.pack(t.data_ptr(), _CODES[t.dtype], *t.shape,
                                            *t.stride()))


class _CallBuffers(threading.local):
    """Per thread: the four tensors and the options of the forward in progress."""

    def __init__(self):
        self.tensors = (_T * 4)()
        self.tensors_at = ctypes.addressof(self.tensors)
        self.options = _capi.FlashjitForwardOptions()
        self.options_at = ctypes.addressof(self.options)


_buffers = _CallBuffers()


def _forward_dense(engine, index, q, k, v, out, options):
    """flashjit_forward of four dense tensors (checked by the caller) and a FlashjitForwardOptions,
    on torch's current stream of device `index`."""
    buffers = _buffers
    _TENSORS.pack_into(buffers.tensors, 0,
                       q.data_ptr(), _CODES[q.dtype], *q.shape, *q.stride(),
                       k.data_ptr(), _CODES[k.dtype], *k.shape, *k.stride(),
                       v.data_ptr(), _CODES[v.dtype], *v.shape, *v.stride(),
                       out.data_ptr(), _CODES[out.dtype], *out.shape, *out.stride())
    engine.forward_at(buffers.tensors_at, ctypes.addressof(options), _stream(index))


_templates = {}


def _options_template(engine, causal, softmax_scale, window_left, window_right, softcap,
                      sink_logits, alibi_slopes, sink_tokens, family):
    """engine.options() for these arguments with no LSE and no user functions, built once per
    distinct set (building costs microseconds) and never written after: calls copy it, or pass
    it as it is."""
    key = (causal, softmax_scale, window_left, window_right, softcap, family,
           sink_logits.data_ptr() if sink_logits is not None else 0,
           alibi_slopes.data_ptr() if alibi_slopes is not None else 0, sink_tokens)
    template = _templates.get(key)
    if template is None:
        if len(_templates) > 1024:  # bounded: a caller cycling through scales or sinks
            _templates.clear()
        template = _templates[key] = engine.options(
            causal, softmax_scale, None, family,
            **_variants(window_left, window_right, softcap, sink_logits, alibi_slopes,
                        sink_tokens))
    return template


def _dense_options(engine, causal, softmax_scale, lse, window_left, window_right, softcap,
                   sink_logits, alibi_slopes, sink_tokens, family):
    """A copy of the template for these arguments (a copy is one memcpy), with lse's pointer; the
    user functions' fields are _set_user's."""
    options = _capi.FlashjitForwardOptions.from_buffer_copy(_options_template(
        engine, causal, softmax_scale, window_left, window_right, softcap, sink_logits,
        alibi_slopes, sink_tokens, family))
    if lse is not None:
        ctypes.c_void_p.from_buffer(options, _LSE_OFFSET).value = lse.data_ptr()
    return options


def _attention_eager(q, k, v, causal, softmax_scale, return_lse, window_left, window_right,
                     softcap, sink_tokens, family):
    """flashjit.attention without sinks, ALiBi or user functions on plain CUDA tensors of one
    device and dtype that need no autograd, run directly (the _eager rules); None where the call
    must take the general path (which also words the errors). Every tensor attribute is read once:
    each read costs ~0.25 us."""
    if (not _HOT_PATH or type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor
            or _is_compiling() or _dispatch_modes() or _function_modes() or _profiling()):
        return None
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        return None
    index, dtype, q_shape, k_shape, v_shape = q.get_device(), q.dtype, q.shape, k.shape, v.shape
    code = _CODES.get(dtype)
    if (not (q.is_cuda and k.is_cuda and v.is_cuda) or code is None
            or k.get_device() != index or v.get_device() != index
            or k.dtype is not dtype or v.dtype is not dtype or len(q_shape) != 4
            or len(k_shape) != 4 or len(v_shape) != 4):
        return None
    engine = _engines.get(index)
    if engine is None:
        engine = _engine(q.device)[0]
    scale = 0.0 if softmax_scale is None else _scale(softmax_scale)
    options = _options_template(engine, causal, scale, window_left, window_right, softcap, None,
                                None, sink_tokens, family)
    batch, seqlen, heads, head_dim = q_shape
    q_stride = q.stride()
    out_stride = (seqlen * heads * head_dim, heads * head_dim, head_dim, 1)
    # empty_like keeps a contiguous q's strides, and is faster without a memory format.
    out = torch.empty_like(q) if q_stride == out_stride else \
        torch.empty_like(q, memory_format=torch.contiguous_format)
    buffers = _buffers
    options_at = ctypes.addressof(options)
    lse = None
    if return_lse:
        lse = q.new_empty((batch, heads, seqlen), dtype=torch.float32)
        ctypes.memmove(buffers.options_at, options_at, _OPTIONS_BYTES)
        _ADDRESS.pack_into(buffers.options, _LSE_OFFSET, lse.data_ptr())
        options_at = buffers.options_at
    _TENSORS.pack_into(buffers.tensors, 0,
                       q.data_ptr(), code, *q_shape, *q_stride,
                       k.data_ptr(), code, *k_shape, *k.stride(),
                       v.data_ptr(), code, *v_shape, *v.stride(),
                       out.data_ptr(), code, *q_shape, *out_stride)
    engine.forward_at(buffers.tensors_at, options_at, _stream(index))
    return (out, lse) if return_lse else out


# --- flashjit::attention: dense [batch, seqlen, heads, head_dim] --------------------------------

def _run_attention(q, k, v, causal, softmax_scale, return_lse, window_left, window_right,
                   softcap, sink_logits, alibi_slopes, sink_tokens, family, user_functions,
                   user_args, user_pointers, block_mask, deterministic=False):
    """(out, lse or None): the forward itself (deterministic is the backward's: unused here)."""
    # The common case checked in one expression; anything else gets _check_attention's message.
    device = q.device
    if not (q.is_cuda and k.device == device and v.device == device and q.dim() == 4
            and k.dim() == 4 and v.dim() == 4 and q.dtype in _CODES and k.dtype in _CODES
            and v.dtype in _CODES and sink_logits is None
            and alibi_slopes is None and user_functions is None):
        _check_attention(q, k, v, sink_logits, alibi_slopes, user_functions, user_args)
    engine, index = _engine(device)
    # empty_like is twice as fast as new_empty(shape); out has q's shape (one head_dim).
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=device) \
        if return_lse else None
    options = _dense_options(engine, causal, softmax_scale, lse, window_left, window_right,
                             softcap, sink_logits, alibi_slopes, sink_tokens, family)
    _set_user(options, user_functions, user_args, user_pointers, block_mask)
    _forward_dense(engine, index, q, k, v, out, options)
    return out, lse


@torch.library.custom_op(f"{_NAMESPACE}::attention", mutates_args=())
def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float,
               return_lse: bool, window_left: int, window_right: int, softcap: float,
               sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor], sink_tokens: int,
               family: Optional[str], user_functions: Optional[str],
               user_args: List[Optional[Tensor]], user_pointers: List[int],
               block_mask: int, deterministic: bool) -> Tuple[Tensor, Tensor]:
    # deterministic is carried for the autograd formula (flashjit.backward), which runs
    # flashjit::attention_backward with it. No default value: torch 2.11's autograd wrapper
    # (the dispatcher drops arguments equal to their defaults) then returned one gradient too
    # many for the inputs' structure.
    out, lse = _run_attention(q, k, v, causal, softmax_scale, return_lse, window_left,
                              window_right, softcap, sink_logits, alibi_slopes, sink_tokens, family,
                              user_functions, user_args, user_pointers, block_mask)
    return out, lse if lse is not None else _no_lse(q)


@_attention.register_fake
def _(q, k, v, causal, softmax_scale, return_lse, window_left, window_right, softcap,
      sink_logits, alibi_slopes, sink_tokens, family, user_functions, user_args, user_pointers,
      block_mask, deterministic=False):
    _check_attention(q, k, v, sink_logits, alibi_slopes, user_functions, user_args)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else _no_lse(q)
    return out, lse


def _check_attention(q, k, v, sink_logits, alibi_slopes, user_functions, user_args,
                     where="flashjit.attention"):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, (4,), where)
    _check_same_device(where, q, ("k", k), ("v", v), ("sink_logits", sink_logits),
                       ("alibi_slopes", alibi_slopes))
    _check_common(where, q, sink_logits, alibi_slopes, user_functions, user_args)


def attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, window_left=-1,
              window_right=-1, softcap=0.0, sink_logits=None, alibi_slopes=None, sink_tokens=0,
              family=None, user_functions=None, user_args=(), block_mask=None,
              deterministic=False):
    """Attention forward on [batch, seqlen, heads, head_dim] CUDA tensors (bf16 or fp16; any
    strides with a unit head_dim stride, e.g. BSHD or a BHSD transpose), GQA/MQA when heads_q is
    a multiple of heads_kv. Returns out [batch, seqlen_q, heads_q, head_dim] (contiguous), and
    with return_lse=True also the fp32 log-sum-exp [batch, heads_q, seqlen_q] (natural log).

    causal: aligned bottom-right when seqlen_q != seqlen_k (as FlashAttention).
    softmax_scale: None for 1/sqrt(head_dim).
    window_left / window_right: sliding window, FlashAttention's convention (-1: unbounded).
    softcap: > 0 caps scores at softcap * tanh(score / softcap).
    sink_logits: fp32 [heads_q] learnable attention-sink logits (in each row's denominator).
    alibi_slopes: fp32 [heads_q] ALiBi slopes: scores get -slope * |i + seqlen_k - seqlen_q - j|.
    sink_tokens: with a window (window_left >= 0), the first sink_tokens keys stay visible too
    (StreamingLLM).
    family: force a kernel family (e.g. 'mma'); None for the dispatcher's choice.
    user_functions: a flashjit.UserFunctions (score_mod / mask_mod in CUDA C) compiled into the
    kernel; user_args: what they see as args.ptr[i], up to 8 entries, each a contiguous torch
    tensor on q's device (read-only), an int (a raw device pointer) or None.
    block_mask: a flashjit.BlockMask made by create_block_mask for these same arguments: key
    tiles its mask_mod hides wholly are skipped.
    deterministic: the backward's gradients are bitwise repeatable (dQ without atomics, about
    1.4x the work of the backward); the forward is the same either way.

    Differentiable in q, k and v, and in sink_logits (flashjit.attention_backward: causal,
    softmax_scale, windows with sink tokens, soft-capping, sinks, ALiBi and user functions all
    have a backward: a score_mod needs its score_mod_grad, else a backward through it raises
    NotImplementedError; with a block mask the backward runs the mask_mod score by score, which
    gives the same gradients). The LSE is not differentiable, as in FlashAttention: what flows
    back through it is dropped."""
    if (user_functions is None and block_mask is None and sink_logits is None
            and alibi_slopes is None and type(user_args) in (tuple, list) and not user_args):
        result = _attention_eager(q, k, v, bool(causal), softmax_scale, bool(return_lse),
                                  int(window_left), int(window_right), float(softcap),
                                  int(sink_tokens), family)
        if result is not None:
            return result
    user = _user_inputs("flashjit.attention", user_functions, user_args, block_mask)
    # The backward needs the LSE: a forward whose inputs want gradients keeps it.
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                              or v.requires_grad)
    args = (q, k, v, bool(causal), _scale(softmax_scale), bool(return_lse or needs_grad),
            int(window_left), int(window_right), float(softcap), sink_logits, alibi_slopes,
            sink_tokens, family, *user, bool(deterministic))
    out, lse = _run_attention(*args) if _eager(q, k, v, sink_logits, alibi_slopes, *user[1]) \
        else torch.ops.flashjit.attention(*args)
    return (out, lse) if return_lse else out


def create_block_mask(q, k, v, *, user_functions, user_args=(), causal=False, softmax_scale=None,
                      window_left=-1, window_right=-1, softcap=0.0, sink_logits=None,
                      alibi_slopes=None, sink_tokens=0, family=None, same_for_all_heads=False,
                      same_for_all_batches=False, backward=None, deterministic=False):
    """The BlockMask of user_functions' mask_mod for attention(q, k, v, ...) with these same
    arguments (block_mask= aside), built on the current stream from q's, k's and v's shapes and
    user_args (their contents, not q/k/v's). same_for_all_heads / same_for_all_batches: the
    mask_mod reads neither head nor batch, so one map serves all (smaller, built faster).
    backward=True also builds the backward's maps (Engine::create_backward_block_mask, for the
    kernels a backward with this `deterministic` runs), which attention's autograd backward then
    uses: the tiles the mask hides are skipped there too. None (the default): True where q, k or
    v requires grad under grad mode, since a mask_mod's backward without its maps runs every
    causal tile, and slower than before block masks existed (docs/perf-log.md, session 18). Call
    it outside compiled code and before a CUDA graph capture (it allocates device memory)."""
    where = "flashjit.create_block_mask"
    hash_, tensors, pointers = _mask_user_inputs(where, user_functions, user_args)
    _check_attention(q, k, v, sink_logits, alibi_slopes, hash_, tensors, where)
    engine, index = _engine(q.device)
    options = _dense_options(engine, bool(causal), _scale(softmax_scale), None, int(window_left),
                             int(window_right), float(softcap), sink_logits, alibi_slopes,
                             int(sink_tokens), family)
    _set_user(options, hash_, tensors, pointers, 0)
    # The mask reads no output: q's view stands in for out (they have one shape).
    forward = engine.create_block_mask_raw(_view(q), _view(k), _view(v), _view(q), options,
                                           same_for_all_heads, same_for_all_batches,
                                           _stream(index))
    if backward is None:
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    backward_maps = None
    if backward:
        # The options attention's backward gives (flashjit.backward), masks and user functions.
        backward_options = engine.backward_options(
            bool(causal), _scale(softmax_scale), bool(deterministic), softcap=float(softcap),
            window=(int(window_left), int(window_right)), sink=sink_logits, alibi=alibi_slopes,
            sink_tokens=int(sink_tokens))
        _set_user(backward_options, hash_, tensors, pointers, 0)
        backward_maps = engine.create_backward_block_mask_raw(
            _view(q), _view(k), _view(v), backward_options, same_for_all_heads,
            same_for_all_batches, _stream(index))
    return BlockMask(forward, tensors, backward_maps)


def _mask_user_inputs(where, user_functions, user_args):
    """_user_inputs' (hash, tensors, pointers) for a create_block_mask*, which needs them."""
    if user_functions is None:
        raise ValueError(f"{where}: user_functions is None: expected the flashjit.UserFunctions "
                         "whose mask_mod the mask lists")
    return _user_inputs(where, user_functions, user_args, None)[:3]


# --- flashjit::attention_kvcache: dense or paged KV cache (decode, chunked prefill) -------------

@torch.library.custom_op(f"{_NAMESPACE}::attention_kvcache", mutates_args=())
def _attention_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Optional[Tensor],
                       seqused_k: Optional[Tensor], causal: bool, softmax_scale: float,
                       return_lse: bool, window_left: int, window_right: int, softcap: float,
                       sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor],
                       sink_tokens: int, num_splits: int, family: Optional[str],
                       user_functions: Optional[str], user_args: List[Optional[Tensor]],
                       user_pointers: List[int], block_mask: int) -> Tuple[Tensor, Tensor]:
    _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes,
                   user_functions, user_args)
    engine, index = _engine(q.device)
    out = q.new_empty(q.shape[:-1] + v_cache.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else None
    q_view, kv, out_view, options = _kv_structs(
        engine, q, k_cache, v_cache, out, page_table, seqused_k, causal, softmax_scale, lse,
        window_left, window_right, softcap, sink_logits, alibi_slopes, sink_tokens, num_splits,
        family, user_functions, user_args, user_pointers, block_mask)
    workspace = _workspace(q, engine.workspace_bytes_raw(q_view, kv, out_view, options)[0])
    _set_workspace(options, workspace)
    engine.forward_kv_raw(q_view, kv, out_view, options, _stream(index))
    return out, lse if lse is not None else _no_lse(q)


def _kv_structs(engine, q, k_cache, v_cache, out, page_table, seqused_k, causal, softmax_scale,
                lse, window_left, window_right, softcap, sink_logits, alibi_slopes, sink_tokens,
                num_splits, family, user_functions, user_args, user_pointers, block_mask):
    """(q, kv, out, options) structs of a forward_kv (and of its block mask)."""
    structs = engine.kv_args(
        q, k_cache, v_cache, out, page_table, seqused_k, causal, softmax_scale, _lse_pointer(lse),
        family, num_splits=num_splits, **_variants(window_left, window_right, softcap,
                                                   sink_logits, alibi_slopes, sink_tokens))
    _set_user(structs[-1], user_functions, user_args, user_pointers, block_mask)
    return structs


def _workspace(q, size):
    # Split-KV scratch from torch's allocator, so a CUDA graph capture owns it (None: no split).
    return q.new_empty((size,), dtype=torch.uint8) if size else None


@_attention_kvcache.register_fake
def _(q, k_cache, v_cache, page_table, seqused_k, causal, softmax_scale, return_lse, window_left,
      window_right, softcap, sink_logits, alibi_slopes, sink_tokens, num_splits, family,
      user_functions, user_args, user_pointers, block_mask):
    _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes,
                   user_functions, user_args)
    out = q.new_empty(q.shape[:-1] + v_cache.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else _no_lse(q)
    return out, lse


def _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes,
                   user_functions, user_args, where="flashjit.attention_with_kvcache"):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, (4,), where)
    if page_table is not None:
        _check_tensor("page_table", page_table, (2,), where, (torch.int32,))
    if seqused_k is not None:
        _check_tensor("seqused_k", seqused_k, (1,), where, (torch.int32,))
    _check_same_device(where, q, ("k_cache", k_cache), ("v_cache", v_cache),
                       ("page_table", page_table), ("seqused_k", seqused_k),
                       ("sink_logits", sink_logits), ("alibi_slopes", alibi_slopes))
    _check_common(where, q, sink_logits, alibi_slopes, user_functions, user_args)


def attention_with_kvcache(q, k_cache, v_cache, *, page_table=None, seqused_k=None, causal=False,
                           softmax_scale=None, return_lse=False, window_left=-1, window_right=-1,
                           softcap=0.0, sink_logits=None, alibi_slopes=None, sink_tokens=0,
                           num_splits=0, family=None, user_functions=None, user_args=(),
                           block_mask=None):
    """Attention over a KV cache (decode steps, speculative decode, chunked prefill).

    q: [batch, seqlen_q, heads_q, head_dim]. Dense cache: k_cache/v_cache [batch, seqlen_k,
    heads_kv, head_dim]. Paged cache: pages [num_pages, page_size, heads_kv, head_dim] (vLLM's
    NHD; a transposed HND view works too) with page_table int32 [batch, pages_per_seq].
    seqused_k: int32 [batch], the keys each sequence uses (None: all). num_splits: split-KV
    count, 0 for the library's heuristic. Other arguments as attention(); returns out (and the
    LSE [batch, heads_q, seqlen_q] with return_lse=True)."""
    out, lse = torch.ops.flashjit.attention_kvcache(
        q, k_cache, v_cache, page_table, seqused_k, bool(causal), _scale(softmax_scale),
        bool(return_lse), int(window_left), int(window_right), float(softcap), sink_logits,
        alibi_slopes, sink_tokens, int(num_splits), family,
        *_user_inputs("flashjit.attention_with_kvcache", user_functions, user_args, block_mask))
    return (out, lse) if return_lse else out


def create_block_mask_with_kvcache(q, k_cache, v_cache, *, user_functions, user_args=(),
                                   page_table=None, seqused_k=None, causal=False,
                                   softmax_scale=None, window_left=-1, window_right=-1,
                                   softcap=0.0, sink_logits=None, alibi_slopes=None,
                                   sink_tokens=0, family=None, same_for_all_heads=False,
                                   same_for_all_batches=False):
    """create_block_mask for attention_with_kvcache with these arguments (the same page_table
    and seqused_k tensors: the mask is tied to their memory)."""
    where = "flashjit.create_block_mask_with_kvcache"
    hash_, tensors, pointers = _mask_user_inputs(where, user_functions, user_args)
    _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes, hash_,
                   tensors, where)
    engine, index = _engine(q.device)
    q_view, kv, out_view, options = _kv_structs(
        engine, q, k_cache, v_cache, q, page_table, seqused_k, bool(causal),
        _scale(softmax_scale), None, int(window_left), int(window_right), float(softcap),
        sink_logits, alibi_slopes, int(sink_tokens), 0, family, hash_, tensors, pointers, 0)
    return BlockMask(engine.create_block_mask_kv_raw(
        q_view, kv, out_view, options, same_for_all_heads, same_for_all_batches,
        _stream(index)), tensors)


# --- flashjit::attention_varlen: packed variable-length batches --------------------------------

@torch.library.custom_op(f"{_NAMESPACE}::attention_varlen", mutates_args=())
def _attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                      cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                      page_table: Optional[Tensor], seqused_k: Optional[Tensor], causal: bool,
                      softmax_scale: float, return_lse: bool, window_left: int,
                      window_right: int, softcap: float, sink_logits: Optional[Tensor],
                      alibi_slopes: Optional[Tensor], sink_tokens: int,
                      num_splits: int, family: Optional[str], user_functions: Optional[str],
                      user_args: List[Optional[Tensor]], user_pointers: List[int],
                      block_mask: int, deterministic: bool) -> Tuple[Tensor, Tensor]:
    # deterministic: the backward's, carried for the autograd formula as flashjit::attention
    # carries it (no default value, for the same reason).
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes, user_functions, user_args)
    engine, index = _engine(q.device)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse else None
    q_view, kv, out_view, varlen, options = _varlen_structs(
        engine, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, page_table,
        seqused_k, causal, softmax_scale, lse, window_left, window_right, softcap, sink_logits,
        alibi_slopes, sink_tokens, num_splits, family, user_functions, user_args, user_pointers,
        block_mask)
    _set_workspace(options, _workspace(q, engine.workspace_bytes_varlen_raw(
        q_view, kv, out_view, varlen, options)))
    engine.forward_varlen_raw(q_view, kv, out_view, varlen, options, _stream(index))
    return out, lse if lse is not None else _no_lse(q)


def _varlen_structs(engine, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    page_table, seqused_k, causal, softmax_scale, lse, window_left, window_right,
                    softcap, sink_logits, alibi_slopes, sink_tokens, num_splits, family,
                    user_functions, user_args, user_pointers, block_mask):
    """(q, kv, out, varlen, options) structs of a forward_varlen (and of its block mask)."""
    k_view, v_view = (_packed(k), _packed(v)) if page_table is None else (k, v)
    structs = engine.varlen_args(
        _packed(q), k_view, v_view, _packed(out), cu_seqlens_q, max_seqlen_q, cu_seqlens_k,
        max_seqlen_k, page_table, seqused_k, causal, softmax_scale, _lse_pointer(lse), family,
        num_splits, **_variants(window_left, window_right, softcap, sink_logits, alibi_slopes,
                                sink_tokens))
    _set_user(structs[-1], user_functions, user_args, user_pointers, block_mask)
    return structs


def _packed(t):
    # [total, heads, head_dim] -> the C API's [1, total, heads, head_dim].
    return t.unsqueeze(0)


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, page_table, seqused_k,
      causal, softmax_scale, return_lse, window_left, window_right, softcap, sink_logits,
      alibi_slopes, sink_tokens, num_splits, family, user_functions, user_args, user_pointers,
      block_mask, deterministic=False):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes, user_functions, user_args)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse \
        else _no_lse(q)
    return out, lse


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes, user_functions, user_args, where="flashjit.attention_varlen"):
    kv_dims = (3,) if page_table is None else (4,)
    _check_tensor("q", q, (3,), where)
    _check_tensor("k", k, kv_dims, where)
    _check_tensor("v", v, kv_dims, where)
    _check_tensor("cu_seqlens_q", cu_seqlens_q, (1,), where, (torch.int32,))
    if cu_seqlens_k is not None:
        _check_tensor("cu_seqlens_k", cu_seqlens_k, (1,), where, (torch.int32,))
    elif page_table is None:
        raise ValueError(f"{where}: cu_seqlens_k is None: a dense (packed) k/v needs it; pass "
                         "page_table for a paged cache")
    if page_table is not None:
        _check_tensor("page_table", page_table, (2,), where, (torch.int32,))
    if seqused_k is not None:
        _check_tensor("seqused_k", seqused_k, (1,), where, (torch.int32,))
    _check_same_device(where, q, ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                       ("cu_seqlens_k", cu_seqlens_k), ("page_table", page_table),
                       ("seqused_k", seqused_k), ("sink_logits", sink_logits),
                       ("alibi_slopes", alibi_slopes))
    _check_common(where, q, sink_logits, alibi_slopes, user_functions, user_args)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     page_table=None, seqused_k=None, causal=False, softmax_scale=None,
                     return_lse=False, window_left=-1, window_right=-1, softcap=0.0,
                     sink_logits=None, alibi_slopes=None, sink_tokens=0, num_splits=0, family=None,
                     user_functions=None, user_args=(), block_mask=None, deterministic=False):
    """Attention over a packed variable-length batch (flash_attn_varlen_func's layout).

    q: [total_q, heads_q, head_dim]; k/v: [total_k, heads_kv, head_dim] with cu_seqlens_k, or
    pages [num_pages, page_size, heads_kv, head_dim] with page_table (cu_seqlens_k None);
    cu_seqlens_*: int32 [batch + 1] offsets on the device; max_seqlen_*: Python ints bounding
    every length. Returns out [total_q, heads_q, head_dim] (and the LSE [heads_q, total_q]
    with return_lse=True). Other arguments as attention(); user functions see q_idx and kv_idx
    as positions within each sequence, batch as the sequence.

    Differentiable in q, k and v (and sink_logits) over a dense packed k/v
    (flashjit.attention_varlen_backward; every score variant and user functions as
    attention()'s, deterministic too); a backward through a forward with page_table or
    seqused_k, or a score_mod without score_mod_grad, raises NotImplementedError. The LSE is not
    differentiable."""
    user = _user_inputs("flashjit.attention_varlen", user_functions, user_args, block_mask)
    # The backward needs the LSE: a forward whose inputs want gradients keeps it.
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sink_logits))
    out, lse = torch.ops.flashjit.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), page_table,
        seqused_k, bool(causal), _scale(softmax_scale), bool(return_lse or needs_grad),
        int(window_left), int(window_right), float(softcap), sink_logits, alibi_slopes,
        sink_tokens, int(num_splits), family, *user, bool(deterministic))
    return (out, lse) if return_lse else out


def create_block_mask_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                             user_functions, user_args=(), page_table=None, seqused_k=None,
                             causal=False, softmax_scale=None, window_left=-1, window_right=-1,
                             softcap=0.0, sink_logits=None, alibi_slopes=None, sink_tokens=0,
                             family=None, same_for_all_heads=False):
    """create_block_mask for attention_varlen with these arguments (the same cu_seqlens_*,
    page_table and seqused_k tensors: the mask is tied to their memory). Sequences of different
    lengths have maps of their own: there is no same_for_all_batches here."""
    where = "flashjit.create_block_mask_varlen"
    hash_, tensors, pointers = _mask_user_inputs(where, user_functions, user_args)
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes, hash_, tensors, where)
    engine, index = _engine(q.device)
    structs = _varlen_structs(
        engine, q, k, v, q, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
        page_table, seqused_k, bool(causal), _scale(softmax_scale), None, int(window_left),
        int(window_right), float(softcap), sink_logits, alibi_slopes, int(sink_tokens), 0,
        family, hash_, tensors, pointers, 0)
    return BlockMask(engine.create_block_mask_varlen_raw(
        *structs, same_for_all_heads, False, _stream(index)), tensors)


# --- flashjit::merge_attention_states ----------------------------------------------------------

@torch.library.custom_op(f"{_NAMESPACE}::merge_attention_states", mutates_args=())
def _merge_attention_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor,
                            lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    _check_merge(out_a, lse_a, out_b, lse_b)
    engine, index = _engine(out_a.device)
    out = torch.empty_like(out_a, memory_format=torch.contiguous_format)
    lse = torch.empty_like(lse_a, memory_format=torch.contiguous_format)
    engine.merge_attention_states(out_a, lse_a.contiguous(), out_b, lse_b.contiguous(), out, lse,
                                  _stream(index))
    return out, lse


@_merge_attention_states.register_fake
def _(out_a, lse_a, out_b, lse_b):
    _check_merge(out_a, lse_a, out_b, lse_b)
    return (torch.empty_like(out_a, memory_format=torch.contiguous_format),
            torch.empty_like(lse_a, memory_format=torch.contiguous_format))


def _check_merge(out_a, lse_a, out_b, lse_b):
    where = "flashjit.merge_attention_states"
    _check_tensor("out_a", out_a, (4,), where)
    _check_tensor("out_b", out_b, (4,), where)
    _check_tensor("lse_a", lse_a, (3,), where, (torch.float32,))
    _check_tensor("lse_b", lse_b, (3,), where, (torch.float32,))
    _check_same_device(where, out_a, ("out_b", out_b), ("lse_a", lse_a), ("lse_b", lse_b))


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merges two partial attention results over disjoint key sets (cascade or ring attention,
    split-KV by hand): out_* [batch, seqlen, heads, head_dim], lse_* fp32 [batch, heads,
    seqlen] (as attention(return_lse=True) gives). Returns (out, lse) of the union."""
    return torch.ops.flashjit.merge_attention_states(out_a, lse_a, out_b, lse_b)


# --- autograd: flashjit.backward registers the formulas (attention's, attention_varlen's) -------

# The import registers them.
from .backward import attention_backward, attention_varlen_backward  # noqa: E402,F401
