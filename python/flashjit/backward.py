"""Attention backward on torch tensors: the `flashjit::attention_backward` custom op over
flashjit_backward, `flashjit::attention_varlen_backward` over flashjit_backward_varlen, and the
autograd formulas of the forward ops (flashjit.ops imports this module last; nothing else
should).

flashjit.attention's formula saves q, k, v, out and the LSE (the forward keeps the LSE whenever
an input wants gradients) and runs attention_backward on them, so eager autograd, torch.compile
(AOTAutograd traces the op's fake implementation) and CUDA graphs of a training step all work.
flashjit.attention_varlen's does the same over a dense packed k/v (cu_seqlens_q / cu_seqlens_k
saved too) with attention_varlen_backward. Windows, soft-capping, ALiBi, sinks (the sink
logits get their gradient) and user functions (a score_mod with its score_mod_grad) go to the
backward kernels' variants; a block_mask made with create_block_mask(backward=True) lets
attention's backward skip the tiles its mask_mod hides (without, or for attention_varlen, the
backward evaluates the mask_mod score by score on every tile). What the C++ backward does not take raises NotImplementedError when a
backward reaches it: a score_mod without score_mod_grad, a paged cache or seqused_k on the
varlen op, and the KV-cache and merge ops. The LSE output is not differentiable (as in
FlashAttention).
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi
from .ops import (_NAMESPACE, _attention, _attention_kvcache, _attention_varlen,
                  _block_masks, _check_same_device, _check_tensor, _engine,
                  _merge_attention_states, _packed, _scale, _set_user, _stream, _user_inputs,
                  _view)
from .user_functions import registered

# --- flashjit::attention_backward ---------------------------------------------------------------


@torch.library.custom_op(f"{_NAMESPACE}::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                        causal: bool, softmax_scale: float, deterministic: bool, softcap: float,
                        window_left: int, window_right: int, sink_tokens: int,
                        sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor],
                        user_functions: Optional[str], user_args: List[Optional[Tensor]],
                        user_pointers: List[int],
                        block_mask: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_backward(q, k, v, out, dout, lse)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    # The sink logits' gradient, fp32 [heads_q] (empty without sinks: an op returns tensors).
    dsink = lse.new_empty((q.shape[2] if sink_logits is not None else 0,))
    if q.numel() == 0 or k.numel() == 0:
        # No row or no key: nothing to run, every gradient is zero.
        return dq.zero_(), dk.zero_(), dv.zero_(), dsink.zero_()
    engine, index = _engine(q.device)
    # Autograd hands over what the loss made of dout: a broadcast (sum().backward()) or a
    # transpose. The library takes unit head_dim strides and positive multiples of 8 elsewhere;
    # a contiguous copy always qualifies.
    dout = dout.contiguous()
    lse = lse.contiguous()  # kept alive (named) until the launch: the library reads its pointer
    q_view, k_view, v_view = _view(q), _view(k), _view(v)
    sink_logits = sink_logits.contiguous() if sink_logits is not None else None
    alibi_slopes = alibi_slopes.contiguous() if alibi_slopes is not None else None
    options = engine.backward_options(causal, softmax_scale, deterministic, softcap=softcap,
                                      window=(window_left, window_right), sink=sink_logits,
                                      alibi=alibi_slopes, sink_tokens=sink_tokens,
                                      d_sink=dsink if sink_logits is not None else None)
    _set_user(options, user_functions, user_args, user_pointers, 0)
    # A BlockMask (by id) made with backward=True: its backward maps; one without (or gone: the
    # autograd context keeps the forward's alive): none, the mask_mod score by score.
    mask = _block_masks.get(int(block_mask)) if block_mask else None
    backward_maps = mask._backward if mask is not None else None
    if backward_maps is not None:
        options.block_mask = backward_maps.pointer
    # Scratch from torch's allocator, so a CUDA graph capture owns it and the library never
    # allocates during one.
    size = engine.backward_workspace_bytes_raw(q_view, k_view, v_view, options)
    workspace = q.new_empty((size,), dtype=torch.uint8) if size else None
    if workspace is not None:
        options.workspace, options.workspace_bytes = workspace.data_ptr(), size
    engine.backward_raw(q_view, k_view, v_view, _view(out), _view(dout),
                        lse.data_ptr(), _view(dq), _view(dk), _view(dv), options,
                        _stream(index))
    return dq, dk, dv, dsink


@_attention_backward.register_fake
def _(q, k, v, out, dout, lse, causal, softmax_scale, deterministic, softcap, window_left,
      window_right, sink_tokens, sink_logits, alibi_slopes, user_functions, user_args,
      user_pointers, block_mask=0):
    _check_backward(q, k, v, out, dout, lse)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (q, k, v)) + (lse.new_empty((q.shape[2] if sink_logits is not None
                                                       else 0,)),)


def _check_backward(q, k, v, out, dout, lse, where="flashjit.attention_backward"):
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        _check_tensor(name, t, (4,), where)
    _check_tensor("lse", lse, (3,), where, (torch.float32,))
    for name, t in (("out", out), ("dout", dout)):
        if t.shape != q.shape:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}: expected q's "
                             f"{tuple(q.shape)}")
    expected = (q.shape[0], q.shape[2], q.shape[1])
    if lse.shape != expected:
        raise ValueError(f"{where}: lse has shape {tuple(lse.shape)}: expected {expected} "
                         "([batch, heads_q, seqlen_q], what attention(return_lse=True) gives)")
    _check_same_device(where, q, ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse))


def attention_backward(q, k, v, out, dout, lse, *, causal=False, softmax_scale=None,
                       deterministic=False, window_left=-1, window_right=-1, softcap=0.0,
                       sink_logits=None, alibi_slopes=None, sink_tokens=0, user_functions=None,
                       user_args=(), block_mask=None):
    """The gradients (dq, dk, dv) of out = flashjit.attention(q, k, v, causal=causal,
    softmax_scale=softmax_scale, ...) for dout = dL/dout: what autograd runs for
    flashjit.attention, for callers who keep the forward's tensors themselves. lse: its fp32 LSE
    [batch, heads_q, seqlen_q] (return_lse=True). dq has q's shape, dk and dv k's and v's (with
    GQA/MQA summed over the query heads of each group); all contiguous. deterministic: bitwise
    repeatable gradients (dQ without atomics, about 1.4x the work). window_left, window_right,
    softcap, sink_logits, alibi_slopes, sink_tokens, user_functions, user_args: the forward's (a
    score_mod needs its score_mod_grad); with sink_logits the result is (dq, dk, dv, dsink),
    dsink fp32 [heads_q] the sink logits' gradient. block_mask: a flashjit.BlockMask made by
    create_block_mask(..., backward=True, deterministic=deterministic) for these arguments: the
    backward skips the tiles its mask_mod hides (the same gradients). Not differentiable
    itself."""
    hash_, tensors, pointers, mask_id = _user_inputs("flashjit.attention_backward",
                                                     user_functions, user_args, block_mask)
    dq, dk, dv, dsink = torch.ops.flashjit.attention_backward(
        q, k, v, out, dout, lse, bool(causal), _scale(softmax_scale), bool(deterministic),
        float(softcap), int(window_left), int(window_right), int(sink_tokens), sink_logits,
        alibi_slopes, hash_, tensors, pointers, mask_id)
    return (dq, dk, dv, dsink) if sink_logits is not None else (dq, dk, dv)


# --- flashjit::attention_varlen_backward ---------------------------------------------------------


@torch.library.custom_op(f"{_NAMESPACE}::attention_varlen_backward", mutates_args=())
def _attention_varlen_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor,
                               lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                               max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                               softmax_scale: float, deterministic: bool, softcap: float,
                               window_left: int, window_right: int, sink_tokens: int,
                               sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor],
                               user_functions: Optional[str], user_args: List[Optional[Tensor]],
                               user_pointers: List[int]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k)
    # Zeroed: the library writes no row past cu_seqlens_q[batch] of dq nor past
    # cu_seqlens_k[batch] of dk and dv (padding after the last sequence gets no gradient).
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dsink = lse.new_zeros((q.shape[1] if sink_logits is not None else 0,))
    if q.numel() == 0 or k.numel() == 0 or cu_seqlens_q.numel() <= 1:
        # No row, no key or no sequence: nothing to run, every gradient is zero.
        return dq, dk, dv, dsink
    engine, index = _engine(q.device)
    # As _attention_backward: dout in a layout the library takes, the LSE named until the
    # launch (it reads the pointers), and so the offsets.
    dout = dout.contiguous()
    lse = lse.contiguous()
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    q_view, k_view, v_view = _view(_packed(q)), _view(_packed(k)), _view(_packed(v))
    sink_logits = sink_logits.contiguous() if sink_logits is not None else None
    alibi_slopes = alibi_slopes.contiguous() if alibi_slopes is not None else None
    varlen = _capi.make_varlen(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                               cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k)
    options = engine.backward_options(causal, softmax_scale, deterministic, softcap=softcap,
                                      window=(window_left, window_right), sink=sink_logits,
                                      alibi=alibi_slopes, sink_tokens=sink_tokens,
                                      d_sink=dsink if sink_logits is not None else None)
    _set_user(options, user_functions, user_args, user_pointers, 0)
    # Scratch from torch's allocator (a CUDA graph capture owns it), as _attention_backward.
    size = engine.backward_workspace_bytes_varlen_raw(q_view, k_view, v_view, varlen, options)
    workspace = q.new_empty((size,), dtype=torch.uint8) if size else None
    if workspace is not None:
        options.workspace, options.workspace_bytes = workspace.data_ptr(), size
    engine.backward_varlen_raw(q_view, k_view, v_view, _view(_packed(out)),
                               _view(_packed(dout)), lse.data_ptr(), _view(_packed(dq)),
                               _view(_packed(dk)), _view(_packed(dv)), varlen, options,
                               _stream(index))
    return dq, dk, dv, dsink


@_attention_varlen_backward.register_fake
def _(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
      softmax_scale, deterministic, softcap, window_left, window_right, sink_tokens, sink_logits,
      alibi_slopes, user_functions, user_args, user_pointers):
    _check_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (q, k, v)) + (lse.new_empty((q.shape[1] if sink_logits is not None
                                                       else 0,)),)


def _check_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k,
                           where="flashjit.attention_varlen_backward"):
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        _check_tensor(name, t, (3,), where)
    _check_tensor("lse", lse, (2,), where, (torch.float32,))
    _check_offsets(cu_seqlens_q, cu_seqlens_k, where)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_tensor(name, t, (1,), where, (torch.int32,))
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(f"{where}: cu_seqlens_k has {cu_seqlens_k.shape[0]} entries, "
                         f"cu_seqlens_q {cu_seqlens_q.shape[0]}: expected batch + 1 each")
    for name, t in (("out", out), ("dout", dout)):
        if t.shape != q.shape:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}: expected q's "
                             f"{tuple(q.shape)}")
    expected = (q.shape[1], q.shape[0])
    if lse.shape != expected:
        raise ValueError(f"{where}: lse has shape {tuple(lse.shape)}: expected {expected} "
                         "([heads_q, total_q], what attention_varlen(return_lse=True) gives)")
    _check_same_device(where, q, ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse),
                       ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k))


def _check_offsets(cu_seqlens_q, cu_seqlens_k, where="flashjit.attention_varlen_backward"):
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t is None:
            raise ValueError(f"{where}: {name} is None: the varlen backward takes a dense packed "
                             "k/v with both offsets (no paged cache)")


def attention_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, *, causal=False, softmax_scale=None,
                              deterministic=False, window_left=-1, window_right=-1, softcap=0.0,
                              sink_logits=None, alibi_slopes=None, sink_tokens=0,
                              user_functions=None, user_args=()):
    """The gradients (dq, dk, dv) of out = flashjit.attention_varlen(q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, ...) over a dense packed k/v, for
    dout = dL/dout: what autograd runs for flashjit.attention_varlen. q, out, dout: [total_q,
    heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim]; lse: the forward's fp32 [heads_q,
    total_q] (return_lse=True); cu_seqlens_*: the forward's int32 [batch + 1] offsets. dq has
    q's shape, dk and dv k's and v's (GQA/MQA summed over each group's query heads); all
    contiguous, zero in rows past the last sequence and for a sequence with no query or no key.
    Other arguments as attention_backward's; with sink_logits the result is (dq, dk, dv,
    dsink). Not differentiable itself."""
    _check_offsets(cu_seqlens_q, cu_seqlens_k)  # before the op's schema refuses a None
    hash_, tensors, pointers, _ = _user_inputs("flashjit.attention_varlen_backward",
                                               user_functions, user_args, None)
    dq, dk, dv, dsink = torch.ops.flashjit.attention_varlen_backward(
        q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
        int(max_seqlen_k), bool(causal), _scale(softmax_scale), bool(deterministic),
        float(softcap), int(window_left), int(window_right), int(sink_tokens), sink_logits,
        alibi_slopes, hash_, tensors, pointers)
    return (dq, dk, dv, dsink) if sink_logits is not None else (dq, dk, dv)


# --- flashjit::attention's formula -------------------------------------------------------------

def _unsupported(user_functions):
    """The forward's features the backward kernels cannot take, by argument name: a score_mod
    without its derivative. (A block mask changes no result: the backward runs the mask_mod score
    by score instead.)"""
    if user_functions is not None and not registered(user_functions).differentiable:
        return ["user_functions with a score_mod but no score_mod_grad"]
    return []


def _save_user(ctx, user_functions, user_args, user_pointers):
    """Keeps the user functions' hash and pointers on ctx; returns the user_args tensors to save
    (the ones that are set), _saved_user_args puts them back in their places."""
    ctx.user_functions, ctx.user_pointers = user_functions, list(user_pointers)
    ctx.user_slots = [i for i, t in enumerate(user_args) if t is not None]
    ctx.user_count = len(user_args)
    return [user_args[i] for i in ctx.user_slots]


def _saved_user_args(ctx, saved):
    user_args = [None] * ctx.user_count
    for slot, tensor in zip(ctx.user_slots, saved):
        user_args[slot] = tensor
    return user_args


_SINK_INPUT = 9  # the index of sink_logits among flashjit::attention's inputs


def _no_gradients(inputs):
    """One None per input in the structure torch's custom-op autograd checks the gradients
    against (measured with torch 2.11): a list of Nones for a list of tensors only (an empty
    list too), one None for anything else, a list holding an int or a None included (user_args
    with an absent entry, user_pointers), which it takes as one leaf."""
    def tensor_list(x):
        return isinstance(x, list) and all(isinstance(e, Tensor) for e in x)
    return [[None] * len(x) if tensor_list(x) else None for x in inputs]


def _setup_attention(ctx, inputs, output):
    (q, k, v, causal, softmax_scale, _return_lse, window_left, window_right, softcap,
     sink_logits, alibi_slopes, sink_tokens, family, user_functions, user_args, user_pointers,
     block_mask, deterministic) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.unsupported = _unsupported(user_functions)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    # The mask's backward maps (made with backward=True) go on to the backward; ctx keeps the
    # mask alive until then.
    ctx.block_mask = block_mask
    ctx.block_mask_object = _block_masks.get(int(block_mask)) if block_mask else None
    ctx.family = family
    ctx.window, ctx.softcap, ctx.sink_tokens = (window_left, window_right), softcap, sink_tokens
    ctx.no_gradients = _no_gradients(inputs)
    if not ctx.unsupported:
        ctx.save_for_backward(q, k, v, out, lse, sink_logits, alibi_slopes,
                              *_save_user(ctx, user_functions, user_args, user_pointers))


def _attention_grad(ctx, dout, _dlse):
    if ctx.unsupported:
        raise NotImplementedError(
            f"flashjit.attention's backward does not take {', '.join(ctx.unsupported)}: the "
            "backward of a score_mod needs its derivative, flashjit.UserFunctions(score_mod=..., "
            "score_mod_grad=...). Detach the inputs, or run it under torch.no_grad(), where "
            "gradients are not needed")
    q, k, v, out, lse, sink_logits, alibi_slopes, *saved_user = ctx.saved_tensors
    user = (ctx.user_functions, _saved_user_args(ctx, saved_user), ctx.user_pointers)
    window_left, window_right = ctx.window
    if lse.numel() == 0 and q.numel() != 0:
        # torch.ops.flashjit.attention called directly with return_lse=False: the forward again
        # for the LSE (flashjit.attention never needs this).
        _, lse = torch.ops.flashjit.attention(q, k, v, ctx.causal, ctx.softmax_scale, True,
                                              window_left, window_right, ctx.softcap,
                                              sink_logits, alibi_slopes, ctx.sink_tokens,
                                              ctx.family, *user, 0, False)
    dq, dk, dv, dsink = torch.ops.flashjit.attention_backward(
        q, k, v, out, dout, lse, ctx.causal, ctx.softmax_scale, ctx.deterministic, ctx.softcap,
        window_left, window_right, ctx.sink_tokens, sink_logits, alibi_slopes, *user,
        ctx.block_mask)
    gradients = [dq, dk, dv] + list(ctx.no_gradients[3:])
    if sink_logits is not None:
        gradients[_SINK_INPUT] = dsink.to(sink_logits.dtype)
    return tuple(gradients)


_attention.register_autograd(_attention_grad, setup_context=_setup_attention)


# --- flashjit::attention_varlen's formula --------------------------------------------------------

_VARLEN_SINK_INPUT = 15  # the index of sink_logits among flashjit::attention_varlen's inputs


def _setup_attention_varlen(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, page_table, seqused_k,
     causal, softmax_scale, _return_lse, window_left, window_right, softcap, sink_logits,
     alibi_slopes, sink_tokens, num_splits, family, user_functions, user_args, user_pointers,
     _block_mask, deterministic) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.unsupported = [name for name, used in (("page_table", page_table is not None),
                                               ("seqused_k", seqused_k is not None))
                       if used] + _unsupported(user_functions)
    ctx.max_seqlen = (max_seqlen_q, max_seqlen_k)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    ctx.num_splits, ctx.family = num_splits, family
    ctx.window, ctx.softcap, ctx.sink_tokens = (window_left, window_right), softcap, sink_tokens
    ctx.no_gradients = _no_gradients(inputs)
    if not ctx.unsupported:
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sink_logits,
                              alibi_slopes,
                              *_save_user(ctx, user_functions, user_args, user_pointers))


def _attention_varlen_grad(ctx, dout, _dlse):
    if ctx.unsupported:
        raise NotImplementedError(
            f"flashjit.attention_varlen's backward does not take {', '.join(ctx.unsupported)}: "
            "flashjit's varlen backward covers a dense packed k/v (cu_seqlens_k, no page_table "
            "or seqused_k) with causal, softmax_scale, windows, soft-capping, sinks, ALiBi and "
            "user functions (a score_mod with its score_mod_grad). Detach the inputs, or run it "
            "under torch.no_grad(), where gradients are not needed")
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sink_logits, alibi_slopes,
     *saved_user) = ctx.saved_tensors
    user = (ctx.user_functions, _saved_user_args(ctx, saved_user), ctx.user_pointers)
    max_seqlen_q, max_seqlen_k = ctx.max_seqlen
    window_left, window_right = ctx.window
    if lse.numel() == 0 and q.numel() != 0:
        # torch.ops.flashjit.attention_varlen called directly with return_lse=False: the forward
        # again for the LSE (flashjit.attention_varlen never needs this).
        _, lse = torch.ops.flashjit.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None,
            ctx.causal, ctx.softmax_scale, True, window_left, window_right, ctx.softcap,
            sink_logits, alibi_slopes, ctx.sink_tokens, ctx.num_splits, ctx.family, *user, 0,
            False)
    dq, dk, dv, dsink = torch.ops.flashjit.attention_varlen_backward(
        q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        ctx.causal, ctx.softmax_scale, ctx.deterministic, ctx.softcap, window_left, window_right,
        ctx.sink_tokens, sink_logits, alibi_slopes, *user)
    gradients = [dq, dk, dv] + list(ctx.no_gradients[3:])
    if sink_logits is not None:
        gradients[_VARLEN_SINK_INPUT] = dsink.to(sink_logits.dtype)
    return tuple(gradients)


_attention_varlen.register_autograd(_attention_varlen_grad, setup_context=_setup_attention_varlen)


# --- the ops without a backward ------------------------------------------------------------------

def _no_backward(name, why):
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"flashjit.{name} has no backward: {why}. Run it under torch.no_grad() / "
            "torch.inference_mode(), or detach its inputs")
    return backward


def _no_context(ctx, inputs, output):
    pass


_NOT_YET = ("flashjit's backward kernels take dense batches (flashjit.attention) and packed "
            "variable-length batches over a dense packed k/v (flashjit.attention_varlen); "
            "KV-cache (dense or paged) and merge backward are not implemented yet")
_DOUBLE = "double backward (gradients of gradients) is not implemented"
for _op, _name, _why in (
        (_attention_kvcache, "attention_with_kvcache", _NOT_YET),
        (_merge_attention_states, "merge_attention_states", _NOT_YET),
        (_attention_backward, "attention_backward", _DOUBLE),
        (_attention_varlen_backward, "attention_varlen_backward", _DOUBLE)):
    _op.register_autograd(_no_backward(_name, _why), setup_context=_no_context)
