#!/usr/bin/env python3
"""flashjit vs PyTorch SDPA (cuDNN and flash backends), side by side on one GPU.

For each case: fresh random inputs; flashjit's output (and LSE) checked against a float32
reference computed with torch on the same inputs; then flashjit, SDPA-cuDNN and SDPA-flash timed
with CUDA events, repetitions interleaved round-robin, medians compared.

    LD_LIBRARY_PATH=.devpack python3 tools/compare_sdpa.py --lib .devpack/libflashjit.so.0 \
        --grid standard --out $OUT/compare

docs/compare.md explains the columns, the tolerances and the timing method.
Needs torch (CUDA) and numpy/matplotlib (plots only); --list-cases and --dry-run need neither a GPU
nor torch. Exit status: 0 all checks passed, 1 some check failed, 2 the run could not start.
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashjit_ctypes as fj  # noqa: E402  (the binding lives beside this script)

SCHEMA = "flashjit-compare-sdpa/1"
FAMILIES = fj.FAMILIES  # the optimization ladder, first kernel first
SDPA_BACKENDS = ("cudnn", "flash")
SDPA_LABELS = {"cudnn": "SDPA cuDNN", "flash": "SDPA flash"}

# Pass bounds against the float32 reference; docs/compare.md explains them. rel is the relative
# L2 error, abs the max abs error per unit of output magnitude (rounding error is relative, so the
# bound grows with max|ref| once that exceeds 1). The numbers are those of the C++ GPU tests
# (tests/support/forward_case.cpp), so the harness and the test suite agree on what passes.
TOLERANCES = {
    "bf16": {"rel": 1.2e-2, "abs": 2.5e-2},
    "fp16": {"rel": 3e-3, "abs": 5e-3},
}
LSE_TOLERANCE = 1e-3  # natural-log units; expected error ~1e-5 (fp32 all the way)

DEFAULT_CHECK_BUDGET = 1 << 33  # score elements (rows x keys x heads) the reference may compute
REFERENCE_CHUNK = 1 << 27       # score elements per reference step (512 MiB of fp32)
REFERENCE_SELF_TOLERANCE = 1e-4  # our fp32 reference vs SDPA's fp32 math backend

# Hooks that a CPU-only self-test replaces (the real run uses CUDA throughout).
DEVICE = "cuda"


def sync():
    import torch
    torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"
    layout: str = "bshd"
    group: str = field(default="case", compare=False)  # which part of a grid it belongs to

    def key(self):
        """The --case spelling: b,hq,hkv,sq,sk,d,causal,dtype,layout."""
        return (f"{self.batch},{self.heads_q},{self.heads_kv},{self.seqlen_q},{self.seqlen_k},"
                f"{self.head_dim},{int(self.causal)},{self.dtype},{self.layout}")

    def label(self):
        heads = f"h{self.heads_q}" + (f":{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        seq = f"s{self.seqlen_q}" + (f":{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else "")
        return (f"b{self.batch} {heads} {seq} d{self.head_dim} {self.dtype} {self.layout}"
                + (" causal" if self.causal else ""))

    def flops(self):
        """The FlashAttention convention: 4*b*h*s_q*s_k*d, halved for causal (what TFLOPS uses)."""
        f = 4 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return f // 2 if self.causal else f

    def visible_pairs(self):
        """(query, key) pairs the bottom-right causal mask lets through, per (batch, head)."""
        if not self.causal:
            return self.seqlen_q * self.seqlen_k
        offset = self.seqlen_k - self.seqlen_q
        return sum(min(self.seqlen_k, max(0, i + offset + 1)) for i in range(self.seqlen_q))

    def flops_exact(self):
        return 4 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim

    def causal_aligned_same(self):
        """Whether top-left (PyTorch is_causal) and bottom-right (ours) masks coincide."""
        return not self.causal or self.seqlen_q == self.seqlen_k

    def fields(self):
        return {"batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
                "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "head_dim": self.head_dim,
                "causal": self.causal, "dtype": self.dtype, "layout": self.layout,
                "group": self.group}


def parse_case(text):
    """'b,hq,hkv,sq,sk,d,causal,dtype,layout' (dtype and layout optional: bf16, bshd)."""
    parts = [p.strip() for p in text.split(",")]
    usage = (f"--case {text!r}: expected b,hq,hkv,sq,sk,d,causal[,dtype[,layout]] e.g. "
             "2,32,8,4096,4096,128,1,bf16,bshd")
    if not 7 <= len(parts) <= 9:
        raise ValueError(usage)
    try:
        b, hq, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise ValueError(usage) from None
    causal_words = {"1": True, "true": True, "causal": True, "yes": True,
                    "0": False, "false": False, "full": False, "no": False, "nc": False}
    if parts[6].lower() not in causal_words:
        raise ValueError(f"{usage}; causal is 0/1/true/false, got {parts[6]!r}")
    dtype = parts[7].lower() if len(parts) > 7 else "bf16"
    layout = parts[8].lower() if len(parts) > 8 else "bshd"
    if dtype not in TOLERANCES:
        raise ValueError(f"{usage}; dtype is bf16 or fp16, got {dtype!r}")
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"{usage}; layout is bshd or bhsd, got {layout!r}")
    if min(b, hq, hkv, sq, sk, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    return Case(b, hq, hkv, sq, sk, d, causal_words[parts[6].lower()], dtype, layout, "case")


def standard_grid():
    """FlashAttention's benchmark grid: batch*seqlen = 16k tokens, hidden 2048, bf16, BSHD."""
    cases = []
    for causal in (False, True):
        for d in (64, 128, 256):
            heads = 2048 // d
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                cases.append(Case(16384 // s, heads, heads, s, s, d, causal, "bf16", "bshd",
                                  "standard"))
    return cases


def features_grid():
    """What the standard grid leaves out: GQA, s_q != s_k, ragged seqlens, BHSD, fp16, 64k."""
    cases = []

    def add(group, b, hq, hkv, sq, sk, d, causals=(False, True), dtype="bf16", layout="bshd"):
        for c in causals:
            cases.append(Case(b, hq, hkv, sq, sk, d, c, dtype, layout, group))

    add("gqa", 4, 32, 8, 4096, 4096, 128)
    add("gqa", 4, 64, 8, 4096, 4096, 128)
    add("gqa", 2, 64, 8, 8192, 8192, 64, causals=(True,))
    # s_q < s_k: chunked prefill against a cache; s_q > s_k: causal rows that see no key;
    # s_q = 1: decode.
    add("sq!=sk", 8, 16, 16, 512, 4096, 128)
    add("sq!=sk", 2, 16, 16, 4096, 1024, 128)
    add("sq!=sk", 64, 32, 8, 1, 8192, 128, causals=(False,))
    # seqlens that are not multiples of any tile size
    add("ragged", 4, 16, 16, 1000, 1000, 128)
    add("ragged", 2, 32, 32, 4097, 4097, 64)
    add("ragged", 2, 8, 8, 3001, 3001, 256)
    add("ragged", 3, 16, 16, 777, 1531, 128, causals=(True,))
    # the same problem in both layouts
    add("layout", 4, 16, 16, 4096, 4096, 128, layout="bshd")
    add("layout", 4, 16, 16, 4096, 4096, 128, layout="bhsd")
    add("layout", 2, 32, 8, 4096, 4096, 128, causals=(True,), layout="bhsd")
    # fp16 (including GQA, which some cuDNN versions refuse in fp16)
    add("fp16", 4, 32, 32, 4096, 4096, 64, dtype="fp16")
    add("fp16", 4, 16, 16, 4096, 4096, 128, dtype="fp16")
    add("fp16", 4, 8, 8, 4096, 4096, 256, causals=(True,), dtype="fp16")
    add("fp16", 4, 32, 8, 4096, 4096, 128, causals=(True,), dtype="fp16")
    # long context last: the slowest cases, so a deadline cuts them first
    add("long", 1, 16, 16, 65536, 65536, 128, causals=(True, False))
    return cases


GRIDS = {"standard": standard_grid, "features": features_grid}


def build_cases(grids, case_texts, limit=None):
    cases = []
    for name in grids:
        cases.extend(GRIDS[name]())
    cases.extend(parse_case(t) for t in case_texts)
    if not cases:
        cases = standard_grid()
    if limit:
        cases = cases[:limit]
    return cases


