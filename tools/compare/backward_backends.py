"""The sides of a backward comparison on one case: inputs (q, k, v that want gradients, and
dout), flashjit's backward through the ctypes binding (Engine.backward_raw from its own
forward's out and LSE), and SDPA's and FA4's backward through autograd
(torch.autograd.grad(out, inputs, dout, retain_graph=True) on the output of their forward, so
the backward alone repeats)."""

from types import SimpleNamespace

import flashjit_ctypes as fj

from . import gpu
from .backends import FlashjitRunner, SdpaRunner, fake_view, make_inputs
from .backward_cases import parse_config
from .fa4 import Fa4Runner, refusal

DOUT_SEED_OFFSET = 104729  # dout's seed: the case's seed plus this (q, k, v use the case's)


class BackwardInputs:
    """q, k, v (contiguous [b, s, h, d], N(0, 1), leaves that want gradients: the peers'
    autograd graphs start at them) and dout (N(0, 1), q's shape), seeded per case."""

    def __init__(self, case, seed):
        import torch
        self.q, self.k, self.v = (t.requires_grad_(True) for t in make_inputs(case, seed))
        gen = torch.Generator(device=gpu.DEVICE)
        gen.manual_seed(seed + DOUT_SEED_OFFSET)
        self.dout = torch.empty_like(self.q, requires_grad=False)
        self.dout.normal_(generator=gen)

    def detached(self):
        return tuple(t.detach() for t in (self.q, self.k, self.v))


def _views(tensors):
    return [fj.tensor_from_torch(t) for t in tensors]


def backward_variant_picks(engine, case, configs):
    """{config: (dK/dV variant name, None) or (None, why not)} of one backward case, without
    touching memory (made-up aligned pointers, as backends.select_variant). why not: a
    FlashjitError (the library refused), a FlashjitLoadError (a build without the backward
    API) or a ValueError (a family the binding does not know)."""
    picks = {}
    q, k = fake_view(case, case.seqlen_q, case.heads_q), fake_view(case, case.seqlen_k,
                                                                   case.heads_kv)
    for config in configs:
        family, tiles, det = parse_config(config)
        try:
            options = engine.backward_options(case.causal, 0.0, det, family, tiles)
            picks[config] = (engine.select_backward_variant_raw(q, k, k, options), None)
        except (fj.FlashjitError, fj.FlashjitLoadError, ValueError) as e:
            picks[config] = (None, e)
    return picks


class FlashjitForward:
    """flashjit's forward of the case, once, for the out and LSE its backward reads (the
    dispatcher's family; not timed)."""

    def __init__(self, engine, case, inputs, scale):
        q, k, v = inputs.detached()
        self.runner = FlashjitRunner(engine, case, q, k, v, "auto", scale)
        self.runner()
        gpu.sync()
        self.out, self.lse = self.runner.out, self.runner.lse


class FlashjitBackwardRunner:
    """flashjit_backward for one case and configuration ('FAMILY[@MxNxS][+det]'), structs and
    workspace built once so a call is one C call: dq, dk, dv contiguous like q, k, v; the
    workspace the harness's own (flashjit_backward_workspace_bytes), so nothing is allocated
    while timed."""

    def __init__(self, engine, case, inputs, forward, config, scale):
        import torch
        family, tiles, det = parse_config(config)
        self.engine = engine
        q, k, v = inputs.detached()
        self.dq, self.dk, self.dv = (torch.empty_like(t) for t in (q, k, v))
        # The structs hold raw pointers: keep what they point at alive with the runner.
        self.forward, self.tensors = forward, (q, k, v, forward.out, inputs.dout)
        self.views = _views(self.tensors)
        self.grad_views = _views((self.dq, self.dk, self.dv))
        self.lse = forward.lse.data_ptr()
        self.options = engine.backward_options(case.causal, scale, det, family, tiles)
        size = engine.backward_workspace_bytes_raw(*self.views[:3], self.options)
        self.workspace = torch.empty(size, dtype=torch.uint8, device=gpu.DEVICE) if size \
            else None
        if self.workspace is not None:
            self.options.workspace = self.workspace.data_ptr()
            self.options.workspace_bytes = size
        self.stream = torch.cuda.current_stream().cuda_stream if gpu.DEVICE == "cuda" else None

    def poison(self):
        """NaN in dq, dk, dv and 0xff bytes in the workspace: a gradient the kernels forget to
        write, or a dQ accumulator they forget to zero, fails the check."""
        for t in (self.dq, self.dk, self.dv):
            t.fill_(float("nan"))
        if self.workspace is not None:
            self.workspace.fill_(255)

    def gradients(self):
        return self.dq, self.dk, self.dv

    def __call__(self):
        q, k, v, out, dout = self.views
        self.engine.backward_raw(q, k, v, out, dout, self.lse, *self.grad_views, self.options,
                                 self.stream)


