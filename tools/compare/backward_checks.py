"""Correctness of the backward: dq, dk, dv against float32 reference gradients on the same
inputs, computed by autograd through the math attention in float32."""

from . import gpu
from .checks import REFERENCE_CHUNK, DiffStats, ieee_fp32_matmul

# Bounds on max |g - ref| / max |ref| per gradient: those of the C++ GPU tests
# (tests/reference/compare_backward.hpp, kGradientTolerance*), so the harness and the test suite
# agree on what passes. Gradients go through more rounding than the output (P and dS rounded to
# 16 bits before their matmuls, dQ summed in fp32 over every key tile).
GRADIENT_TOLERANCES = {"bf16": 2.5e-2, "fp16": 6e-3}
GRADIENTS = ("dq", "dk", "dv")
MAX_PAIRS = 64  # (batch, kv head) pairs one case checks at most: a reference step per pair


def plan_backward_check(case, budget):
    """(the (batch, kv head) pairs to check, description). dk and dv need every query row of
    their group, so the reference samples whole KV heads (each with all the query heads of its
    group, all rows) and never rows; at least the first and the last pair, more up to `budget`
    score elements (heads x rows x keys), MAX_PAIRS at most."""
    group = case.heads_q // case.heads_kv
    per_pair = group * case.seqlen_q * case.seqlen_k
    total = case.batch * case.heads_kv
    n = max(2, min(total, MAX_PAIRS, budget // max(1, per_pair)))
    if n >= total:
        return [(b, h) for b in range(case.batch) for h in range(case.heads_kv)], \
            "all heads, all rows"
    flat = sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})
    pairs = [(i // case.heads_kv, i % case.heads_kv) for i in flat]
    return pairs, (f"{len(pairs)} of {total} (batch, kv head) pairs, each with its "
                   f"{group} query head{'s' if group > 1 else ''}, all rows")


def _math_attention(qf, kf, vf, r0, case, scale):
    """out of query rows r0.. (qf [g, rows, d], kf/vf [1 or g, s_k, d], fp32, autograd
    tracked): softmax(q k^T * scale) v with the bottom-right causal mask; rows that see no key
    give 0 (and no NaN gradient)."""
    import torch
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if case.causal:
        i = torch.arange(r0, r0 + qf.shape[-2], device=qf.device).unsqueeze(1)
        j = torch.arange(case.seqlen_k, device=qf.device).unsqueeze(0)
        allowed = j <= i + (case.seqlen_k - case.seqlen_q)
        empty = ~allowed.any(dim=-1, keepdim=True)
        s = s.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vf)


def reference_gradients(case, q, k, v, dout, scale, b, h):
    """fp32 (dq [s_q, g, d], dk [s_k, d], dv [s_k, d]) of batch b, KV head h: autograd of the
    math attention over query row blocks (rows are independent: a block's dq is exact, its dk
    and dv are summed over blocks), each block bounded by REFERENCE_CHUNK score elements."""
    import torch
    g = case.heads_q // case.heads_kv
    heads = slice(h * g, (h + 1) * g)
    kf = k[b, :, h].float().unsqueeze(0).detach().requires_grad_(True)  # [1, s_k, d]
    vf = v[b, :, h].float().unsqueeze(0).detach().requires_grad_(True)
    qall = q[b, :, heads].detach().float().permute(1, 0, 2)               # [g, s_q, d]
    doall = dout[b, :, heads].detach().float().permute(1, 0, 2)
    rows = max(1, REFERENCE_CHUNK // (g * case.seqlen_k))
    dq = torch.empty_like(qall)
    dk = torch.zeros(case.seqlen_k, case.head_dim, dtype=torch.float32, device=gpu.DEVICE)
    dv = torch.zeros_like(dk)
    for r0 in range(0, case.seqlen_q, rows):
        qf = qall[:, r0:r0 + rows].clone().requires_grad_(True)
        out = _math_attention(qf, kf, vf, r0, case, scale)
        gq, gk, gv = torch.autograd.grad(out, (qf, kf, vf), doall[:, r0:r0 + rows])
        dq[:, r0:r0 + rows] = gq
        dk += gk[0]
        dv += gv[0]
        del out, gq, gk, gv
    return dq.permute(1, 0, 2), dk, dv


class GradientStats(DiffStats):
    """DiffStats of one gradient over the checked heads, judged by max error / max |ref|."""

    def result(self):
        """max_abs_err / max|ref| (what the bound applies to; a reference of zeros: the error
        itself), the relative L2 error (for information), non-finite count, pass."""
        rel_max = self.max_abs / self.max_ref if self.max_ref > 0 else self.max_abs
        rel_l2 = self.rel_l2()
        bound = GRADIENT_TOLERANCES[self.dtype]
        return {"rel_max_err": rel_max, "max_abs_err": self.max_abs, "max_abs_ref": self.max_ref,
                "rel_l2_err": rel_l2, "nonfinite": self.nonfinite, "elements": self.elements,
                "bound": bound, "pass": bool(rel_max <= bound and self.nonfinite == 0)}


def gradient_check(case, q, k, v, dout, scale, gradients, budget):
    """Every implementation's gradients against one fp32 reference per checked (batch, kv head).

    gradients: {name: (dq [b, s_q, h_q, d], dk [b, s_k, h_kv, d], dv)} in any dtype (GQA: dk
    and dv already summed over each group's query heads). Returns ({name: {'dq': ..., 'dk': ...,
    'dv': ..., 'pass': all three pass, 'worst': the largest rel_max_err}}, what was checked)."""
    import torch
    pairs, description = plan_backward_check(case, budget)
    g = case.heads_q // case.heads_kv
    stats = {name: {x: GradientStats(case.dtype) for x in GRADIENTS} for name in gradients}
    with ieee_fp32_matmul():
        for b, h in pairs:
            with torch.enable_grad():
                ref = reference_gradients(case, q, k, v, dout, scale, b, h)
            with torch.no_grad():
                for name, (dq, dk, dv) in gradients.items():
                    ours = (dq[b, :, h * g:(h + 1) * g], dk[b, :, h], dv[b, :, h])
                    for x, o, r in zip(GRADIENTS, ours, ref):
                        stats[name][x].add(o, r)
            del ref
    results = {}
    for name, per in stats.items():
        cell = {x: per[x].result() for x in GRADIENTS}
        cell["pass"] = all(cell[x]["pass"] for x in GRADIENTS)
        cell["worst"] = max(cell[x]["rel_max_err"] for x in GRADIENTS)
        cell["nonfinite"] = sum(cell[x]["nonfinite"] for x in GRADIENTS)
        results[name] = cell
    return results, description
