"""flashjit's attention on torch tensors: torch.library custom ops over the C API (ctypes).

Each entry point is a custom op (`torch.ops.flashjit.*`) with a fake implementation, so
torch.compile(fullgraph=True) traces through it, and runs on torch's current stream, so CUDA
graph capture records it. Outputs are allocated by torch's caching allocator (graph-pool aware);
split-KV scratch too, so the library never allocates during a capture.

Forward only: flashjit has no backward kernels yet. The ops register an autograd formula that
raises NotImplementedError when a backward reaches them (the forward itself runs with inputs
that require grad, e.g. evaluation without torch.no_grad()); under torch.compile, AOTAutograd
traces that backward when an input requires grad, so the error comes at compile time.

Bad input raises flashjit.InvalidArgumentError (a ValueError) with the library's message;
CPU tensors raise ValueError before anything reaches the library.
"""

import ctypes
import math
import struct
import threading
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _capi, library

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


def _check_common(where, sink_logits, alibi_slopes):
    if sink_logits is not None:
        _check_tensor("sink_logits", sink_logits, (1,), where, (torch.float32,))
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, (1,), where, (torch.float32,))


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


# FlashjitTensor's bytes packed by struct and copied in: 0.5 us, where the ctypes constructor
# takes 2.3 us (H200 host). The format mirrors the ctypes struct, and is checked against it here.
_TENSOR = struct.Struct("=Qi4x4q4q")
_T = _capi.FlashjitTensor
assert (_TENSOR.size, _T.dtype.offset, _T.shape.offset, _T.stride.offset) == \
    (ctypes.sizeof(_T), 8, 16, 48), "flashjit.ops._TENSOR no longer matches FlashjitTensor"


def _view(t):
    # tensor_from_torch without its checks (done by the caller).
    return _T.from_buffer_copy(_TENSOR.pack(t.data_ptr(), _CODES[t.dtype], *t.shape,
                                            *t.stride()))


_templates = {}


def _dense_options(engine, causal, softmax_scale, lse, window_left, window_right, softcap,
                   sink_logits, alibi_slopes, sink_tokens, family):
    """engine.options() for these arguments, built once per distinct set and copied per call
    (a copy is one memcpy; building costs microseconds); only the LSE pointer differs."""
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
    options = _capi.FlashjitForwardOptions.from_buffer_copy(template)
    if lse is not None:
        ctypes.c_void_p.from_buffer(options, _LSE_OFFSET).value = lse.data_ptr()
    return options


# --- flashjit::attention: dense [batch, seqlen, heads, head_dim] --------------------------------

def _run_attention(q, k, v, causal, softmax_scale, return_lse, window_left, window_right,
                   softcap, sink_logits, alibi_slopes, sink_tokens, family):
    """(out, lse or None): the forward itself."""
    # The common case checked in one expression; anything else gets _check_attention's message.
    device = q.device
    if not (q.is_cuda and k.device == device and v.device == device and q.dim() == 4
            and k.dim() == 4 and v.dim() == 4 and q.dtype in _CODES and k.dtype in _CODES
            and v.dtype in _CODES and sink_logits is None
            and alibi_slopes is None):
        _check_attention(q, k, v, sink_logits, alibi_slopes)
    engine, index = _engine(device)
    # empty_like is twice as fast as new_empty(shape); out has q's shape (one head_dim).
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=device) \
        if return_lse else None
    engine.forward_raw(_view(q), _view(k), _view(v), _view(out),
                       _dense_options(engine, causal, softmax_scale, lse, window_left,
                                      window_right, softcap, sink_logits, alibi_slopes,
                                      sink_tokens, family),
                       _stream(index))
    return out, lse


@torch.library.custom_op(f"{_NAMESPACE}::attention", mutates_args=())
def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float,
               return_lse: bool, window_left: int, window_right: int, softcap: float,
               sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor], sink_tokens: int,
               family: Optional[str]) -> Tuple[Tensor, Tensor]:
    out, lse = _run_attention(q, k, v, causal, softmax_scale, return_lse, window_left,
                              window_right, softcap, sink_logits, alibi_slopes, sink_tokens, family)
    return out, lse if lse is not None else _no_lse(q)