class AutogradBackward:
    """The backward of a peer's forward output `out` through autograd: each call is
    torch.autograd.grad(out, inputs, dout, retain_graph=True), dout laid out like out (the
    peer's own layout: no copy inside the timed call). .error: why the trial call failed."""

    def __init__(self, out, inputs, dout):
        import torch
        self.out, self.inputs, self.error, self.trial = out, tuple(inputs), None, None
        self.dout = torch.empty_like(out)  # out's strides (empty_like keeps them)
        self.dout.copy_(dout)
        if out.grad_fn is None:
            self.error = "its output carries no autograd graph (no backward)"
            return
        try:
            self.trial = self()
            gpu.sync()
        except Exception as e:  # a backend may refuse the backward only (RuntimeError, ...)
            self.error = "backward refused: " + refusal(e)

    def __call__(self):
        import torch
        return torch.autograd.grad(self.out, self.inputs, self.dout, retain_graph=True)


def sdpa_gradients(case, grads, gqa_mode):
    """SDPA's (dq, dk, dv) [b, h, s, d] as [b, s, h, d] views; K/V expanded with
    repeat_interleave: summed back over each group's query heads (what dk, dv of the h_kv heads
    are)."""
    dq, dk, dv = (g.transpose(1, 2) for g in grads)
    if gqa_mode == "repeat_interleave":
        g = case.heads_q // case.heads_kv
        dk, dv = (t.reshape(case.batch, case.seqlen_k, case.heads_kv, g, case.head_dim).sum(3)
                  for t in (dk, dv))
    return dq, dk, dv


class SdpaBackwardRunner:
    """SDPA's backward on one backend: its forward (backends.SdpaRunner, the bottom-right mask
    only, the same memory through .transpose(1, 2) views, GQA through enable_gqa or
    repeat_interleave) under sdpa_kernel, then autograd's backward of that output (the backend's
    own backward kernels). .error when it refuses the forward or the backward."""

    def __init__(self, backend, case, inputs, scale):
        self.forward = SdpaRunner(backend, case, inputs.q, inputs.k, inputs.v, scale, "same",
                                  bottom_right_only=True)
        self.error, self.backward, self.notes = self.forward.error, None, self.forward.notes
        if self.error:
            return
        self.backward = AutogradBackward(self.forward.out, self.forward.inputs,
                                         inputs.dout.transpose(1, 2))
        self.error = self.backward.error
        self.forward.out = None

    def gradients(self, case):
        return sdpa_gradients(case, self.backward.trial, self.forward.gqa_mode)

    def drop_trial(self):
        if self.backward:
            self.backward.trial = None

    def __call__(self):
        self.backward()


class Fa4BackwardRunner:
    """FlashAttention-4's backward: flash_attn_func's forward (fa4.Fa4Runner, on the same
    q, k, v; GQA with h_kv heads; causal bottom-right), then autograd's backward of its output
    (FA4's own backward kernels; on sm90 its one fused kernel plus the small passes). .error
    when FA4 is missing or refuses the forward or the backward. module: a stand-in."""

    def __init__(self, case, inputs, scale, module=None):
        self.forward = Fa4Runner(case, SimpleNamespace(q=inputs.q, k=inputs.k, v=inputs.v),
                                 scale, module)
        self.error, self.backward, self.how = self.forward.error, None, self.forward.how
        if self.error:
            return
        # "copy": Fa4Runner's contiguous copies (made from q, k, v) are in the graph; the
        # gradients are taken at q, k, v, so the copies' backward is in the timed call.
        self.backward = AutogradBackward(self.forward.out, (inputs.q, inputs.k, inputs.v),
                                         inputs.dout)
        self.error = self.backward.error
        self.forward.out = None

    def gradients(self, case):
        return self.backward.trial

    def drop_trial(self):
        if self.backward:
            self.backward.trial = None

    def __call__(self):
        self.backward()
