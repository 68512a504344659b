#!/usr/bin/env python3
"""The varlen backward beside the dense one and FA4's, in one process on one GPU.

A packed batch of causal (or full) sequences with lengths drawn from LO..HI (the forward varlen
grid's draw, tools/compare/varlen_cases.py), and its dense twin: batch x round(sqrt(mean L^2)),
about the same causal work. Timed, interleaved round-robin, each sample a burst of back-to-back
calls between two CUDA events (the harness's method, so no one's host path is measured):
  flashjit varlen   flashjit_backward_varlen on the packed batch (structs and workspace built once)
  flashjit dense    flashjit_backward on the dense twin
  FA4 varlen        torch.autograd.grad through flash_attn_varlen_func's output (backward alone)
  FA4 dense         the same through flash_attn_func on the dense twin
TFLOPS count 2.5x the forward's FLOPs over the pairs each side really computes (4 d h per
visible (query, key) pair). flashjit's varlen gradients are checked against FA4's (max |diff| /
max |FA4|), so a wrong result cannot pass as a fast one.

    PYTHONPATH=/tmp/site:... python3 tools/bench_varlen_backward.py --lib .devpack/libflashjit.so.0
"""

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashjit_ctypes as fj  # noqa: E402


def pairs(n, causal):
    return n * (n + 1) // 2 if causal else n * n