@_attention.register_fake
def _(q, k, v, causal, softmax_scale, return_lse, window_left, window_right, softcap,
      sink_logits, alibi_slopes, sink_tokens, family):
    _check_attention(q, k, v, sink_logits, alibi_slopes)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else _no_lse(q)
    return out, lse


def _check_attention(q, k, v, sink_logits, alibi_slopes):
    where = "flashjit.attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, (4,), where)
    _check_same_device(where, q, ("k", k), ("v", v), ("sink_logits", sink_logits),
                       ("alibi_slopes", alibi_slopes))
    _check_common(where, sink_logits, alibi_slopes)


def attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, window_left=-1,
              window_right=-1, softcap=0.0, sink_logits=None, alibi_slopes=None, sink_tokens=0,
              family=None):
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
    family: force a kernel family (e.g. 'mma'); None for the dispatcher's choice."""
    args = (q, k, v, bool(causal), _scale(softmax_scale), bool(return_lse), int(window_left),
            int(window_right), float(softcap), sink_logits, alibi_slopes, sink_tokens, family)
    out, lse = _run_attention(*args) if _eager(q, k, v, sink_logits, alibi_slopes) else \
        torch.ops.flashjit.attention(*args)
    return (out, lse) if return_lse else out


# --- flashjit::attention_kvcache: dense or paged KV cache (decode, chunked prefill) -------------

@torch.library.custom_op(f"{_NAMESPACE}::attention_kvcache", mutates_args=())
def _attention_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Optional[Tensor],
                       seqused_k: Optional[Tensor], causal: bool, softmax_scale: float,
                       return_lse: bool, window_left: int, window_right: int, softcap: float,
                       sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor],
                       sink_tokens: int, num_splits: int,
                       family: Optional[str]) -> Tuple[Tensor, Tensor]:
    _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes)
    engine, index = _engine(q.device)
    out = q.new_empty(q.shape[:-1] + v_cache.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else None
    q_view, kv, out_view, options = engine.kv_args(
        q, k_cache, v_cache, out, page_table, seqused_k, causal, softmax_scale, _lse_pointer(lse),
        family, num_splits=num_splits, **_variants(window_left, window_right, softcap,
                                                   sink_logits, alibi_slopes, sink_tokens))
    workspace = _workspace(q, engine.workspace_bytes_raw(q_view, kv, out_view, options)[0])
    _set_workspace(options, workspace)
    engine.forward_kv_raw(q_view, kv, out_view, options, _stream(index))
    return out, lse if lse is not None else _no_lse(q)


def _workspace(q, size):
    # Split-KV scratch from torch's allocator, so a CUDA graph capture owns it (None: no split).
    return q.new_empty((size,), dtype=torch.uint8) if size else None


@_attention_kvcache.register_fake
def _(q, k_cache, v_cache, page_table, seqused_k, causal, softmax_scale, return_lse, window_left,
      window_right, softcap, sink_logits, alibi_slopes, sink_tokens, num_splits, family):
    _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes)
    out = q.new_empty(q.shape[:-1] + v_cache.shape[-1:])
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) \
        if return_lse else _no_lse(q)
    return out, lse


def _check_kvcache(q, k_cache, v_cache, page_table, seqused_k, sink_logits, alibi_slopes):
    where = "flashjit.attention_with_kvcache"
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, (4,), where)
    if page_table is not None:
        _check_tensor("page_table", page_table, (2,), where, (torch.int32,))
    if seqused_k is not None:
        _check_tensor("seqused_k", seqused_k, (1,), where, (torch.int32,))
    _check_same_device(where, q, ("k_cache", k_cache), ("v_cache", v_cache),
                       ("page_table", page_table), ("seqused_k", seqused_k),
                       ("sink_logits", sink_logits), ("alibi_slopes", alibi_slopes))
    _check_common(where, sink_logits, alibi_slopes)


