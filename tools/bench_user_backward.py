#!/usr/bin/env python3
"""The backward of user functions: flashjit (CUDA C mask_mod / score_mod with its derivative,
through the Python package's autograd) against the same backward without them and against
FlexAttention (torch.compile) with the same functions in Python, on one long causal sequence.

    PYTHONPATH=python FLASHJIT_LIBRARY=.devpack/libflashjit.so.0 \
        python3 tools/bench_user_backward.py --seqlen 16384 --heads 16 --head-dim 128

Cases (bf16, BSHD, causal, bottom-right): plain; a document mask over --documents documents of
random lengths (ids from a tensor; the backward evaluates it score by score on every causal tile,
FlexAttention skips the tiles its BlockMask hides); the same with flashjit's block mask made
with backward=True (its backward skips the hidden tiles too); a relative-position bias from a table
[heads, 2 --max-distance + 1] (flashjit's derivative: 1). Each backend's gradients are checked
against FlexAttention's before timing (max |diff| / max |Flex|). Timed: the backward alone,
torch.autograd.grad over a kept graph, in bursts of back-to-back calls between CUDA events after a
spin (compare.timing), repetitions interleaved round-robin, medians. TFLOPS count 2.5x the
forward's FLOPs over the (query, key) pairs the case lets through.
"""

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import gpu  # noqa: E402
from compare.timing import CudaTimer, burst, round_robin  # noqa: E402

DOC_MASK = """
__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {
  const int* doc = static_cast<const int*>(a.ptr[0]);
  return doc[q] == doc[k];
}"""
RELATIVE_BIAS = """
__device__ float score_mod(float score, int b, int h, int q, int k, const flashjit::UserArgs& a) {
  const float* table = static_cast<const float*>(a.ptr[0]);
  const int d = min(max(q - k, -MAX_DISTANCE), MAX_DISTANCE);
  return score + table[h * (2 * MAX_DISTANCE + 1) + d + MAX_DISTANCE];
}"""
RELATIVE_BIAS_GRAD = """
__device__ float score_mod_grad(float score, int b, int h, int q, int k,
                                const flashjit::UserArgs& a) {
  return 1.f;
}"""


def main():
    import torch
    import flashjit
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--max-distance", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--burst-ms", type=float, default=20.0)
    args = parser.parse_args()
    n, h, d, r = args.seqlen, args.heads, args.head_dim, args.max_distance
    dev = torch.device("cuda")
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, n, h, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
    cuts = torch.randperm(n - 1)[:args.documents - 1].sort().values + 1
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([n])]))
    doc = torch.repeat_interleave(torch.arange(args.documents), lengths).to(torch.int32).to(dev)
    table = torch.randn(h, 2 * r + 1, device=dev)
    causal_pairs = n * (n + 1) // 2
    doc_pairs = sum(int(x) * (int(x) + 1) // 2 for x in lengths)

    masking = flashjit.UserFunctions(mask_mod=DOC_MASK)
    define = f"constexpr int MAX_DISTANCE = {r};\n"
    biasing = flashjit.UserFunctions(score_mod=define + RELATIVE_BIAS,
                                     score_mod_grad=RELATIVE_BIAS_GRAD)

    def doc_mask(b, hh, qi, ki):
        return (doc[qi] == doc[ki]) & (ki <= qi)

    def causal_mask(b, hh, qi, ki):
        return ki <= qi

    def relative(score, b, hh, qi, ki):
        return score + table[hh, (qi - ki).clamp(-r, r) + r]

    # flashjit's block mask for the document mask, with the backward's maps (session 18): the
    # forward and the backward skip the tiles it hides.
    fj_blocks = flashjit.create_block_mask(q, k, v, user_functions=masking, user_args=[doc],
                                           causal=True, same_for_all_heads=True, backward=True)
    flex = torch.compile(flex_attention, fullgraph=True)
    causal_blocks = create_block_mask(causal_mask, None, None, n, n, device=dev)
    doc_blocks = create_block_mask(doc_mask, None, None, n, n, device=dev)
    cases = {
        "causal": (dict(), dict(block_mask=causal_blocks), causal_pairs),
        "document mask": (dict(user_functions=masking, user_args=[doc]),
                          dict(block_mask=doc_blocks), doc_pairs),
        "doc mask+blocks": (dict(user_functions=masking, user_args=[doc], block_mask=fj_blocks),
                            dict(block_mask=doc_blocks), doc_pairs),
        "relative bias": (dict(user_functions=biasing, user_args=[table]),
                          dict(score_mod=relative, block_mask=causal_blocks), causal_pairs),
    }

    impls, work, grads, notes = {}, {}, {}, []
    for case, (fj_kwargs, flex_kwargs, pairs) in cases.items():
        for backend in ("flashjit", "FlexAttention"):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            if backend == "flashjit":
                out = flashjit.attention(*leaves, causal=True, **fj_kwargs)
            else:
                out = flex(*(t.transpose(1, 2) for t in leaves), **flex_kwargs).transpose(1, 2)
            key = (backend, case)

            def call(out=out, leaves=leaves):
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)

            grads[key] = call()
            impls[key], work[key] = call, pairs
        errors = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                  for a, b in zip(grads[("flashjit", case)], grads[("FlexAttention", case)])]
        notes.append(f"{case}: flashjit vs FlexAttention grads dq {errors[0]:.2e} "
                     f"dk {errors[1]:.2e} dv {errors[2]:.2e}")
    timer = CudaTimer()
    bursts, spins = {}, {}
    for key, fn in impls.items():
        fn()
        gpu.sync()
        handle = timer.launch(burst(fn, 2))
        gpu.sync()
        once = timer.elapsed_ms(handle) / 2
        calls = max(2, int(args.burst_ms / max(once, 1e-3)))
        bursts[key] = (burst(fn, calls), calls)
        spins[key] = timer.cycles_for(args.burst_ms)
    samples = round_robin({key: b[0] for key, b in bursts.items()},
                          {key: args.rounds for key in impls}, timer, spins)
    print(f"{torch.cuda.get_device_name()}: backward alone, 1 x {n} causal, {h} heads, d {d}, "
          f"bf16; {args.documents} documents; median of {args.rounds} interleaved bursts")
    for note in notes:
        print(note)
    ms = {key: statistics.median(s) / bursts[key][1] for key, s in samples.items()}
    for case in cases:
        line = [f"{case:<14}"]
        for backend in ("flashjit", "FlexAttention"):
            key = (backend, case)
            tflops = 2.5 * 4 * d * h * work[key] / (ms[key] * 1e-3) / 1e12
            line.append(f"{backend} {ms[key]:8.3f} ms ({tflops:5.1f} TFLOPS)")
        line.append(f"flashjit / Flex time {ms[('flashjit', case)] / ms[('FlexAttention', case)]:.3f}")
        line.append(f"flashjit / its causal {ms[('flashjit', case)] / ms[('flashjit', 'causal')]:.3f}")
        print("  ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
