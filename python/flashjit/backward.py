"""Attention backward on torch tensors: the `flashjit::attention_backward` custom op over
flashjit_backward, and the autograd formulas of the forward ops (flashjit.ops imports this
module last; nothing else should).

flashjit.attention's formula saves q, k, v, out and the LSE (the forward keeps the LSE whenever
an input wants gradients) and runs attention_backward on them, so eager autograd, torch.compile
(AOTAutograd traces the op's fake implementation) and CUDA graphs of a training step all work.
Windows, soft-capping, ALiBi and sinks (the sink logits get their gradient) go to the backward
kernels' variants. What the C++ backward does not take yet raises NotImplementedError when a
backward reaches it: user functions and block masks on the dense op, and every varlen, KV-cache
and merge op. The LSE output is not differentiable (as in FlashAttention).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .ops import (_NAMESPACE, _attention, _attention_kvcache, _attention_varlen,
                  _check_same_device, _check_tensor, _engine, _merge_attention_states, _scale,
                  _stream, _view)

# --- flashjit::attention_backward ---------------------------------------------------------------


@torch.library.custom_op(f"{_NAMESPACE}::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                        causal: bool, softmax_scale: float, deterministic: bool, softcap: float,
                        window_left: int, window_right: int, sink_tokens: int,
                        sink_logits: Optional[Tensor], alibi_slopes: Optional[Tensor]
                        ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
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
      window_right, sink_tokens, sink_logits, alibi_slopes):
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
                       sink_logits=None, alibi_slopes=None, sink_tokens=0):
    """The gradients (dq, dk, dv) of out = flashjit.attention(q, k, v, causal=causal,
    softmax_scale=softmax_scale, ...) for dout = dL/dout: what autograd runs for
    flashjit.attention, for callers who keep the forward's tensors themselves. lse: its fp32 LSE
    [batch, heads_q, seqlen_q] (return_lse=True). dq has q's shape, dk and dv k's and v's (with
    GQA/MQA summed over the query heads of each group); all contiguous. deterministic: bitwise
    repeatable gradients (dQ without atomics, about 1.4x the work). window_left, window_right,
    softcap, sink_logits, alibi_slopes, sink_tokens: the forward's; with sink_logits the result
    is (dq, dk, dv, dsink), dsink fp32 [heads_q] the sink logits' gradient. Not differentiable
    itself."""
    dq, dk, dv, dsink = torch.ops.flashjit.attention_backward(
        q, k, v, out, dout, lse, bool(causal), _scale(softmax_scale), bool(deterministic),
        float(softcap), int(window_left), int(window_right), int(sink_tokens), sink_logits,
        alibi_slopes)
    return (dq, dk, dv, dsink) if sink_logits is not None else (dq, dk, dv)


# --- flashjit::attention's formula -------------------------------------------------------------

def _unsupported(user_functions, block_mask):
    """The forward's features the backward kernels do not take yet, by argument name."""
    return [name for name, used in (("user_functions", user_functions is not None),
                                    ("block_mask", block_mask)) if used]

_SINK_INPUT = 9  # the index of sink_logits among flashjit::attention's inputs


def _setup_attention(ctx, inputs, output):
    (q, k, v, causal, softmax_scale, _return_lse, window_left, window_right, softcap,
     sink_logits, alibi_slopes, sink_tokens, family, user_functions, user_args, user_pointers,
     block_mask, deterministic) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.unsupported = _unsupported(user_functions, block_mask)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    ctx.family = family
    ctx.window, ctx.softcap, ctx.sink_tokens = (window_left, window_right), softcap, sink_tokens
    # One gradient per input, in the inputs' own structure (a list for each list argument):
    # q, k, v get theirs, every other argument None.
    ctx.no_gradients = [[None] * len(x) if isinstance(x, list) else None for x in inputs]
    if not ctx.unsupported:
        ctx.save_for_backward(q, k, v, out, lse, sink_logits, alibi_slopes)


def _attention_grad(ctx, dout, _dlse):
    if ctx.unsupported:
        raise NotImplementedError(
            f"flashjit.attention's backward does not take {', '.join(ctx.unsupported)} yet: "
            "flashjit's backward kernels cover dense attention with causal, softmax_scale, "
            "windows, soft-capping, sinks and ALiBi (GQA, seqlen_q != seqlen_k, bf16/fp16). "
            "Detach the inputs, or run it under torch.no_grad(), where gradients are not needed")
    q, k, v, out, lse, sink_logits, alibi_slopes = ctx.saved_tensors
    window_left, window_right = ctx.window
    if lse.numel() == 0 and q.numel() != 0:
        # torch.ops.flashjit.attention called directly with return_lse=False: the forward again
        # for the LSE (flashjit.attention never needs this).
        _, lse = torch.ops.flashjit.attention(q, k, v, ctx.causal, ctx.softmax_scale, True,
                                              window_left, window_right, ctx.softcap,
                                              sink_logits, alibi_slopes, ctx.sink_tokens,
                                              ctx.family, None, [], [], 0, False)
    dq, dk, dv, dsink = torch.ops.flashjit.attention_backward(
        q, k, v, out, dout, lse, ctx.causal, ctx.softmax_scale, ctx.deterministic, ctx.softcap,
        window_left, window_right, ctx.sink_tokens, sink_logits, alibi_slopes)
    gradients = [dq, dk, dv] + list(ctx.no_gradients[3:])
    if sink_logits is not None:
        gradients[_SINK_INPUT] = dsink.to(sink_logits.dtype)
    return tuple(gradients)


_attention.register_autograd(_attention_grad, setup_context=_setup_attention)


# --- the ops without a backward ------------------------------------------------------------------

def _no_backward(name, why):
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"flashjit.{name} has no backward: {why}. Run it under torch.no_grad() / "
            "torch.inference_mode(), or detach its inputs")
    return backward


def _no_context(ctx, inputs, output):
    pass


_NOT_YET = ("flashjit's backward kernels take dense batches of equal-length sequences "
            "(flashjit.attention); varlen, KV-cache (dense or paged) and merge backward are not "
            "implemented yet")
for _op, _name, _why in (
        (_attention_kvcache, "attention_with_kvcache", _NOT_YET),
        (_attention_varlen, "attention_varlen", _NOT_YET),
        (_merge_attention_states, "merge_attention_states", _NOT_YET),
        (_attention_backward, "attention_backward", "double backward (gradients of gradients) "
                                                    "is not implemented")):
    _op.register_autograd(_no_backward(_name, _why), setup_context=_no_context)
