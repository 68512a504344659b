"""The implementations a varlen case compares: its inputs (the packed batch and its dense twin),
flashjit_forward_varlen, and FlashAttention-4's flash_attn_varlen_func / flash_attn_func. The
dense flashjit call is backends' FlashjitRunner on the twin."""

import atexit
import shutil
import tempfile
from pathlib import Path

import flashjit_ctypes as fj

from . import gpu
from .family_spec import family_and_tiles
from .backends import make_inputs, select_variant
from .cases import Case
from .decode_backends import attach_workspace, poison_outputs
from .fa4 import _caller, _missing_keywords, _signature, load_fa4, refusal

SDPA_REASON = ("not run: SDPA takes no cu_seqlens, so it has no varlen call to time (its "
               "nested-tensor path is not measured here)")


def packed_case(case):
    """The packed batch as a Case: batch 1, total tokens, [1, total, h, d] tensors."""
    t = case.total()
    return Case(1, case.heads_q, case.heads_kv, t, t, case.head_dim, case.causal, case.dtype,
                "bshd", case.group)


def dense_twin(case):
    """batch x dense_seqlen(): the equal-length batch of about the same work."""
    n = case.dense_seqlen()
    return Case(case.batch, case.heads_q, case.heads_kv, n, n, case.head_dim, case.causal,
                case.dtype, "bshd", "varlen-dense")


def sequence_case(case, seqlen):
    """One sequence of the batch as a Case (what its fp32 reference is computed for)."""
    return Case(1, case.heads_q, case.heads_kv, seqlen, seqlen, case.head_dim, case.causal,
                case.dtype, "bshd", case.group)


class VarlenInputs:
    """Packed q [1, total, h_q, d], k, v [1, total, h_kv, d], fresh N(0, 1) (seed);
    cu_seqlens int32 [b + 1] on the device (queries and keys alike); the dense twin's
    q, k, v [b, n, h, d] (seed + 7919)."""

    def __init__(self, case, seed):
        import torch
        self.q, self.k, self.v = make_inputs(packed_case(case), seed)
        self.cu_seqlens = torch.tensor(case.cu_seqlens(), dtype=torch.int32, device=gpu.DEVICE)
        self.dense = dense_twin(case)
        self.dq, self.dk, self.dv = make_inputs(self.dense, seed + 7919)


def impl_names(case, families):
    """flashjit's implementations: the varlen call per --family ('flashjit' for auto), then the
    dense call on the twin (the dispatcher's choice)."""
    return ["flashjit" if f == "auto" else f"flashjit.{f}" for f in families] + ["flashjit_dense"]


def family_of(name):
    """(family or None, tiles or None) of a flashjit implementation name."""
    return family_and_tiles(name.split(".", 1)[1] if name.startswith("flashjit.") else "auto")


def varlen_variant_picks(engine, case, families):
    """{implementation: (variant, None) or (None, error)}. The C API names no varlen variant
    before the call (there is no select_variant for a varlen batch): (None, None), the variant
    being read at the first call (first_call_variants); a FlashjitLoadError for a build without
    flashjit_forward_varlen. The dense twin's through select_variant (so it is precompiled)."""
    picks = {}
    has_api = engine.owner.has_function("flashjit_forward_varlen")
    for name in impl_names(case, families)[:-1]:
        picks[name] = (None, None if has_api else fj.FlashjitLoadError(
            f"{engine.owner.path} predates flashjit_forward_varlen: rebuild libflashjit from "
            "this checkout"))
    picks["flashjit_dense"] = select_variant(engine, dense_twin(case), "auto")
    return picks


