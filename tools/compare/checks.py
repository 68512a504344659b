"""Correctness: flashjit's (and SDPA's) outputs against a float32 reference on the same inputs."""

import contextlib
import math
import sys

from . import gpu
from .report import short

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


class DiffStats:
    """Accumulated difference of one output (or gradient) against the reference over the checked
    slices: max |ours - ref|, max |ref|, their squared sums, and ours' non-finite elements (left
    out of the differences)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.sq_diff = 0.0
        self.sq_ref = 0.0
        self.max_abs = 0.0
        self.max_ref = 0.0
        self.nonfinite = 0
        self.elements = 0

    def add(self, ours, ref):
        import torch
        ours = ours.float()
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

    def rel_l2(self):
        """||ours - ref|| / ||ref|| (0 when both are zero, inf when only the reference is)."""
        return math.sqrt(self.sq_diff / self.sq_ref) if self.sq_ref > 0 else (
            0.0 if self.sq_diff == 0 else float("inf"))


class ErrorStats(DiffStats):
    """DiffStats of one forward output, and of its LSE when with_lse."""

    def __init__(self, dtype, with_lse):
        super().__init__(dtype)
        self.with_lse = with_lse
        self.lse_max_abs = 0.0
        self.lse_bad = 0  # -inf where the reference is finite or the reverse, or NaN/+inf

    def add(self, ours, ref, ours_lse=None, ref_lse=None):
        import torch
        super().add(ours, ref)
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
        rel = self.rel_l2()
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


def reference_check(case, q, k, v, scale, outputs, budget, stats=None):
    """Compares every output against one float32 reference over the planned slice.

    outputs: name -> (out [b, s_q, h_q, d] view, lse [b, h_q, s_q] or None).
    The reference is exact attention in fp32 from the same bf16/fp16 inputs: S = (q k^T) * scale
    with the bottom-right causal mask, LSE = logsumexp(S), O = softmax(S) v; rows that see no key
    have O = 0 and LSE = -inf (what flashjit promises; compared as such). Written out rather than
    called through SDPA because SDPA returns no LSE; on the first step it is cross-checked against
    SDPA's math backend in fp32 (the third value returned: max abs difference, ~1e-6 expected).

    stats: {name: ErrorStats} to add to (created for names it lacks), so that several calls,
    e.g. one per sequence of a varlen batch, give one result; None: fresh ones.

    Returns ({name: ErrorStats.result()}, description of what was checked, that difference)."""
    import torch
    pairs, rows, description = plan_check(case, budget)
    math_diff = None
    stats = {} if stats is None else stats
    for name, (_, lse) in outputs.items():
        stats.setdefault(name, ErrorStats(case.dtype, lse is not None))
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
                hsel = torch.tensor(heads[h0:h0 + heads_per_step], device=gpu.DEVICE)
                kvsel = torch.div(hsel, group, rounding_mode="floor")
                # [heads, s, d] fp32 slices of this batch's chosen heads
                qf = q[b].index_select(1, hsel).float().permute(1, 0, 2)
                kf = k[b].index_select(1, kvsel).float().permute(1, 0, 2)
                vf = v[b].index_select(1, kvsel).float().permute(1, 0, 2)
                for r_lo, r_hi in rows:
                    for r0 in range(r_lo, r_hi, rows_per_step):
                        r1 = min(r_hi, r0 + rows_per_step)
                        ref, lse, allowed = _reference_rows(case, qf, kf, vf, r0, r1, scale)
                        if math_diff is None:
                            math_diff = _sdpa_math_diff(qf[:, r0:r1], kf, vf, allowed, ref, lse,
                                                        scale)
                        for name, (out, out_lse) in outputs.items():
                            ours = out[b, r0:r1].index_select(1, hsel).float().permute(1, 0, 2)
                            ours_lse = None
                            if out_lse is not None:
                                ours_lse = out_lse[b].index_select(0, hsel)[:, r0:r1]
                            stats[name].add(ours, ref, ours_lse, lse)
    return {name: stats[name].result() for name in outputs}, description, math_diff


def _reference_rows(case, qf, kf, vf, r0, r1, scale):
    """Output, LSE and causal mask (None when not causal) of query rows r0..r1 in fp32."""
    import torch
    sk = case.seqlen_k
    s = torch.matmul(qf[:, r0:r1], kf.transpose(1, 2)).mul_(scale)
    allowed = None
    if case.causal:
        i = torch.arange(r0, r1, device=gpu.DEVICE).unsqueeze(1)
        j = torch.arange(sk, device=gpu.DEVICE).unsqueeze(0)
        allowed = j <= i + (sk - case.seqlen_q)
        s.masked_fill_(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # exp(-inf - 0) = 0 on rows that see no key, so their output is 0
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = s.sub_(safe.unsqueeze(-1)).exp_()
    ref = torch.matmul(p, vf)
    del s, p
    return ref, lse, allowed


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
        print(f"warning: SDPA math cross-check of the reference failed: {short(e, 200)}",
              file=sys.stderr)
        return None
    diff = (o - ref).abs()[torch.isfinite(lse)]
    return float(diff.max().item()) if diff.numel() else 0.0