def parse_families(text):
    """'auto' (the dispatcher's pick), 'all' (every family, ladder order) or a comma list."""
    names = []
    for token in (t.strip().lower() for t in text.split(",")):
        if token == "all":
            names.extend(FAMILIES)
        elif token == "auto" or token in FAMILIES:
            names.append(token)
        else:
            raise ValueError(f"--family {text!r}: expected auto, all, or any of "
                             f"{', '.join(FAMILIES)} (comma-separated)")
    ordered = [n for n in ("auto",) + FAMILIES if n in names]
    return ordered


# --------------------------------------------------------------------------------------------
# Tensors and the flashjit side
# --------------------------------------------------------------------------------------------

def torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def alloc_bshd(case, seqlen, heads, dtype, layout):
    """An uninitialized [b, s, h, d] view: contiguous (BSHD) or a transposed [b, h, s, d]."""
    import torch
    if layout == "bshd":
        return torch.empty(case.batch, seqlen, heads, case.head_dim, dtype=dtype, device=DEVICE)
    return torch.empty(case.batch, heads, seqlen, case.head_dim, dtype=dtype,
                       device=DEVICE).transpose(1, 2)


def make_inputs(case, seed):
    """Fresh N(0, 1) q, k, v (seeded per case, so a run can be repeated) as [b, s, h, d] views."""
    import torch
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed)
    dtype = torch_dtype(case.dtype)
    tensors = []
    for seqlen, heads in ((case.seqlen_q, case.heads_q), (case.seqlen_k, case.heads_kv),
                          (case.seqlen_k, case.heads_kv)):
        t = alloc_bshd(case, seqlen, heads, dtype, case.layout)
        t.normal_(generator=gen)
        tensors.append(t)
    return tensors


def fake_view(case, seqlen, heads):
    """A FlashjitTensor with a made-up aligned pointer: select_variant never dereferences it."""
    b, d = case.batch, case.head_dim
    if case.layout == "bshd":
        stride = (seqlen * heads * d, heads * d, d, 1)
    else:
        stride = (heads * seqlen * d, d, seqlen * d, 1)
    return fj.make_tensor(1 << 20, case.dtype, (b, seqlen, heads, d), stride)


def select_variant(engine, case, family):
    """(variant name, None) or (None, FlashjitError) for one case and family ('auto': None)."""
    q = fake_view(case, case.seqlen_q, case.heads_q)
    k = fake_view(case, case.seqlen_k, case.heads_kv)
    try:
        name = engine.select_variant(q, k, k, q, causal=case.causal,
                                     family=None if family == "auto" else family)
        return name, None
    except fj.FlashjitError as e:
        return None, e


class FlashjitRunner:
    """flashjit forward for one case and family, structs built once so calls stay cheap."""

    def __init__(self, engine, case, q, k, v, family, scale):
        import torch
        self.engine = engine
        self.out = alloc_bshd(case, case.seqlen_q, case.heads_q, q.dtype, case.layout)
        self.lse = torch.empty(case.batch, case.heads_q, case.seqlen_q, dtype=torch.float32,
                               device=DEVICE)
        self.views = [fj.tensor_from_torch(t) for t in (q, k, v, self.out)]
        self.options = engine.options(case.causal, scale, self.lse.data_ptr(),
                                      None if family == "auto" else family)
        # torch's current stream (the legacy default stream unless the caller set one), so
        # flashjit's launches and the CUDA events that time them share one stream.
        self.stream = torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else None

    def poison(self):
        """NaN everywhere: a row the kernel forgets to write fails the check."""
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))

    def __call__(self):
        self.engine.forward_raw(*self.views, self.options, self.stream)


# --------------------------------------------------------------------------------------------
# The SDPA side
# --------------------------------------------------------------------------------------------

def _warning_reasons(caught, limit=400):
    seen = []
    for w in caught:
        text = " ".join(str(w.message).split())
        if text and text not in seen:
            seen.append(text)
    return "; ".join(seen)[:limit]


class SdpaRunner:
    """torch SDPA on one backend, or .error when the backend refuses the case.

    Tries, in order, what a user would: the same memory as flashjit seen as [b, h, s, d]
    (.transpose(1, 2) views), then contiguous [b, h, s, d] copies (first with --sdpa-layout bhsd);
    GQA through enable_gqa=True, then K/V expanded with repeat_interleave. Copies and expansions
    are made here, never timed. For causal with s_q != s_k it prefers the bottom-right mask we use
    (flash: torch's causal_lower_right, which runs the flash kernel), else is_causal=True, which
    PyTorch documents as top-left: marked so, unless the check shows it computed bottom-right."""

    def __init__(self, backend, case, q, k, v, scale, layout_mode):
        from torch.nn.attention import SDPBackend
        self.backend = backend
        self.case = case
        self.scale = scale
        self.sdpa_backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                             "flash": SDPBackend.FLASH_ATTENTION}[backend]
        self.notes = []
        self.error = None
        self.mask = None            # 'is_causal', 'lower_right' or None
        self.mask_alignment = None  # 'bottom-right' / 'top-left' when causal
        self.gqa_mode = None        # 'enable_gqa' / 'repeat_interleave' for GQA cases
        self.layout = None          # 'same' / 'bhsd'
        self.out = None             # output of the trial call, [b, h, s_q, d]
        self.fn = None

        group = case.heads_q // case.heads_kv
        layouts = ["same", "bhsd"] if layout_mode == "same" else ["bhsd"]
        masks = ["none"]
        if case.causal:
            masks = ["is_causal"]
            if not case.causal_aligned_same():
                masks = (["lower_right"] if backend == "flash" else []) + ["is_causal"]
        kv_modes = ["enable_gqa", "repeat_interleave"] if group > 1 else ["none"]

        refusals = []
        for layout in layouts:
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
            if layout == "bhsd":
                qs, ks, vs = (t.contiguous() for t in (qs, ks, vs))
            for mask in masks:
                for kv_mode in kv_modes:
                    kx, vx = ks, vs
                    if kv_mode == "repeat_interleave":
                        kx = ks.repeat_interleave(group, dim=1)
                        vx = vs.repeat_interleave(group, dim=1)
                    attempt = f"{layout}/{mask}/{kv_mode}"
                    fn = self._make_fn(qs, kx, vx, mask, kv_mode == "enable_gqa")
                    if fn is None:
                        refusals.append(f"{attempt}: not available")
                        continue
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        try:
                            out = fn()
                            sync()
                        except (RuntimeError, TypeError, ValueError) as e:
                            reason = _warning_reasons(caught) or " ".join(str(e).split())[:400]
                            refusals.append(f"{attempt}: {reason}")
                            continue
                    self._accept(fn, out, layout, mask, kv_mode, layout_mode, refusals)
                    return
        self.error = " | ".join(refusals) or "refused"

    def _accept(self, fn, out, layout, mask, kv_mode, layout_mode, refusals):
        case = self.case
        self.fn, self.out, self.layout = fn, out, layout
        self.gqa_mode = kv_mode if case.heads_q != case.heads_kv else None
        self.mask = mask if case.causal else None
        if case.causal:
            top_left = mask == "is_causal" and not case.causal_aligned_same()
            self.mask_alignment = "top-left" if top_left else "bottom-right"
        if kv_mode == "repeat_interleave":
            self.notes.append("K/V expanded with repeat_interleave (not timed)")
        if self.mask_alignment == "top-left":
            self.notes.append("timed with is_causal=True: top-left mask, other work than ours, "
                              "ratio left out of the geomeans")
        if layout == "bhsd":
            self.notes.append("contiguous [b,h,s,d] copies (not timed)" +
                              ("" if layout_mode == "bhsd" else "; the same-memory views were "
                               "refused"))
        self.refusals = refusals

    def verified_bottom_right(self):
        """The check found the is_causal output equal to our bottom-right reference."""
        self.mask_alignment = "bottom-right"
        self.notes = [n for n in self.notes if not n.startswith("timed with is_causal")]
        self.notes.append("is_causal=True computed the bottom-right mask here (output checked)")

    def _make_fn(self, qs, ks, vs, mask_name, enable_gqa):
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel
        backend, scale = self.sdpa_backend, self.scale
        kwargs = {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        if mask_name == "is_causal":
            kwargs["is_causal"] = True
        elif mask_name == "lower_right":
            try:
                from torch.nn.attention.bias import causal_lower_right
            except ImportError:
                return None
            # causal_lower_right falls back to mem-efficient or a materialized mask when flash
            # cannot run; require that flash can, so this cell really times the flash kernel.
            if not _flash_can_run(qs, ks, vs, enable_gqa):
                return None
            kwargs["attn_mask"] = causal_lower_right(qs.shape[-2], ks.shape[-2])

        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qs, ks, vs, **kwargs)
        return call

    def __call__(self):
        self.fn()