def attention_with_kvcache(q, k_cache, v_cache, *, page_table=None, seqused_k=None, causal=False,
                           softmax_scale=None, return_lse=False, window_left=-1, window_right=-1,
                           softcap=0.0, sink_logits=None, alibi_slopes=None, sink_tokens=0,
                           num_splits=0, family=None):
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
        alibi_slopes, sink_tokens,
        int(num_splits), family)
    return (out, lse) if return_lse else out


# --- flashjit::attention_varlen: packed variable-length batches --------------------------------

@torch.library.custom_op(f"{_NAMESPACE}::attention_varlen", mutates_args=())
def _attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                      cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                      page_table: Optional[Tensor], seqused_k: Optional[Tensor], causal: bool,
                      softmax_scale: float, return_lse: bool, window_left: int,
                      window_right: int, softcap: float, sink_logits: Optional[Tensor],
                      alibi_slopes: Optional[Tensor], sink_tokens: int,
                      num_splits: int, family: Optional[str]) -> Tuple[Tensor, Tensor]:
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes)
    engine, index = _engine(q.device)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse else None
    k_view, v_view = (_packed(k), _packed(v)) if page_table is None else (k, v)
    q_view, kv, out_view, varlen, options = engine.varlen_args(
        _packed(q), k_view, v_view, _packed(out), cu_seqlens_q, max_seqlen_q, cu_seqlens_k,
        max_seqlen_k, page_table, seqused_k, causal, softmax_scale, _lse_pointer(lse), family,
        num_splits, **_variants(window_left, window_right, softcap, sink_logits, alibi_slopes,
                                sink_tokens))
    _set_workspace(options, _workspace(q, engine.workspace_bytes_varlen_raw(
        q_view, kv, out_view, varlen, options)))
    engine.forward_varlen_raw(q_view, kv, out_view, varlen, options, _stream(index))
    return out, lse if lse is not None else _no_lse(q)


def _packed(t):
    # [total, heads, head_dim] -> the C API's [1, total, heads, head_dim].
    return t.unsqueeze(0)


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, page_table, seqused_k,
      causal, softmax_scale, return_lse, window_left, window_right, softcap, sink_logits,
      alibi_slopes, sink_tokens,
      num_splits, family):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse \
        else _no_lse(q)
    return out, lse


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, sink_logits,
                  alibi_slopes):
    where = "flashjit.attention_varlen"
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
    _check_common(where, sink_logits, alibi_slopes)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     page_table=None, seqused_k=None, causal=False, softmax_scale=None,
                     return_lse=False, window_left=-1, window_right=-1, softcap=0.0,
                     sink_logits=None, alibi_slopes=None, sink_tokens=0, num_splits=0, family=None):
    """Attention over a packed variable-length batch (flash_attn_varlen_func's layout).

    q: [total_q, heads_q, head_dim]; k/v: [total_k, heads_kv, head_dim] with cu_seqlens_k, or
    pages [num_pages, page_size, heads_kv, head_dim] with page_table (cu_seqlens_k None);
    cu_seqlens_*: int32 [batch + 1] offsets on the device; max_seqlen_*: Python ints bounding
    every length. Returns out [total_q, heads_q, head_dim] (and the LSE [heads_q, total_q]
    with return_lse=True). Other arguments as attention()."""
    out, lse = torch.ops.flashjit.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), page_table,
        seqused_k, bool(causal), _scale(softmax_scale), bool(return_lse), int(window_left),
        int(window_right), float(softcap), sink_logits, alibi_slopes, sink_tokens,
        int(num_splits), family)
    return (out, lse) if return_lse else out


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


# --- no backward yet ---------------------------------------------------------------------------

def _no_backward(name):
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"flashjit.{name} has no backward: flashjit's backward kernels do not exist yet "
            "(forward only). Run it under torch.no_grad() / torch.inference_mode(), or detach "
            "its inputs")
    return backward


def _setup_context(ctx, inputs, output):
    pass


for _op, _name in ((_attention, "attention"), (_attention_kvcache, "attention_with_kvcache"),
                   (_attention_varlen, "attention_varlen"),
                   (_merge_attention_states, "merge_attention_states")):
    _op.register_autograd(_no_backward(_name), setup_context=_setup_context)