def burst_ms(fn, calls):
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main():
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lengths", default="128-8192")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--heads-kv", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--full", action="store_true", help="no causal mask")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-fa4", action="store_true")
    args = parser.parse_args()
    causal = not args.full
    lo, hi = (int(x) for x in args.lengths.split("-"))
    rng = random.Random(args.seed)
    lens = [rng.randint(lo, hi) for _ in range(args.batch)]
    twin = max(1, round(math.sqrt(sum(n * n for n in lens) / len(lens))))
    hq, hk, d = args.heads, args.heads_kv, args.head_dim
    dev = torch.device("cuda")
    lib = fj.Flashjit(fj.find_library(args.lib))
    engine = lib.create_engine(0)
    scale = 1.0 / math.sqrt(d)
    torch.manual_seed(args.seed)

    def tensors(total_q, total_k, batch=None):
        shape_q = (total_q, hq, d) if batch is None else (batch, total_q, hq, d)
        shape_k = (total_k, hk, d) if batch is None else (batch, total_k, hk, d)
        q = torch.randn(shape_q, device=dev, dtype=torch.bfloat16)
        k = torch.randn(shape_k, device=dev, dtype=torch.bfloat16)
        v = torch.randn(shape_k, device=dev, dtype=torch.bfloat16)
        return q, k, v, torch.randn_like(q)

    # --- flashjit varlen: forward (for out and LSE), then the backward's structs, built once.
    total = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=dev,
                      dtype=torch.int32)
    q, k, v, dout = tensors(total, total)
    out = torch.empty_like(q)
    lse = torch.empty((hq, total), device=dev, dtype=torch.float32)
    packed = [t.unsqueeze(0) for t in (q, k, v, out)]
    q_view, kv, out_view, varlen, fwd = engine.varlen_args(
        *packed, cu, max(lens), cu, max(lens), causal=causal, lse=lse.data_ptr())
    fwd_ws = engine.workspace_bytes_varlen_raw(q_view, kv, out_view, varlen, fwd)
    assert fwd_ws == 0, "a prefill forward does not split"
    engine.forward_varlen_raw(q_view, kv, out_view, varlen, fwd)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    views = [fj.tensor_from_torch(t.unsqueeze(0)) for t in (q, k, v, out, dout, dq, dk, dv)]
    bopt = engine.backward_options(causal, 0.0)
    size = engine.backward_workspace_bytes_varlen_raw(views[0], views[1], views[2], varlen, bopt)
    ws = torch.empty((size,), device=dev, dtype=torch.uint8)
    bopt = engine.backward_options(causal, 0.0, workspace=ws)
    variant = engine.select_backward_variant_varlen_raw(views[0], views[1], views[2], varlen, bopt)

    def fj_varlen():
        engine.backward_varlen_raw(views[0], views[1], views[2], views[3], views[4],
                                   lse.data_ptr(), views[5], views[6], views[7], varlen, bopt)

    # --- flashjit dense twin.
    tq, tk, tv, tdout = tensors(twin, twin, batch=len(lens))
    tout = torch.empty_like(tq)
    tlse = torch.empty((len(lens), hq, twin), device=dev, dtype=torch.float32)
    engine.forward(*(fj.tensor_from_torch(t) for t in (tq, tk, tv, tout)), causal=causal,
                   lse=tlse.data_ptr())
    tdq, tdk, tdv = (torch.empty_like(t) for t in (tq, tk, tv))
    tviews = [fj.tensor_from_torch(t) for t in (tq, tk, tv, tout, tdout, tdq, tdk, tdv)]
    topt = engine.backward_options(causal, 0.0)
    tsize = engine.backward_workspace_bytes_raw(tviews[0], tviews[1], tviews[2], topt)
    tws = torch.empty((tsize,), device=dev, dtype=torch.uint8)
    topt = engine.backward_options(causal, 0.0, workspace=tws)

    def fj_dense():
        engine.backward_raw(tviews[0], tviews[1], tviews[2], tviews[3], tviews[4],
                            tlse.data_ptr(), tviews[5], tviews[6], tviews[7], topt)

    impls = {"flashjit varlen": fj_varlen, "flashjit dense": fj_dense}
    work = {"flashjit varlen": sum(pairs(n, causal) for n in lens),
            "flashjit dense": len(lens) * pairs(twin, causal)}
    check = ""
    if not args.no_fa4:
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
            fq, fk, fv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            fout = flash_attn_varlen_func(fq, fk, fv, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                          max_seqlen_q=max(lens), max_seqlen_k=max(lens),
                                          softmax_scale=scale, causal=causal)
            fout = fout[0] if isinstance(fout, tuple) else fout
            ref = torch.autograd.grad(fout, (fq, fk, fv), dout, retain_graph=True)
            fj_varlen()
            torch.cuda.synchronize()
            errs = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                    for a, b in zip((dq, dk, dv), ref)]
            check = "flashjit varlen vs FA4 varlen grads (max|diff|/max|FA4|): dq {:.2e} dk {:.2e} dv {:.2e}".format(*errs)
            gq, gk, gv = (t.detach().clone().requires_grad_(True) for t in (tq, tk, tv))
            gout = flash_attn_func(gq, gk, gv, softmax_scale=scale, causal=causal)
            gout = gout[0] if isinstance(gout, tuple) else gout
            impls["FA4 varlen"] = lambda: torch.autograd.grad(fout, (fq, fk, fv), dout,
                                                              retain_graph=True)
            impls["FA4 dense"] = lambda: torch.autograd.grad(gout, (gq, gk, gv), tdout,
                                                             retain_graph=True)
            work["FA4 varlen"], work["FA4 dense"] = work["flashjit varlen"], work["flashjit dense"]
        except Exception as e:  # FA4 absent or refusing: report and go on without it
            print(f"FA4 not timed: {type(e).__name__}: {e}")

    # Warm up, then size each burst to ~20 ms of GPU time.
    calls = {}
    for name, fn in impls.items():
        fn()
        torch.cuda.synchronize()
        once = burst_ms(fn, 2)
        calls[name] = max(2, int(20 / max(once, 1e-3)))
    samples = {name: [] for name in impls}
    names = list(impls)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(burst_ms(impls[name], calls[name]))
    print(f"{torch.cuda.get_device_name()}: varlen backward, {len(lens)} {'causal' if causal else 'full'} "
          f"sequences of {args.lengths} (seed {args.seed}, total {total}), dense twin {len(lens)} x "
          f"{twin}; hq {hq} hkv {hk} d {d} bf16; flashjit {variant}")
    print(f"timing: median of {args.rounds} interleaved bursts (~20 ms each) between CUDA events")
    if check:
        print(check)
    tflops = {}
    for name in impls:
        ms = statistics.median(samples[name])
        tflops[name] = 2.5 * 4 * d * hq * work[name] / (ms * 1e-3) / 1e12
        print(f"  {name:<16} {ms:9.3f} ms  {tflops[name]:6.1f} TFLOPS  ({calls[name]} calls a burst; "
              f"samples {min(samples[name]):.3f}..{max(samples[name]):.3f})")
    print(f"flashjit varlen / flashjit dense: {tflops['flashjit varlen'] / tflops['flashjit dense']:.3f}")
    if "FA4 varlen" in tflops:
        print(f"flashjit varlen / FA4 varlen: {tflops['flashjit varlen'] / tflops['FA4 varlen']:.3f}; "
              f"FA4 varlen / FA4 dense: {tflops['FA4 varlen'] / tflops['FA4 dense']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
