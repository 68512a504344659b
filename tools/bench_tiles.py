#!/usr/bin/env python3
"""One forward problem under several forced tile shapes, side by side: which shape a tile table
should give it (e.g. a sliding window, whose rows see far fewer keys than seqlen_k says).

    PYTHONPATH=python FLASHJIT_LIBRARY=.devpack/libflashjit.so.0 python3 tools/bench_tiles.py \
        --seqlen 32768 --heads 32 --head-dim 128 --causal --window 4096 \
        --tiles auto 128x128x2 128x176x2 128x160x2

A chunk of queries over a paged cache (--seqlen-q, --page-size: NHD pages behind a shuffled
page table), with --dense-too the same shapes over the dense cache it copies and with
--in-order-too over pages in sequence order, in the same run:

    ... tools/bench_tiles.py --batch 8 --seqlen-q 512 --seqlen 8192 --heads 32 --heads-kv 8 \
        --causal --page-size 16 --dense-too --tiles auto 128x128x2 128x128x3

Each shape's output is checked against the dispatcher's choice ("auto") before timing (max |diff|
relative to the largest output value, bf16: < 2e-2). Timing as in the grids (tools/compare):
a few back-to-back calls between two CUDA events after a GPU spin covering their enqueue, the
shapes' samples interleaved round-robin, medians compared; TFLOPS over the (query, key) pairs the
mask lets through.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from compare.same_output import print_agreement  # noqa: E402
from compare.timing import CudaTimer, per_call_ms  # noqa: E402


def visible_pairs(seqlen_q, seqlen_k, causal, window_left):
    """(query, key) pairs seen, bottom-right aligned, window_left keys back (-1: unbounded)."""
    total = 0
    for i in range(seqlen_q):
        last = i + seqlen_k - seqlen_q if causal else seqlen_k - 1
        first = 0 if window_left < 0 else max(0, i + seqlen_k - seqlen_q - window_left)
        total += max(0, min(last, seqlen_k - 1) - first + 1)
    return total


def paged_copy(k, v, page_size, generator, shuffled=True):
    """k and v [batch, seqlen, heads_kv, d] copied into NHD pages [batch * seqlen / page_size,
    page_size, heads_kv, d] in a shuffled order (else in sequence order: the dense layout behind a
    page table), and the int32 page table [batch, pages]."""
    import torch
    batch, seqlen = k.shape[0], k.shape[1]
    if seqlen % page_size:
        raise SystemExit(f"--seqlen {seqlen} is not a multiple of --page-size {page_size}")
    per_seq = seqlen // page_size
    order = (torch.randperm(batch * per_seq, generator=generator) if shuffled
             else torch.arange(batch * per_seq)).to(k.device)
    table = order.view(batch, per_seq).to(torch.int32).contiguous()
    pages = []
    for t in (k, v):
        pool = torch.empty((batch * per_seq, page_size) + tuple(t.shape[2:]), dtype=t.dtype,
                           device=t.device)
        pool[order] = t.reshape((batch * per_seq, page_size) + tuple(t.shape[2:]))
        pages.append(pool)
    return pages[0], pages[1], table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seqlen", type=int, default=32768, help="keys (and queries)")
    parser.add_argument("--seqlen-q", type=int, default=0, help="queries (0: --seqlen)")
    parser.add_argument("--page-size", type=int, default=0,
                        help="rows per page of a paged KV cache (0: dense)")
    parser.add_argument("--dense-too", action="store_true",
                        help="with --page-size: each shape over the dense cache as well")
    parser.add_argument("--in-order-too", action="store_true",
                        help="with --page-size: each shape over pages in sequence order as well "
                             "(what the shuffle costs)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=0, help="0: --heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window", type=int, default=-1, help="window_left (-1: none)")
    parser.add_argument("--softcap", type=float, default=0.0, help="logit soft-cap (0: none)")
    parser.add_argument("--family", default=None,
                        help="the kernel family every shape runs in (default: the dispatcher's), "
                             "e.g. decode: the cp.async decode kernel sm_80..89 run")
    parser.add_argument("--tiles", nargs="+", default=["auto"],
                        help="auto (the dispatcher's) or MxNxS, e.g. 128x176x2")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed burst")
    args = parser.parse_args()

    import torch
    from flashjit import ops

    generator = torch.manual_seed(0)
    heads_kv = args.heads_kv or args.heads
    seqlen_q = args.seqlen_q or args.seqlen
    shape_q = (args.batch, seqlen_q, args.heads, args.head_dim)
    shape_kv = (args.batch, args.seqlen, heads_kv, args.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    engine, _ = ops._engine(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    window = (args.window, 0 if args.causal else -1) if args.window >= 0 else (-1, -1)
    # The caches each shape runs over: (label suffix, k, v, page table).
    caches = [("", k, v, None)]
    if args.page_size:
        caches = [(f" p{args.page_size}", *paged_copy(k, v, args.page_size, generator))]
        if args.in_order_too:
            caches.append((f" p{args.page_size} in order",
                           *paged_copy(k, v, args.page_size, generator, shuffled=False)))
        if args.dense_too:
            caches.append((" dense", k, v, None))

    runs, outputs, names = {}, {}, {}
    keep = []  # the structs and tensors the runs point into
    for spec in args.tiles:
        tiles = None if spec == "auto" else tuple(int(x) for x in spec.split("x"))
        for suffix, k_cache, v_cache, table in caches:
            label = spec + suffix
            out = torch.full_like(q, float("nan"))
            structs = engine.kv_args(q, k_cache, v_cache, out, table, None, args.causal,
                                     family=args.family, tiles=tiles, window=window,
                                     softcap=args.softcap)
            keep.append((structs, out, k_cache, v_cache, table))
            names[label] = engine.select_variant_kv_raw(*structs)
            runs[label] = (lambda s=structs: engine.forward_kv_raw(*s, stream))
            runs[label]()
            outputs[label] = out
    torch.cuda.synchronize()
    if not print_agreement(outputs, lambda label: f"{label:>16} {names[label]:<52}"):
        return 1

    timer = CudaTimer()
    pairs = visible_pairs(seqlen_q, args.seqlen, args.causal, args.window)
    flops = 4.0 * pairs * args.head_dim * args.heads * args.batch
    samples = per_call_ms(runs, args.calls, args.reps, timer)
    baseline = next(iter(runs))
    first = statistics.median(samples[baseline])
    print(f"b{args.batch} q{seqlen_q} k{args.seqlen} h{args.heads}/{heads_kv} d{args.head_dim} "
          f"{'causal ' if args.causal else ''}window {args.window}"
          f"{f' softcap {args.softcap:g}' if args.softcap else ''}"
          f"{f' pages of {args.page_size}' if args.page_size else ''}: median of {args.reps} "
          f"interleaved bursts of {args.calls}")
    for label in runs:
        ms = statistics.median(samples[label])
        print(f"{label:>16} {names[label]:<52} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOPS "
              f"{first / ms:6.3f}x {baseline}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