class FlashjitVarlenRunner:
    """flashjit_forward_varlen on the packed batch, structs built once; the split-KV workspace
    is the harness's own (flashjit_workspace_bytes_varlen of it), poisoned with the output."""

    def __init__(self, engine, case, inputs, name, scale, num_splits):
        import torch
        self.engine = engine
        self.out = torch.empty_like(inputs.q)
        self.lse = torch.empty(case.heads_q, case.total(), dtype=torch.float32,
                               device=gpu.DEVICE)
        self.args = engine.varlen_args(
            inputs.q, inputs.k, inputs.v, self.out, inputs.cu_seqlens, case.max_seqlen(),
            inputs.cu_seqlens, case.max_seqlen(), causal=case.causal, softmax_scale=scale,
            lse=self.lse, family=family_of(name)[0], tiles=family_of(name)[1],
            num_splits=num_splits)
        self.options = self.args[-1]
        size = engine.workspace_bytes_varlen_raw(*self.args)
        self.workspace = attach_workspace(self.options, size)
        self.stream = torch.cuda.current_stream().cuda_stream if gpu.DEVICE == "cuda" else None

    def poison(self):
        poison_outputs(self.out, self.lse, self.workspace)

    def __call__(self):
        self.engine.forward_varlen_raw(*self.args, self.stream)


_RECORD_DIR = []


def first_call_variants(engine, call):
    """call() with the engine's variant record (flashjit_engine_record) pointed at a fresh
    manifest: the variants it planned, i.e. what a varlen call ran (the C API cannot name it
    beforehand). None when this build cannot record. The record stays on (the C API cannot turn
    it off), pointed at that manifest, which nothing reads again; the folder goes at exit."""
    if not _RECORD_DIR:
        _RECORD_DIR.append(Path(tempfile.mkdtemp(prefix="flashjit-compare-")))
        atexit.register(shutil.rmtree, _RECORD_DIR[0], True)
    path = _RECORD_DIR[0] / f"first-call-{len(list(_RECORD_DIR[0].iterdir()))}.manifest"
    try:
        engine.record_variants(path)
    except (fj.FlashjitError, fj.FlashjitLoadError):
        call()
        return None
    call()
    text = path.read_text() if path.exists() else ""
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


class Fa4VarlenRunner:
    """FlashAttention-4 on a varlen case: flash_attn_varlen_func on the packed batch (q, k, v
    [total, h, d] views of flashjit's memory, cu_seqlens_q/k, max_seqlen_q/k), or (dense=True)
    flash_attn_func on the dense twin. .error says why not (import, signature, refusal); .out
    is the trial call's output (its first call compiles the kernel, ~2 s, not timed)."""

    VARLEN_KEYWORDS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                       "softmax_scale", "causal")

    def __init__(self, case, inputs, scale, dense=False, module=None):
        self.error, self.out, self.fn, self.how = None, None, None, ""
        module, self.error = load_fa4(module)
        if module is None:
            return
        varlen_fn, dense_fn = module.flash_attn_varlen_func, module.flash_attn_func
        causal = ", causal" if case.causal else ""
        if dense:
            fn, args = dense_fn, (inputs.dq, inputs.dk, inputs.dv)
            kwargs = dict(softmax_scale=scale, causal=case.causal)
            self.how = f"flash_attn_func on the dense twin, pack_gqa auto{causal}"
        else:
            fn, args = varlen_fn, (inputs.q[0], inputs.k[0], inputs.v[0])
            n = case.max_seqlen()
            kwargs = dict(cu_seqlens_q=inputs.cu_seqlens, cu_seqlens_k=inputs.cu_seqlens,
                          max_seqlen_q=n, max_seqlen_k=n, softmax_scale=scale,
                          causal=case.causal)
            self.how = ("flash_attn_varlen_func(cu_seqlens_q/k, max_seqlen_q/k), pack_gqa "
                        f"auto{causal}")
        missing = _missing_keywords(fn, tuple(kwargs))
        if missing:
            self.error = (f"{fn.__name__}{_signature(fn)} lacks {', '.join(missing)}: its API "
                          "differs from flash-attn-4 4.0.0b36's; update Fa4VarlenRunner")
            return
        call = _caller(fn, args, kwargs)
        try:
            out = call()
            gpu.sync()
        except Exception as e:  # FA4 refuses with assertions, TypeErrors and DSL errors
            self.error = f"refused: {refusal(e)}"
            return
        self.out = out if dense else out.unsqueeze(0)  # [1, total, h, d], as flashjit's
        self.fn = call

    def __call__(self):
        self.fn()
