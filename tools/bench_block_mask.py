#!/usr/bin/env python3
"""A document mask (examples/user_functions/document_mask.cu) with and without a block mask, per
kernel family, side by side: what skipping the hidden key tiles buys each family.

    PYTHONPATH=python FLASHJIT_LIBRARY=.devpack/libflashjit.so.0 python3 tools/bench_block_mask.py \
        --seqlen 8192 --heads 16 --head-dim 128 --documents 16 --families auto mma

One causal sequence packed with --documents documents of random lengths. Each (family, block
mask) output is checked against the first one (bf16: max |diff| / max |out| < 2e-2), then timed
as in tools/bench_tiles.py: bursts between CUDA events, interleaved, medians.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from compare.same_output import print_agreement  # noqa: E402
from compare.timing import CudaTimer, per_call_ms  # noqa: E402

DOCUMENT_MASK = Path(__file__).resolve().parent.parent / "examples/user_functions/document_mask.cu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--families", nargs="+", default=["auto", "mma"])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()

    import torch
    import flashjit

    torch.manual_seed(18)
    n = args.seqlen
    cuts = sorted(torch.randperm(n - 1)[:args.documents - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    doc_ids = torch.repeat_interleave(torch.arange(args.documents, dtype=torch.int32),
                                      torch.tensor(lengths)).cuda()
    q, k, v = (torch.randn(1, n, args.heads, args.head_dim, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))
    functions = flashjit.UserFunctions(mask_mod=DOCUMENT_MASK.read_text())
    pairs = sum(length * (length + 1) // 2 for length in lengths)
    flops = 4.0 * pairs * args.head_dim * args.heads

    runs, outputs = {}, {}
    for family in args.families:
        forced = None if family == "auto" else family
        common = dict(causal=True, user_functions=functions, user_args=[doc_ids], family=forced)
        mask = flashjit.create_block_mask(q, k, v, same_for_all_heads=True,
                                          same_for_all_batches=True, **common)
        for name, kwargs in ((f"{family}", common), (f"{family} + block mask",
                                                     dict(common, block_mask=mask))):
            runs[name] = (lambda kw=kwargs: flashjit.attention(q, k, v, **kw))
            outputs[name] = runs[name]()
        counts = mask.counts()
        print(f"{family}: {mask.variant}: block mask {counts['full']} full + "
              f"{counts['partial']} partial of {counts['total']} tiles")
    torch.cuda.synchronize()
    if not print_agreement(outputs, lambda name: f"{name:<28}"):
        return 1

    timer = CudaTimer()
    samples = per_call_ms(runs, args.calls, args.reps, timer)
    print(f"s{n} h{args.heads} d{args.head_dim} causal, {args.documents} documents "
          f"({min(lengths)}-{max(lengths)} tokens): median of {args.reps} interleaved bursts")
    for name in runs:
        ms = statistics.median(samples[name])
        print(f"{name:<28} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOPS (over the pairs kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