def _flash_can_run(q, k, v, enable_gqa):
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention
        try:
            params = SDPAParams(q, k, v, None, 0.0, False, enable_gqa)
        except TypeError:  # torch before enable_gqa
            params = SDPAParams(q, k, v, None, 0.0, False)
        return bool(can_use_flash_attention(params, False))
    except (ImportError, RuntimeError, TypeError):
        return False


# --------------------------------------------------------------------------------------------
# Correctness: float32 reference
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def ieee_fp32_matmul():
    """fp32 matmuls in full fp32 (no TF32) while the reference runs, whatever the defaults."""
    import torch
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        old = m.fp32_precision
        m.fp32_precision = "ieee"
        try:
            yield
        finally:
            m.fp32_precision = old
    else:
        old = m.allow_tf32
        m.allow_tf32 = False
        try:
            yield
        finally:
            m.allow_tf32 = old


def plan_check(case, budget):
    """Which (batch, head) pairs and query-row ranges the reference covers.

    Everything when b*h_q*s_q*s_k <= budget; else (batch, head) pairs spread evenly over all of
    them, first and last included, all rows; else, when even one head is over
    budget, the first, middle and last blocks of query rows of the first and last head."""
    total_pairs = case.batch * case.heads_q
    per_pair = case.seqlen_q * case.seqlen_k
    all_rows = [(0, case.seqlen_q)]
    if per_pair * total_pairs <= budget:
        pairs = [(b, h) for b in range(case.batch) for h in range(case.heads_q)]
        return pairs, all_rows, "all heads, all rows"
    n = budget // per_pair
    if n >= 1:
        n = min(n, total_pairs)
        flat = sorted({round(i * (total_pairs - 1) / max(1, n - 1)) for i in range(n)})
        pairs = [(i // case.heads_q, i % case.heads_q) for i in flat]
        return pairs, all_rows, f"{len(pairs)} of {total_pairs} (batch, head) pairs, all rows"
    pairs = sorted({(0, 0), (case.batch - 1, case.heads_q - 1)})
    rows_total = max(3, budget // (case.seqlen_k * len(pairs)))
    block = max(1, rows_total // 3)
    mid = case.seqlen_q // 2 - block // 2
    rows = _merge_ranges([(0, block), (mid, mid + block),
                          (case.seqlen_q - block, case.seqlen_q)], case.seqlen_q)
    n_rows = sum(r1 - r0 for r0, r1 in rows)
    return pairs, rows, (f"{len(pairs)} of {total_pairs} (batch, head) pairs, "
                         f"{n_rows} of {case.seqlen_q} rows (first, middle, last)")


def _merge_ranges(ranges, limit):
    out = []
    for r0, r1 in sorted((max(0, a), min(limit, b)) for a, b in ranges):
        if r1 <= r0:
            continue
        if out and r0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], r1))
        else:
            out.append((r0, r1))
    return out


class ErrorStats:
    """Accumulated error of one output against the reference over the checked slice."""

    def __init__(self, dtype, with_lse):
        self.dtype = dtype
        self.with_lse = with_lse
        self.sq_diff = 0.0
        self.sq_ref = 0.0
        self.max_abs = 0.0
        self.max_ref = 0.0
        self.nonfinite = 0
        self.lse_max_abs = 0.0
        self.lse_bad = 0  # -inf where the reference is finite or the reverse, or NaN/+inf
        self.elements = 0

    def add(self, ours, ref, ours_lse=None, ref_lse=None):
        import torch
        finite = torch.isfinite(ours)
        bad = int((~finite).sum().item())
        diff = ours - ref
        if bad:
            self.nonfinite += bad
            diff = torch.where(finite, diff, torch.zeros_like(diff))
        self.sq_diff += float(diff.double().pow(2).sum().item())
        self.sq_ref += float(ref.double().pow(2).sum().item())
        self.max_abs = max(self.max_abs, float(diff.abs().max().item()) if diff.numel() else 0.0)
        self.max_ref = max(self.max_ref, float(ref.abs().max().item()) if ref.numel() else 0.0)
        self.elements += ours.numel()
        if self.with_lse and ours_lse is not None:
            ref_empty = torch.isneginf(ref_lse)
            ours_empty = torch.isneginf(ours_lse)
            mismatch = (ref_empty != ours_empty) | torch.isnan(ours_lse) | torch.isposinf(ours_lse)
            self.lse_bad += int(mismatch.sum().item())
            both = ~ref_empty & torch.isfinite(ours_lse)
            if bool(both.any()):
                d = (ours_lse[both] - ref_lse[both]).abs().max().item()
                self.lse_max_abs = max(self.lse_max_abs, float(d))

    def result(self):
        tol = TOLERANCES[self.dtype]
        rel = math.sqrt(self.sq_diff / self.sq_ref) if self.sq_ref > 0 else (
            0.0 if self.sq_diff == 0 else float("inf"))
        abs_bound = tol["abs"] * max(1.0, self.max_ref)
        out = {"rel_err": rel, "max_abs_err": self.max_abs, "max_abs_ref": self.max_ref,
               "rel_bound": tol["rel"], "abs_bound": abs_bound, "nonfinite": self.nonfinite,
               "elements": self.elements}
        ok = rel <= tol["rel"] and self.max_abs <= abs_bound and self.nonfinite == 0
        if self.with_lse:
            out.update({"lse_max_abs_err": self.lse_max_abs, "lse_bound": LSE_TOLERANCE,
                        "lse_mismatch": self.lse_bad})
            ok = ok and self.lse_max_abs <= LSE_TOLERANCE and self.lse_bad == 0
        out["pass"] = bool(ok)
        return out


def reference_check(case, q, k, v, scale, outputs, budget):
    """Compares every output against one float32 reference over the planned slice.

    outputs: name -> (out [b, s_q, h_q, d] view, lse [b, h_q, s_q] or None).
    The reference is exact attention in fp32 from the same bf16/fp16 inputs: S = (q k^T) * scale
    with the bottom-right causal mask, LSE = logsumexp(S), O = softmax(S) v; rows that see no key
    have O = 0 and LSE = -inf (what flashjit promises; compared as such). Written out rather than
    called through SDPA because SDPA returns no LSE; on the first step it is cross-checked against
    SDPA's math backend in fp32 (the third value returned: max abs difference, ~1e-6 expected).

    Returns ({name: ErrorStats.result()}, description of what was checked, that difference)."""
    import torch
    pairs, rows, description = plan_check(case, budget)
    math_diff = None
    stats = {name: ErrorStats(case.dtype, lse is not None) for name, (_, lse) in outputs.items()}
    group = case.heads_q // case.heads_kv
    sk = case.seqlen_k
    n_rows = sum(r1 - r0 for r0, r1 in rows)
    by_batch = {}
    for b, h in pairs:
        by_batch.setdefault(b, []).append(h)
    with ieee_fp32_matmul(), torch.no_grad():
        for b, heads in by_batch.items():
            rows_target = min(n_rows, 1024)
            heads_per_step = max(1, min(len(heads), REFERENCE_CHUNK // (sk * rows_target)))
            rows_per_step = max(1, REFERENCE_CHUNK // (sk * heads_per_step))
            for h0 in range(0, len(heads), heads_per_step):
                hsel = torch.tensor(heads[h0:h0 + heads_per_step], device=DEVICE)
                kvsel = torch.div(hsel, group, rounding_mode="floor")
                # [heads, s, d] fp32 slices of this batch's chosen heads
                qf = q[b].index_select(1, hsel).float().permute(1, 0, 2)
                kf = k[b].index_select(1, kvsel).float().permute(1, 0, 2)
                vf = v[b].index_select(1, kvsel).float().permute(1, 0, 2)
                for r_lo, r_hi in rows:
                    for r0 in range(r_lo, r_hi, rows_per_step):
                        r1 = min(r_hi, r0 + rows_per_step)
                        s = torch.matmul(qf[:, r0:r1], kf.transpose(1, 2)).mul_(scale)
                        allowed = None
                        if case.causal:
                            i = torch.arange(r0, r1, device=DEVICE).unsqueeze(1)
                            j = torch.arange(sk, device=DEVICE).unsqueeze(0)
                            allowed = j <= i + (sk - case.seqlen_q)
                            s.masked_fill_(~allowed, float("-inf"))
                        lse = torch.logsumexp(s, dim=-1)
                        # exp(-inf - 0) = 0 on rows that see no key, so their output is 0
                        safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
                        p = s.sub_(safe.unsqueeze(-1)).exp_()
                        ref = torch.matmul(p, vf)
                        del s, p
                        if math_diff is None:
                            math_diff = _sdpa_math_diff(qf[:, r0:r1], kf, vf, allowed, ref, lse,
                                                        scale)
                        for name, (out, out_lse) in outputs.items():
                            ours = out[b, r0:r1].index_select(1, hsel).float().permute(1, 0, 2)
                            ours_lse = None
                            if out_lse is not None:
                                ours_lse = out_lse[b].index_select(0, hsel)[:, r0:r1]
                            stats[name].add(ours, ref, ours_lse, lse)
    return {name: s.result() for name, s in stats.items()}, description, math_diff


def _sdpa_math_diff(qc, kf, vf, allowed, ref, lse, scale):
    """Max |SDPA math backend (fp32) - our reference| over rows that see a key; None if the math
    backend cannot be called (then the reference stands on its own)."""
    import torch
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qc.unsqueeze(0), kf.unsqueeze(0), vf.unsqueeze(0),
                                               attn_mask=allowed, scale=scale)[0]
    except (ImportError, RuntimeError) as e:
        print(f"warning: SDPA math cross-check of the reference failed: {_short(e, 200)}",
              file=sys.stderr)
        return None
    diff = (o - ref).abs()[torch.isfinite(lse)]
    return float(diff.max().item()) if diff.numel() else 0.0


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

class CudaTimer:
    """Times callables with CUDA events on the current stream.

    A short GPU spin (torch.cuda._sleep) goes before each timed call so the CPU can enqueue the
    start event, the launch and the end event while the GPU is still busy: the events then bracket
    GPU work only, not Python and launch overhead (which matters for the small cases)."""

    def __init__(self, spin_ms=0.5):
        import torch
        self.torch = torch
        self.spin_cycles = 0
        if spin_ms > 0 and hasattr(torch.cuda, "_sleep"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)  # first call loads the kernel
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            if ms > 0:
                self.spin_cycles = int(spin_ms * 1_000_000 / ms)

    def launch(self, fn):
        torch = self.torch
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    @staticmethod
    def elapsed_ms(handle):
        start, end = handle
        return start.elapsed_time(end)


def round_robin(impls, targets, timer):
    """Interleaves repetitions: round r runs every impl that still needs samples once, in turn.

    cuDNN's speed moves 5-10% from call to call; interleaving spreads those drifts over all
    implementations alike instead of handing one a good or bad stretch."""
    samples = {name: [] for name in impls}
    names = list(impls)
    for r in range(max(targets.values(), default=0)):
        handles = []
        # the order rotates too, so no implementation always runs right after the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            if len(samples[name]) < targets[name]:
                handles.append((name, timer.launch(impls[name])))
        sync()  # bounded number of live events; reading them needs completion anyway
        for name, handle in handles:
            samples[name].append(timer.elapsed_ms(handle))
    return samples


def plan_reps(per_call_s, reps, min_reps, budget_s, time_left_s):
    """Repetitions per impl: `reps`, fewer (down to min_reps) only for calls so slow that reps of
    them would take over budget_s (the slowest kernels at 64k); then, when the deadline is near,
    all scaled down to fit the time left (down to 1), so the device call ends with its report."""
    if time_left_s <= 0:
        return {name: 1 for name in per_call_s}
    targets = {}
    for name, t in per_call_s.items():
        n = reps
        if t * reps > budget_s:
            n = max(min_reps, int(budget_s / max(t, 1e-9)))
        targets[name] = n
    total = sum(targets[n] * per_call_s[n] for n in targets)
    if total > time_left_s:
        factor = time_left_s / total
        targets = {n: max(1, int(c * factor)) for n, c in targets.items()}
    return targets


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------

def impl_cell(status, **values):
    cell = {"status": status}
    cell.update(values)
    return cell


def run_case(index, case, ctx):
    """Checks and times one case; returns its results.json entry."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = {"index": index, "case": case.key(), "label": case.label(), **case.fields(),
              "flops": case.flops(), "flops_exact": case.flops_exact(), "flashjit": {},
              "sdpa": {}, "notes": []}
    variants = ctx["variants"][case.key()]
    result["auto_family"] = ctx["auto_family"].get(case.key())

    q, k, v = make_inputs(case, args.seed + index)
    runners = {}
    outputs = {}
    # flashjit: one checked call per family into poisoned buffers (the first call of the
    # variant in this process: module load, or NVRTC when precompile did not cover it).
    for family in ctx["families"]:
        variant, err = variants[family]
        if err is not None:
            status = "n/a" if err.unsupported else "error"
            result["flashjit"][family] = impl_cell(status, variant=None, reason=err.message,
                                                   status_name=err.status_name)
            continue
        runner = FlashjitRunner(ctx["engine"], case, q, k, v, family, scale)
        runner.poison()
        sync()
        t0 = time.perf_counter()
        try:
            runner()
            sync()
        except fj.FlashjitError as e:
            status = "n/a" if e.unsupported else "error"
            result["flashjit"][family] = impl_cell(status, variant=variant, reason=e.message,
                                                   status_name=e.status_name)
            continue
        first_ms = (time.perf_counter() - t0) * 1e3
        result["flashjit"][family] = impl_cell("ok", variant=variant, first_call_ms=first_ms)
        runners[f"flashjit:{family}"] = runner
        outputs[f"flashjit:{family}"] = (runner.out, runner.lse)

    # SDPA: the trial call is also its first (graph-building) call.
    sdpa_runners = {}
    for backend in SDPA_BACKENDS:
        runner = SdpaRunner(backend, case, q, k, v, scale, args.sdpa_layout)
        if runner.error:
            result["sdpa"][backend] = impl_cell("n/a", reason=runner.error)
            continue
        sdpa_runners[backend] = runner
        runners[f"sdpa:{backend}"] = runner

    # Check against the float32 reference. SDPA's outputs go through it too: their error shows
    # what bf16/fp16 costs a trusted kernel, and tells whether an is_causal=True call computed
    # our (bottom-right) mask after all.
    sdpa_outputs = {f"sdpa:{b}": (r.out.transpose(1, 2), None) for b, r in sdpa_runners.items()}
    errors = {}
    if (outputs or sdpa_outputs) and not args.no_check:
        t0 = time.perf_counter()
        errors, description, math_diff = reference_check(
            case, q, k, v, scale, {**outputs, **sdpa_outputs}, args.check_budget)
        result["check"] = {"checked": description, "seconds": time.perf_counter() - t0,
                           "reference_vs_sdpa_math_fp32": math_diff}
        if math_diff is not None and math_diff > REFERENCE_SELF_TOLERANCE:
            result["notes"].append(f"the fp32 reference differs from SDPA's math backend in fp32 "
                                   f"by {math_diff:.1e}: suspect the harness, not the kernel")
    else:
        result["check"] = {"checked": "not checked (--no-check)" if args.no_check else "nothing"}
    for family in result["flashjit"]:
        if f"flashjit:{family}" in errors:
            result["flashjit"][family]["check"] = errors[f"flashjit:{family}"]
    for backend, runner in sdpa_runners.items():
        err = errors.get(f"sdpa:{backend}")
        if err and runner.mask_alignment == "top-left" and err["pass"]:
            runner.verified_bottom_right()
        cell = impl_cell("ok", layout=runner.layout, gqa=runner.gqa_mode, mask=runner.mask,
                         mask_alignment=runner.mask_alignment, notes=runner.notes)
        if err and runner.mask_alignment != "top-left":
            cell["reference_error"] = {key: err[key] for key in
                                       ("rel_err", "max_abs_err", "max_abs_ref", "nonfinite")}
            cell["reference_error"]["within_bounds"] = err["pass"]
        result["sdpa"][backend] = cell
        runner.out = None
    del sdpa_outputs, outputs

    # Timing
    if runners and not args.no_time:
        per_call = {}
        for name, fn in runners.items():
            for i in range(max(1, args.warmup)):  # >= 1: the repetition plan needs a time
                t0 = time.perf_counter()
                fn()
                sync()
                per_call[name] = time.perf_counter() - t0
                if per_call[name] > 1.0:  # one warm call is enough for a kernel that slow
                    break
        time_left = ctx["deadline"] - time.monotonic()
        targets = plan_reps(per_call, args.reps, args.min_reps, args.impl_budget,
                            time_left - 5.0)
        samples = round_robin(runners, targets, ctx["timer"])
        for name, times in samples.items():
            kind, which = name.split(":")
            cell = result["flashjit" if kind == "flashjit" else "sdpa"][which]
            median = statistics.median(times)
            cell.update({"median_ms": median, "min_ms": min(times), "max_ms": max(times),
                         "reps": len(times), "tflops": case.flops() / (median * 1e-3) / 1e12})
            if len(times) < args.reps:
                result["reduced_reps"] = True
                result["notes"].append(f"{name}: only {len(times)} repetitions (calls of "
                                       f"{per_call[name] * 1e3:.0f} ms; --impl-budget "
                                       f"{args.impl_budget:g} s, --deadline {args.deadline:g} s)")
    # Ratios: ours / theirs in TFLOPS = their median time / ours (> 1: flashjit is faster).
    for family, cell in result["flashjit"].items():
        for backend in SDPA_BACKENDS:
            theirs = result["sdpa"].get(backend, {})
            if cell.get("median_ms") and theirs.get("median_ms"):
                cell[f"ratio_{backend}"] = theirs["median_ms"] / cell["median_ms"]
                # comparable: same mask semantics (a top-left causal SDPA does other work)
                cell[f"ratio_{backend}_comparable"] = theirs.get("mask_alignment") != "top-left"
    del runners, q, k, v
    return result


# --------------------------------------------------------------------------------------------
# Report: table, summary, results.json, plots
# --------------------------------------------------------------------------------------------

def fmt_num(x, spec):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def check_word(cell):
    if cell is None:
        return "-"
    if cell["status"] == "n/a":
        return "n/a"
    if cell["status"] == "error":
        return "ERROR"
    chk = cell.get("check")
    if chk is None:
        return "-"
    return "pass" if chk["pass"] else "FAIL"


def headline_family(case_result, families):
    """The family whose numbers the summary line uses for this case: the requested one when a
    single family (or 'auto') was asked for, else the dispatcher's pick, else the fastest."""
    cells = case_result["flashjit"]
    if "auto" in cells:
        return "auto"
    if len(families) == 1:
        return families[0]
    auto = case_result.get("auto_family")
    if auto in cells and cells[auto].get("median_ms"):
        return auto
    timed = [(c["median_ms"], f) for f, c in cells.items() if c.get("median_ms")]
    return min(timed)[1] if timed else (auto if auto in cells else families[0])


COLUMNS = [  # (title, width, align)
    ("#", 3, ">"), ("case", 42, "<"), ("family", 6, "<"), ("check", 5, "<"),
    ("rel_err", 8, ">"), ("max_err", 8, ">"), ("lse_err", 8, ">"), ("TFLOPS", 7, ">"),
    ("cuDNN", 7, ">"), ("flash", 7, ">"), ("x cuDNN", 7, ">"), ("x flash", 7, ">"),
    ("variant", 0, "<"),
]


def format_row(values):
    cells = []
    for (title, width, align), value in zip(COLUMNS, values):
        cells.append(f"{value:{align}{width}}" if width else str(value))
    return "  ".join(cells).rstrip()


def table_header():
    return [format_row([t for t, _, _ in COLUMNS]),
            format_row(["-" * max(w, len(t)) if w else "-" * 7 for t, w, _ in COLUMNS])]


def case_rows(r):
    """Table lines of one case: one per flashjit family, SDPA numbers on the first."""
    lines = []
    sd = r["sdpa"]

    def sdpa_tflops(backend):
        cell = sd.get(backend)
        if cell is None:
            return "-"
        if cell["status"] != "ok":
            return "n/a"
        mark = "†" if cell.get("mask_alignment") == "top-left" else ""
        return fmt_num(cell.get("tflops"), ".1f") + mark

    families = list(r["flashjit"]) or ["-"]
    for i, family in enumerate(families):
        cell = r["flashjit"].get(family)
        chk = (cell or {}).get("check") or {}
        shown_family = family
        if family == "auto" and cell and cell.get("variant"):
            shown_family = cell["variant"].split(".")[0] + "*"
        ok = cell is not None and cell["status"] == "ok"
        variant = (cell or {}).get("variant") or ""
        if cell and cell["status"] != "ok":
            variant = (variant + "  " if variant else "") + _short(cell.get("reason", ""), 70)
        lines.append(format_row([
            str(r["index"]) if i == 0 else "",
            r["label"] if i == 0 else "",
            shown_family,
            check_word(cell),
            fmt_num(chk.get("rel_err"), ".1e"),
            fmt_num(chk.get("max_abs_err"), ".1e"),
            fmt_num(chk.get("lse_max_abs_err"), ".1e"),
            fmt_num(cell.get("tflops"), ".1f") if ok else ("n/a" if cell else "-"),
            sdpa_tflops("cudnn") if i == 0 else "",
            sdpa_tflops("flash") if i == 0 else "",
            fmt_num(cell.get("ratio_cudnn"), ".2f") if ok else "-",
            fmt_num(cell.get("ratio_flash"), ".2f") if ok else "-",
            variant,
        ]))
    notes = list(r.get("notes", []))
    checked = r.get("check", {}).get("checked")
    if checked and checked != "all heads, all rows":
        notes.append(f"checked: {checked}")
    for backend in SDPA_BACKENDS:
        cell = sd.get(backend)
        if cell is None:
            continue
        if cell["status"] != "ok":
            notes.append(f"{SDPA_LABELS[backend]} n/a: {_short(cell.get('reason', ''), 160)}")
        else:
            for note in cell.get("notes", []):
                notes.append(f"{SDPA_LABELS[backend]}: {note}")
            ref = cell.get("reference_error")
            if ref and not ref.get("within_bounds", True):
                notes.append(f"{SDPA_LABELS[backend]} itself is outside our bounds "
                             f"(rel {ref['rel_err']:.1e}, max {ref['max_abs_err']:.1e}"
                             + (f", {ref['nonfinite']} non-finite" if ref.get("nonfinite") else "")
                             + ")")
    for family, cell in r["flashjit"].items():
        chk = cell.get("check")
        if chk and not chk["pass"]:
            why = []
            if chk["nonfinite"]:
                why.append(f"{chk['nonfinite']} non-finite outputs")
            if chk["rel_err"] > chk["rel_bound"]:
                why.append(f"rel {chk['rel_err']:.2e} > {chk['rel_bound']:.1e}")
            if chk["max_abs_err"] > chk["abs_bound"]:
                why.append(f"max {chk['max_abs_err']:.2e} > {chk['abs_bound']:.2e}")
            if chk.get("lse_mismatch"):
                why.append(f"{chk['lse_mismatch']} LSE entries -inf/finite/NaN mismatched")
            if chk.get("lse_max_abs_err", 0) > chk.get("lse_bound", math.inf):
                why.append(f"LSE {chk['lse_max_abs_err']:.2e} > {chk['lse_bound']:.0e}")
            notes.append(f"{family} FAILED: " + "; ".join(why))
    if r.get("error"):
        notes.append(f"case error: {r['error']}")
    for note in notes:
        lines.append(" " * 5 + "note: " + note)
    return lines


def _short(text, n):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def geomean(values):
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(results, families):
    """Per-family ladder numbers plus the headline (see headline_family)."""
    def collect(pick):
        ratios = {b: [] for b in SDPA_BACKENDS}
        failed = checked = na = errors = timed = 0
        for r in results:
            family = pick(r)
            cell = r["flashjit"].get(family)
            if cell is None:
                continue
            if cell["status"] == "n/a":
                na += 1
                continue
            if cell["status"] == "error":
                errors += 1
                continue
            chk = cell.get("check")
            if chk is not None:
                checked += 1
                failed += 0 if chk["pass"] else 1
            if cell.get("median_ms"):
                timed += 1
            for b in SDPA_BACKENDS:
                if cell.get(f"ratio_{b}") and cell.get(f"ratio_{b}_comparable", True):
                    ratios[b].append(cell[f"ratio_{b}"])
        return {"geomean_ratio_cudnn": geomean(ratios["cudnn"]), "cases_cudnn": len(ratios["cudnn"]),
                "geomean_ratio_flash": geomean(ratios["flash"]), "cases_flash": len(ratios["flash"]),
                "checked": checked, "failed_checks": failed + errors, "errors": errors,
                "not_applicable": na, "timed": timed}

    summary = {"families": {f: collect(lambda r, f=f: f) for f in families}}
    summary["headline"] = collect(lambda r: headline_family(r, families))
    # Every failed check counts, whichever family it was in, and so does a case that crashed.
    summary["case_errors"] = sum(1 for r in results if r.get("error"))
    summary["failed_checks_total"] = (sum(s["failed_checks"] for s in summary["families"].values())
                                      + summary["case_errors"])
    summary["sdpa_not_applicable"] = {
        b: sum(1 for r in results if r["sdpa"].get(b, {}).get("status") == "n/a")
        for b in SDPA_BACKENDS}
    summary["cases"] = len(results)
    summary["cases_skipped"] = sum(1 for r in results if r.get("skipped"))
    summary["cases_reduced_reps"] = sum(1 for r in results if r.get("reduced_reps"))
    return summary


def summary_lines(summary, families, compile_info, wall_s):
    def ratio_text(s):
        parts = []
        for b, label in (("cudnn", "cuDNN"), ("flash", "flash")):
            g = s[f"geomean_ratio_{b}"]
            parts.append(f"x {label} {fmt_num(g, '.3f')} ({s[f'cases_{b}']} cases)")
        return ", ".join(parts)

    lines = []
    if len(families) > 1:
        lines.append("ladder (geomean of flashjit TFLOPS / SDPA TFLOPS; > 1: flashjit faster):")
        for f in families:
            s = summary["families"][f]
            lines.append(f"  {f:6s} {ratio_text(s)}; checks failed {s['failed_checks']} of "
                         f"{s['checked'] + s['errors']}; n/a {s['not_applicable']}")
    h = summary["headline"]
    who = families[0] if len(families) == 1 else "dispatcher's pick"
    if families == ["auto"]:
        who = "auto"
    extra = []
    na = summary["sdpa_not_applicable"]
    if any(na.values()):
        extra.append("SDPA n/a: " + ", ".join(f"{b} {n}" for b, n in na.items() if n))
    if h["not_applicable"]:
        extra.append(f"flashjit n/a {h['not_applicable']}")
    if summary["cases_skipped"]:
        extra.append(f"{summary['cases_skipped']} cases skipped (deadline)")
    if summary["cases_reduced_reps"]:
        extra.append(f"{summary['cases_reduced_reps']} cases with fewer repetitions")
    if summary["case_errors"]:
        extra.append(f"{summary['case_errors']} cases crashed")
    if compile_info and compile_info.get("seconds") is not None:
        extra.append(f"compile {compile_info['seconds']:.1f} s")
    extra.append(f"wall {wall_s:.0f} s")
    lines.append(f"SUMMARY flashjit ({who}) vs SDPA: {ratio_text(h)}; failed checks "
                 f"{summary['failed_checks_total']}; " + "; ".join(extra))
    return lines


def json_clean(x):
    """results.json is strict JSON: non-finite floats become strings ('inf', 'nan')."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    return x


def write_json(path, document):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(json_clean(document), indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # a run cut short still leaves a whole file


def seqlen_tick(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def plot_results(results, families, out_dir, subtitle=""):
    """tflops_vs_seqlen.png (one panel per head dim x causal for every series of cases that
    differ only in seqlen) and ratios.png (headline ratios, every case). Returns file names."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plots skipped: matplotlib unavailable ({e})", file=sys.stderr)
        return []
    written = []
    styles = {"simt": (":", "s"), "mma": ("-.", "^"), "wgmma": ("-", "o"), "auto": ("-", "o")}
    colors = {"simt": "tab:gray", "mma": "tab:orange", "wgmma": "tab:red", "auto": "tab:red",
              "cudnn": "tab:blue", "flash": "tab:green"}

    # Series: same everything but seqlen (s_q == s_k), at least two seqlens.
    groups = {}
    for r in results:
        if r.get("skipped") or r["seqlen_q"] != r["seqlen_k"]:
            continue
        key = (r["dtype"], r["layout"], r["heads_q"] // r["heads_kv"], r["causal"], r["head_dim"])
        groups.setdefault(key, []).append(r)
    groups = {k: sorted(v, key=lambda r: r["seqlen_q"]) for k, v in groups.items()
              if len({r["seqlen_q"] for r in v}) >= 2}
    if groups:
        keys = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], k[4]))
        head_dims = sorted({k[4] for k in keys})
        rows_keys = sorted({k[:4] for k in keys})
        ncols, nrows = len(head_dims), len(rows_keys)
        fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, 4.6 * ncols), 3.6 * nrows + 0.4),
                                 squeeze=False)
        for (row_key), row_axes in zip(rows_keys, axes):
            for d, ax in zip(head_dims, row_axes):
                key = row_key + (d,)
                if key not in groups:
                    ax.set_visible(False)
                    continue
                series = groups[key]
                xs = [r["seqlen_q"] for r in series]
                for family in families:
                    ys = [r["flashjit"].get(family, {}).get("tflops") for r in series]
                    if any(y is not None for y in ys):
                        ls, marker = styles.get(family, ("-", "o"))
                        ax.plot(xs, [y if y is not None else float("nan") for y in ys], ls,
                                marker=marker, color=colors.get(family), label=f"flashjit {family}")
                for backend in SDPA_BACKENDS:
                    ys = [r["sdpa"].get(backend, {}).get("tflops") for r in series]
                    if any(y is not None for y in ys):
                        ax.plot(xs, [y if y is not None else float("nan") for y in ys], "--",
                                marker="x", color=colors[backend], label=SDPA_LABELS[backend])
                dtype, layout, ratio, causal = row_key
                gqa = f", GQA {ratio}:1" if ratio > 1 else ""
                ax.set_title(f"d={d}, {'causal' if causal else 'non-causal'}, {dtype} "
                             f"{layout}{gqa}", fontsize=10)
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs)
                ax.set_xticklabels([seqlen_tick(x) for x in xs])
                tokens = {r["batch"] * r["seqlen_q"] for r in series}
                ax.set_xlabel(f"seqlen (batch x seqlen = {seqlen_tick(tokens.pop())})"
                              if len(tokens) == 1 else "seqlen")
                ax.set_ylabel("TFLOPS")
                plotted = [y for line in ax.get_lines() for y in line.get_ydata()
                           if y == y and y > 0]
                if plotted and max(plotted) / min(plotted) > 20:
                    ax.set_yscale("log")  # a ladder from simt to wgmma spans decades
                else:
                    ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=7, loc="best")
        fig.suptitle("flashjit vs PyTorch SDPA: forward TFLOPS (4·b·h·s²·d, halved for causal)"
                     + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
        fig.tight_layout()
        fig.savefig(out_dir / "tflops_vs_seqlen.png", dpi=110)
        plt.close(fig)
        written.append("tflops_vs_seqlen.png")

    # Ratios of the headline family, every case
    rows = []
    for r in results:
        if r.get("skipped"):
            continue
        family = headline_family(r, families)
        cell = r["flashjit"].get(family, {})
        # a ratio against a top-left causal SDPA compares different work: not drawn
        ratios = [cell.get(f"ratio_{b}") if cell.get(f"ratio_{b}_comparable", True) else None
                  for b in SDPA_BACKENDS]
        shown = family if family != "auto" else (cell.get("variant") or "auto").split(".")[0]
        rows.append((f"{r['label']}  [{shown}]", *ratios))
    if rows:
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.5))
        ys = list(range(len(rows)))
        nan = float("nan")
        ax.barh([y - 0.2 for y in ys], [c if c else nan for _, c, _ in rows], height=0.4,
                color=colors["cudnn"], label="vs SDPA cuDNN")
        ax.barh([y + 0.2 for y in ys], [f if f else nan for _, _, f in rows], height=0.4,
                color=colors["flash"], label="vs SDPA flash")
        for y, (_, c, f) in enumerate(rows):
            for dy, value in ((-0.2, c), (0.2, f)):
                if value:
                    ax.text(value, y + dy, f" {value:.2f}", va="center", fontsize=6)
        ax.axvline(1.0, color="black", linewidth=0.8)
        values = [x for _, c, f in rows for x in (c, f) if x]
        if values and max(values) / min(values) > 8:  # the ladder spans decades: log scale
            ax.set_xscale("log")
        ax.set_yticks(ys)
        ax.set_yticklabels([label for label, _, _ in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("flashjit TFLOPS / SDPA TFLOPS (> 1: flashjit faster)")
        if subtitle:
            ax.set_title(subtitle, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "ratios.png", dpi=110)
        plt.close(fig)
        written.append("ratios.png")
    return written


class Output:
    """Prints lines as they come and keeps them for table.txt."""

    def __init__(self):
        self.lines = []

    def __call__(self, line=""):
        print(line, flush=True)
        self.lines.append(line)


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

def environment(lib, device):
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
    if DEVICE == "cuda":
        props = torch.cuda.get_device_properties(device)
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
    env["python"] = sys.version.split()[0]
    env["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env["command"] = " ".join([Path(sys.argv[0]).name] + sys.argv[1:])
    return env


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="flashjit vs PyTorch SDPA (cuDNN, flash): correctness and speed, one command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: LD_LIBRARY_PATH=.devpack python3 tools/compare_sdpa.py "
               "--lib .devpack/libflashjit.so.0 --grid standard --out out/compare")
    p.add_argument("--grid", action="append", choices=sorted(GRIDS), default=[],
                   help="case set (repeatable); standard when neither --grid nor --case is given")
    p.add_argument("--case", action="append", default=[], metavar="B,HQ,HKV,SQ,SK,D,CAUSAL,DTYPE,LAYOUT",
                   help="one explicit case (repeatable), e.g. 2,32,8,4096,4096,128,1,bf16,bshd")
    p.add_argument("--family", default="auto",
                   help="auto (dispatcher's pick, default), all (simt, mma, wgmma each forced), "
                        "or a comma list")
    p.add_argument("--lib", help="libflashjit path (default $FLASHJIT_LIB, else build/libflashjit.so)")
    p.add_argument("--cache-dir", help="flashjit kernel cache directory (default: flashjit's own)")
    p.add_argument("--out", help="directory for results.json, table.txt and the PNG plots")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per implementation "
                   "(default 20, the contract's minimum)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--min-reps", type=int, default=5,
                   help="fewest repetitions when a call is too slow for --reps (default 5)")
    p.add_argument("--impl-budget", type=float, default=15.0,
                   help="seconds of timed calls one implementation may take per case before its "
                        "repetitions are cut (default 15; only very slow kernels hit it)")
    p.add_argument("--deadline", type=float, default=500.0,
                   help="seconds after start when no new case begins (default 500: results of a "
                        "10-minute device call survive); the rest are listed as skipped")
    p.add_argument("--sdpa-layout", choices=("same", "bhsd"), default="same",
                   help="same: SDPA reads flashjit's memory through .transpose(1,2) views "
                        "(default); bhsd: contiguous [b,h,s,d] copies made before timing")
    p.add_argument("--check-budget", type=int, default=DEFAULT_CHECK_BUDGET,
                   help="score elements (heads x rows x keys) the fp32 reference may compute per "
                        f"case before it samples heads/rows (default 2^33 = {DEFAULT_CHECK_BUDGET})")
    p.add_argument("--seed", type=int, default=1234, help="base seed; case i uses seed + i")
    p.add_argument("--spin-ms", type=float, default=0.5,
                   help="GPU spin before each timed call, hiding launch overhead (0: none)")
    p.add_argument("--limit", type=int, help="only the first N cases (smoke runs)")
    p.add_argument("--no-check", action="store_true", help="skip the reference check")
    p.add_argument("--no-time", action="store_true", help="skip timing (check only)")
    p.add_argument("--list-cases", action="store_true",
                   help="print the cases and exit (no GPU, no torch, no library needed)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cases, load the library, print versions and, when a GPU is "
                        "reachable, each case's variants; run nothing")
    p.add_argument("--selftest-report", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.families = parse_families(args.family)
        args.cases = build_cases(args.grid, args.case, args.limit)
    except ValueError as e:
        p.error(str(e))
    if args.reps < 1 or args.min_reps < 1 or args.warmup < 0:
        p.error("--reps and --min-reps must be >= 1, --warmup >= 0")
    args.min_reps = min(args.min_reps, args.reps)
    return args


def print_cases(cases, out=print):
    out(f"{len(cases)} cases  (TFLOP per call: 4*b*h*s_q*s_k*d, halved for causal)")
    out(f"{'#':>3}  {'case':42}  {'--case spelling':40}  {'group':8}  {'TFLOP':>7}")
    for i, c in enumerate(cases):
        out(f"{i:>3}  {c.label():42}  {c.key():40}  {c.group:8}  {c.flops() / 1e12:7.3f}")


def precompile_variants(lib, ctx, out):
    """Compiles every distinct variant the run needs, in parallel, before anything is timed."""
    names = sorted({v for picks in ctx["variants"].values() for v, _ in picks.values() if v})
    info = {"variants": names, "seconds": None, "error": None}
    if not names:
        return info
    t0 = time.perf_counter()
    try:
        lib.precompile(names, ctx["args"].cache_dir)
    except fj.FlashjitError as e:
        info["error"] = e.message
        out(f"precompile: some variants failed (their cases will show the error): "
            f"{_short(e.message, 300)}")
    info["seconds"] = time.perf_counter() - t0
    out(f"compile: {len(names)} variants precompiled in {info['seconds']:.1f} s (NVRTC, in "
        "parallel; variants already in the disk cache cost ~0)")
    return info


def main(argv=None):
    start = time.monotonic()
    args = parse_args(argv)
    if args.selftest_report:
        return selftest_report(Path(args.selftest_report), args)
    out = Output()
    if args.list_cases:
        print_cases(args.cases)
        return 0

    # Import torch before loading flashjit: torch preloads its own libnvrtc, and when the sonames
    # match that copy is the one flashjit binds to; results.json records which one it was.
    torch = None
    try:
        import torch
    except ImportError as e:
        if not args.dry_run:
            print(f"error: torch is needed to run cases ({e})", file=sys.stderr)
            return 2
    try:
        lib = fj.Flashjit(fj.find_library(args.lib))
    except fj.FlashjitLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.dry_run:
        print_cases(args.cases, out)
        nvrtc = fj.loaded_nvrtc(lib.path)
        out(f"flashjit {lib.version()} from {os.path.realpath(lib.path)}; NVRTC "
            f"{lib.nvrtc_version() or 'unknown'} ({nvrtc['path'] if nvrtc else 'not loaded'}); "
            f"CUDA driver {lib.driver_version() or 'none'}; torch "
            f"{torch.__version__ if torch else 'not installed'}")
        try:
            engine = lib.create_engine(args.device, args.cache_dir)
        except fj.FlashjitError as e:
            out(f"engine: not created ({e.status_name}: {e.message}); nothing would run here")
            return 0
        with engine:
            for i, case in enumerate(args.cases):
                picks = []
                for family in args.families:
                    v, e = select_variant(engine, case, family)
                    picks.append(f"{family}={v or 'n/a (' + _short(e.message, 60) + ')'}")
                out(f"{i:>3}  {case.label():42}  " + "  ".join(picks))
        return 0

    if not torch.cuda.is_available():
        print("error: torch sees no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device)
    torch.cuda.init()
    try:
        engine = lib.create_engine(args.device, args.cache_dir)
    except fj.FlashjitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(lib, args.device)
    families = args.families
    settings = {"grids": args.grid or (["standard"] if not args.case else []),
                "explicit_cases": args.case, "families": families, "reps": args.reps,
                "warmup": args.warmup, "min_reps": args.min_reps, "impl_budget_s": args.impl_budget,
                "sdpa_layout": args.sdpa_layout, "check_budget": args.check_budget,
                "seed": args.seed, "spin_ms": args.spin_ms, "tolerances": TOLERANCES,
                "lse_tolerance": LSE_TOLERANCE, "cache_dir": args.cache_dir,
                "deadline_s": args.deadline,
                "reference": "float32 torch ops (matmul without TF32, logsumexp, softmax), "
                             "bottom-right causal mask, on the same bf16/fp16 inputs; first chunk "
                             "cross-checked against SDPA's math backend in fp32"}
    out(f"flashjit {env['flashjit']} (NVRTC {env['nvrtc']}) vs torch {env['torch']} SDPA "
        f"(cuDNN {env['cudnn']}, CUDA {env['torch_cuda']}) on {env['gpu']} "
        f"(cc {env['compute_capability']}, driver {env['cuda_driver']})")
    out(f"timing: CUDA events, median of {args.reps} repetitions interleaved round-robin across "
        f"implementations, after {args.warmup} warm-up calls; SDPA reads "
        + ("the same memory via .transpose(1,2) views" if args.sdpa_layout == "same"
           else "contiguous [b,h,s,d] copies"))
    out(f"check: vs float32 reference; pass: rel_err <= {TOLERANCES['bf16']['rel']:g} (bf16) / "
        f"{TOLERANCES['fp16']['rel']:g} (fp16), max_err <= {TOLERANCES['bf16']['abs']:g} / "
        f"{TOLERANCES['fp16']['abs']:g} x max(1, max|ref|), lse_err <= {LSE_TOLERANCE:g}")
    out("ratios: flashjit TFLOPS / SDPA TFLOPS (> 1: flashjit faster); † SDPA timed with "
        "is_causal=True (top-left mask) where s_q != s_k, not comparable, left out of geomeans")

    ctx = {"args": args, "engine": engine, "families": families, "variants": {},
           "auto_family": {}, "deadline": start + args.deadline}
    for case in args.cases:
        ctx["variants"][case.key()] = {f: select_variant(engine, case, f) for f in families}
        auto_variant, _ = select_variant(engine, case, "auto")
        ctx["auto_family"][case.key()] = auto_variant.split(".")[0] if auto_variant else None
    compile_info = precompile_variants(lib, ctx, out)
    ctx["timer"] = CudaTimer(args.spin_ms)

    document = {"schema": SCHEMA, "environment": env, "settings": settings,
                "compile": compile_info, "cases": [], "summary": None}
    out()
    for line in table_header():
        out(line)
    results = []
    aborted = None
    for index, case in enumerate(args.cases):
        if aborted or time.monotonic() > ctx["deadline"]:
            why = aborted or f"deadline ({args.deadline:g} s) reached"
            results.append({"index": index, "case": case.key(), "label": case.label(),
                            **case.fields(), "flops": case.flops(), "flashjit": {}, "sdpa": {},
                            "skipped": why, "notes": [f"skipped: {why}"]})
            out(format_row([str(index), case.label(), "", "skip"]))
            continue
        try:
            r = run_case(index, case, ctx)
        except Exception as e:  # keep the run going; a dead CUDA context stops it below
            traceback.print_exc()
            r = {"index": index, "case": case.key(), "label": case.label(), **case.fields(),
                 "flops": case.flops(), "flashjit": {}, "sdpa": {}, "notes": [],
                 "error": f"{type(e).__name__}: {_short(e, 300)}"}
            try:
                sync()
            except Exception as e2:
                aborted = f"CUDA context unusable after case {index} ({_short(e2, 120)})"
        results.append(r)
        for line in case_rows(r):
            out(line)
        if out_dir:
            document["cases"] = results
            write_json(out_dir / "results.json", document)

    summary = summarize(results, families)
    first_calls = sum(c.get("first_call_ms", 0) for r in results for c in r["flashjit"].values())
    compile_info["first_calls_ms"] = first_calls
    document["cases"] = results
    document["summary"] = summary
    wall = time.monotonic() - start
    document["wall_s"] = wall
    out()
    out(f"first flashjit calls (module load; NVRTC only where precompile missed): "
        f"{first_calls / 1e3:.2f} s in total")
    if out_dir:
        write_json(out_dir / "results.json", document)
        subtitle = (f"{env.get('gpu', '?')}, torch {env['torch']}, cuDNN {env['cudnn']}, "
                    f"flashjit {env['flashjit']}")
        written = plot_results(results, families, out_dir, subtitle)
        out(f"wrote {out_dir / 'results.json'}" + "".join(f", {w}" for w in written))
    for line in summary_lines(summary, families, compile_info, wall):
        out(line)
    if out_dir:
        (out_dir / "table.txt").write_text("\n".join(out.lines) + "\n")
    engine.close()
    return 1 if summary["failed_checks_total"] else 0


# --------------------------------------------------------------------------------------------
# Self-test of the report path with synthetic numbers (no GPU): --selftest-report DIR
# --------------------------------------------------------------------------------------------

def synthetic_results(cases, families, seed=0):
    import random
    rng = random.Random(seed)
    results = []
    for index, case in enumerate(cases):
        r = {"index": index, "case": case.key(), "label": case.label(), **case.fields(),
             "flops": case.flops(), "flops_exact": case.flops_exact(), "flashjit": {}, "sdpa": {},
             "notes": [], "auto_family": "wgmma",
             "check": {"checked": "all heads, all rows" if case.seqlen_q < 16384 else
                       "8 of 16 (batch, head) pairs, all rows"}}
        sdpa_base = {"cudnn": 480.0, "flash": 380.0}
        for b, base in sdpa_base.items():
            if b == "flash" and case.head_dim == 256 and case.causal:
                r["sdpa"][b] = impl_cell("n/a", reason="synthetic: flash refuses d=256 here")
                continue
            tf = base * (0.5 + 0.5 * math.log2(case.seqlen_q) / 14) * rng.uniform(0.95, 1.05)
            ms = case.flops() / (tf * 1e12) * 1e3
            r["sdpa"][b] = impl_cell("ok", median_ms=ms, tflops=tf, reps=20, gqa=None,
                                     mask="is_causal" if case.causal else None,
                                     mask_alignment="bottom-right" if case.causal else None,
                                     notes=[], reference_error={"rel_err": 3e-3,
                                                                "max_abs_err": 8e-3,
                                                                "max_abs_ref": 2.0,
                                                                "within_bounds": True})
        speed = {"simt": 0.02, "mma": 0.55, "wgmma": 0.95, "auto": 0.95}
        for family in families:
            if family == "wgmma" and case.head_dim == 256 and index % 2:
                r["flashjit"][family] = impl_cell(
                    "n/a", variant=None, status_name="FLASHJIT_UNSUPPORTED",
                    reason="no kernel family can run this problem on sm_90a: wgmma needs ...")
                continue
            tf = r["sdpa"]["cudnn"]["tflops"] * speed[family] * rng.uniform(0.9, 1.1)
            ms = case.flops() / (tf * 1e12) * 1e3
            fam = "wgmma" if family == "auto" else family
            rel = rng.uniform(2e-3, 4e-3)
            failing = index == 3 and family == families[-1]
            chk = {"rel_err": rel * (10 if failing else 1), "max_abs_err": 1e-2,
                   "max_abs_ref": 2.5, "rel_bound": 1.2e-2, "abs_bound": 6.25e-2,
                   "nonfinite": 0, "elements": 1, "lse_max_abs_err": 2e-6, "lse_bound": 1e-3,
                   "lse_mismatch": 0}
            chk["pass"] = not failing
            cell = impl_cell("ok", variant=f"{fam}.sm90a.{case.dtype}.d{case.head_dim}.m128n64s2"
                             + (".causal" if case.causal else ""), first_call_ms=850.0,
                             median_ms=ms, tflops=tf, reps=20, check=chk)
            for b in SDPA_BACKENDS:
                if r["sdpa"][b].get("median_ms"):
                    cell[f"ratio_{b}"] = r["sdpa"][b]["median_ms"] / ms
                    cell[f"ratio_{b}_comparable"] = True
            r["flashjit"][family] = cell
        results.append(r)
    return results


def selftest_report(out_dir, args):
    """Feeds synthetic numbers through the table, summary, results.json and plot code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = Output()
    results = synthetic_results(args.cases, args.families)
    for line in table_header():
        out(line)
    for r in results:
        for line in case_rows(r):
            out(line)
    summary = summarize(results, args.families)
    document = {"schema": SCHEMA, "environment": {"synthetic": True}, "settings": {},
                "compile": {"seconds": 3.2}, "cases": results, "summary": summary}
    write_json(out_dir / "results.json", document)
    written = plot_results(results, args.families, out_dir, "synthetic numbers (self-test)")
    out(f"wrote {out_dir / 'results.json'}" + "".join(f", {w}" for w in written))
    for line in summary_lines(summary, args.families, {"seconds": 3.2}, 1.0):
        out(line)
    (out_dir / "table.txt").write_text("\n".join(out.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
