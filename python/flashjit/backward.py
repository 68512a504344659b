"""Attention backward on torch tensors: the `flashjit::attention_backward` custom op over
flashjit_backward, and the autograd formulas of the forward ops (flashjit.ops imports this
module last; nothing else should).

flashjit.attention's formula saves q, k, v, out and the LSE (the forward keeps the LSE whenever
an input wants gradients) and runs attention_backward on them, so eager autograd, torch.compile
(AOTAutograd traces the op's fake implementation) and CUDA graphs of a training step all work.
What the C++ backward does not take yet raises NotImplementedError when a backward reaches it:
windows, soft-capping, sinks, ALiBi, user functions and block masks on the dense op, and every
varlen, KV-cache and merge op. The LSE output is not differentiable (as in FlashAttention).
"""

from typing import Tuple

import torch
from torch import Tensor

from .ops import (_NAMESPACE, _attention, _attention_kvcache, _attention_varlen,
                  _check_same_device, _check_tensor, _engine, _merge_attention_states, _scale,
                  _stream, _view)

# --- flashjit::attention_backward ---------------------------------------------------------------


@torch.library.custom_op(f"{_NAMESPACE}::attention_backward", mutates_args=())
def _attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor,
                        causal: bool, softmax_scale: float,
                        deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    _check_backward(q, k, v, out, dout, lse)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:
        # No row or no key: nothing to run, every gradient is zero.
        return dq.zero_(), dk.zero_(), dv.zero_()
    engine, index = _engine(q.device)
    # Autograd hands over what the loss made of dout: a broadcast (sum().backward()) or a
    # transpose. The library takes unit head_dim strides and positive multiples of 8 elsewhere;
    # a contiguous copy always qualifies.
    dout = dout.contiguous()
    lse = lse.contiguous()  # kept alive (named) until the launch: the library reads its pointer
    q_view, k_view, v_view = _view(q), _view(k), _view(v)
    options = engine.backward_options(causal, softmax_scale, deterministic)
    # Scratch from torch's allocator, so a CUDA graph capture owns it and the library never
    # allocates during one.
    size = engine.backward_workspace_bytes_raw(q_view, k_view, v_view, options)
    workspace = q.new_empty((size,), dtype=torch.uint8) if size else None
    if workspace is not None:
        options.workspace, options.workspace_bytes = workspace.data_ptr(), size
    engine.backward_raw(q_view, k_view, v_view, _view(out), _view(dout),
                        lse.data_ptr(), _view(dq), _view(dk), _view(dv), options,
                        _stream(index))
    return dq, dk, dv


@_attention_backward.register_fake
def _(q, k, v, out, dout, lse, causal, softmax_scale, deterministic):
    _check_backward(q, k, v, out, dout, lse)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


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
                       deterministic=False):
    """The gradients (dq, dk, dv) of out = flashjit.attention(q, k, v, causal=causal,
    softmax_scale=softmax_scale) for dout = dL/dout: what autograd runs for flashjit.attention,
    for callers who keep the forward's tensors themselves. lse: its fp32 LSE [batch, heads_q,
    seqlen_q] (return_lse=True). dq has q's shape, dk and dv k's and v's (with GQA/MQA summed over
    the query heads of each group); all contiguous. deterministic: bitwise repeatable gradients
    (dQ without atomics, about 1.4x the work). Not differentiable itself."""
    return torch.ops.flashjit.attention_backward(q, k, v, out, dout, lse, bool(causal),
                                                 _scale(softmax_scale), bool(deterministic))


# --- flashjit::attention's formula -------------------------------------------------------------

def _unsupported(window_left, window_right, softcap, sink_logits, alibi_slopes, sink_tokens,
                 user_functions, block_mask):
    """The forward's features the backward kernels do not take yet, by argument name."""
    names = []
    if (window_left, window_right) != (-1, -1):
        names.append("window_left / window_right")
    for name, used in (("softcap", softcap > 0), ("sink_logits", sink_logits is not None),
                       ("alibi_slopes", alibi_slopes is not None), ("sink_tokens", sink_tokens),
                       ("user_functions", user_functions is not None),
                       ("block_mask", block_mask)):
        if used:
            names.append(name)
    return names


def _setup_attention(ctx, inputs, output):
    (q, k, v, causal, softmax_scale, _return_lse, window_left, window_right, softcap,
     sink_logits, alibi_slopes, sink_tokens, family, user_functions, user_args, user_pointers,
     block_mask, deterministic) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.unsupported = _unsupported(window_left, window_right, softcap, sink_logits, alibi_slopes,
                                   sink_tokens, user_functions, block_mask)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    ctx.family = family
    # One gradient per input, in the inputs' own structure (a list for each list argument):
    # q, k, v get theirs, every other argument None.
    ctx.no_gradients = [[None] * len(x) if isinstance(x, list) else None for x in inputs]
    if not ctx.unsupported:
        ctx.save_for_backward(q, k, v, out, lse)


def _attention_grad(ctx, dout, _dlse):
    if ctx.unsupported:
        raise NotImplementedError(
            f"flashjit.attention's backward does not take {', '.join(ctx.unsupported)} yet: "
            "flashjit's backward kernels cover dense attention with causal and softmax_scale "
            "(GQA, seqlen_q != seqlen_k, bf16/fp16). Detach the inputs, or run it under "
            "torch.no_grad(), where gradients are not needed")
    q, k, v, out, lse = ctx.saved_tensors
    if lse.numel() == 0 and q.numel() != 0:
        # torch.ops.flashjit.attention called directly with return_lse=False: the forward again
        # for the LSE (flashjit.attention never needs this).
        _, lse = torch.ops.flashjit.attention(q, k, v, ctx.causal, ctx.softmax_scale, True, -1,
                                              -1, 0.0, None, None, 0, ctx.family, None, [], [],
                                              0, False)
    dq, dk, dv = torch.ops.flashjit.attention_backward(q, k, v, out, dout, lse, ctx.causal,
                                                       ctx.softmax_scale, ctx.deterministic)
    return (dq, dk, dv) + tuple(ctx.no_gradients[3:])


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
