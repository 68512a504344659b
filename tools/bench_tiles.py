#!/usr/bin/env python3
"""One forward problem under several forced tile shapes, side by side: which shape a tile table
should give it (e.g. a sliding window, whose rows see far fewer keys than seqlen_k says).

    PYTHONPATH=python FLASHJIT_LIBRARY=.devpack/libflashjit.so.0 python3 tools/bench_tiles.py \
        --seqlen 32768 --heads 32 --head-dim 128 --causal --window 4096 \
        --tiles auto 128x128x2 128x176x2 128x160x2

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


def variant_name(engine, views, out_view, options):
    """The variant flashjit_forward runs for these structs (Engine.select_variant takes no
    window)."""
    import ctypes
    buf = ctypes.create_string_buffer(256)
    engine.owner.check("flashjit_select_variant", engine.lib.flashjit_select_variant(
        engine.handle, *(ctypes.byref(t) for t in (*views, out_view)), ctypes.byref(options),
        buf, len(buf)))
    return buf.value.decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=0, help="0: --heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window", type=int, default=-1, help="window_left (-1: none)")
    parser.add_argument("--tiles", nargs="+", default=["auto"],
                        help="auto (the dispatcher's) or MxNxS, e.g. 128x176x2")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed burst")
    args = parser.parse_args()

    import torch
    from flashjit import _capi, ops

    torch.manual_seed(0)
    heads_kv = args.heads_kv or args.heads
    shape_q = (args.batch, args.seqlen, args.heads, args.head_dim)
    shape_kv = (args.batch, args.seqlen, heads_kv, args.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    engine, _ = ops._engine(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    views = [_capi.tensor_from_torch(t) for t in (q, k, v)]
    window = (args.window, 0 if args.causal else -1) if args.window >= 0 else (-1, -1)

    runs, outputs, names = {}, {}, {}
    for spec in args.tiles:
        tiles = None if spec == "auto" else tuple(int(x) for x in spec.split("x"))
        out = torch.full_like(q, float("nan"))
        options = engine.options(args.causal, 0.0, None, None, tiles, window=window)
        out_view = _capi.tensor_from_torch(out)
        names[spec] = variant_name(engine, views, out_view, options)
        runs[spec] = (lambda o=options, ov=out_view: engine.forward_raw(*views, ov, o, stream))
        runs[spec]()
        outputs[spec] = out
    torch.cuda.synchronize()
    if not print_agreement(outputs, lambda spec: f"{spec:>10} {names[spec]:<48}"):
        return 1

    timer = CudaTimer()
    pairs = visible_pairs(args.seqlen, args.seqlen, args.causal, args.window)
    flops = 4.0 * pairs * args.head_dim * args.heads * args.batch
    samples = per_call_ms(runs, args.calls, args.reps, timer)
    first = statistics.median(samples[args.tiles[0]])
    print(f"b{args.batch} s{args.seqlen} h{args.heads}/{heads_kv} d{args.head_dim} "
          f"{'causal ' if args.causal else ''}window {args.window}: median of {args.reps} "
          f"interleaved bursts of {args.calls}")
    for spec in runs:
        ms = statistics.median(samples[spec])
        print(f"{spec:>10} {names[spec]:<48} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOPS "
              f"{first / ms:6.3f}x {args.tiles[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
