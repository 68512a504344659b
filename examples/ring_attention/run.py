#!/usr/bin/env python3
"""Ring attention over N GPUs (torchrun) or simulated on one: checked against one flashjit call on
the whole sequence, then timed.

    # N GPUs of one host (NCCL; NVLink multicast stays off):
    torchrun --nproc-per-node 4 examples/ring_attention/run.py --seqlen 131072 --causal
    # one GPU, N ranks in lockstep (the same step code; no transfers):
    python3 examples/ring_attention/run.py --simulate 4 --seqlen 16384 --causal

Check (--check-seqlen tokens, fresh random inputs): out, LSE and dq, dk, dv of the ring against
flashjit.attention / attention_backward on one GPU, relative L2 error per tensor. Timing (the
ring's forward and forward + backward, CUDA events around --iters calls, median of --rounds):
TFLOPS of the whole sequence, and the efficiency against N x one GPU's TFLOPS on the same total
length (when it fits) and the share of the K/V transfers hidden under compute. Exits 1 when a check
fails.
"""

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

# A program that uses NVLink multicast can take the host's GPUs out of service: keep it off.
for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                    ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(name, value)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashjit  # noqa: E402
import ring_attention as ra  # noqa: E402
import zigzag  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def rel_l2(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def attention_flops(seqlen, heads, head_dim, batch, causal):
    flops = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return flops / 2 if causal else flops


def inputs(args, seqlen, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (args.batch, seqlen, args.heads, args.head_dim)
    return [torch.randn(shape, device=device, dtype=DTYPES[args.dtype], generator=g)
            for _ in range(4)]  # q, k, v, dout


def reference(q, k, v, dout, causal):
    out, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = flashjit.attention_backward(q, k, v, out, dout, lse, causal=causal)
    return out, lse, dq, dk, dv


def report_check(label, got, want, bound):
    names = ("out", "lse", "dq", "dk", "dv")
    errors = {n: rel_l2(g, w) for n, g, w in zip(names, got, want)}
    ok = all(e <= bound for e in errors.values())
    print(f"check {label}: " + " ".join(f"{n} {e:.2e}" for n, e in errors.items()) +
          f" (bound {bound:.0e}) {'pass' if ok else 'FAIL'}", flush=True)
    return ok


def time_ms(fn, iters, rounds):
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def simulated(args):
    device = torch.device("cuda")
    ok = True
    for causal in ([True] if args.causal else [False]) + ([False] if args.both else []):
        q, k, v, dout = inputs(args, args.check_seqlen, device, args.seed)
        want = reference(q, k, v, dout, causal)
        got = ra.simulate(q, k, v, dout, args.simulate, causal=causal)
        ok &= report_check(f"simulated ring of {args.simulate}, {args.check_seqlen} tokens, "
                           f"{'causal' if causal else 'full'}", got, want, args.bound)
    return ok


def distributed(args):
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    ok = True
    # Check: every rank makes the same whole-sequence inputs and compares its rows.
    q, k, v, dout = inputs(args, args.check_seqlen, device, args.seed)
    want = [ra.split_rows(x, world, rank, dim=2 if i == 1 else 1)
            for i, x in enumerate(reference(q, k, v, dout, args.causal))]
    parts = [ra.split_rows(x, world, rank).requires_grad_(i < 3) for i, x in
             enumerate((q, k, v, dout))]
    out, lse = ra.ring_attention(parts[0], parts[1], parts[2], causal=args.causal)
    out.backward(parts[3])
    ok &= report_check(f"rank {rank} of {world}, {args.check_seqlen} tokens",
                       (out, lse, parts[0].grad, parts[1].grad, parts[2].grad), want, args.bound)
    del q, k, v, dout, want, parts, out, lse
    # Timing on the long sequence: each rank makes only its own rows.
    c = zigzag.chunk_length(args.seqlen, world)
    shape = (args.batch, 2 * c, args.heads, args.head_dim)
    q, k, v, dout = (torch.randn(shape, device=device, dtype=DTYPES[args.dtype],
                                 requires_grad=i < 3) for i in range(4))
    flops = attention_flops(args.seqlen, args.heads, args.head_dim, args.batch, args.causal)

    def forward():
        return ra.ring_attention(q, k, v, causal=args.causal)[0]

    def train_step():
        out = forward()
        torch.autograd.grad(out, (q, k, v), dout)

    def compute_only():  # the same calls with the own K/V every step: what the ring adds is transfer
        steps = ra.forward_steps(q, k, v, world, rank, args.causal, 1.0 / math.sqrt(args.head_dim))
        try:
            sent = next(steps)
            while True:
                sent = steps.send(lambda s=sent: s)
        except StopIteration:
            pass

    for fn in (forward, train_step, compute_only):
        fn()
    dist.barrier()
    forward_ms = time_ms(forward, args.iters, args.rounds)
    train_ms = time_ms(train_step, args.iters, args.rounds)
    compute_ms = time_ms(compute_only, args.iters, args.rounds)
    kv_bytes = 2 * k.numel() * k.element_size()
    results = torch.tensor([forward_ms, train_ms, compute_ms], device=device)
    dist.all_reduce(results, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    forward_ms, train_ms, compute_ms = results.tolist()
    if rank == 0:
        print(f"ring of {world}: {args.seqlen} tokens, {args.heads} heads, d{args.head_dim}, "
              f"{'causal' if args.causal else 'full'}, {args.dtype}: forward {forward_ms:.3f} ms "
              f"({flops / forward_ms / 1e9:.0f} TFLOPS), forward + backward {train_ms:.3f} ms "
              f"({3.5 * flops / train_ms / 1e9:.0f} TFLOPS), forward compute alone "
              f"{compute_ms:.3f} ms, K/V per hop {kv_bytes / 2**20:.1f} MiB; transfers not hidden: "
              f"{max(forward_ms - compute_ms, 0.0) / forward_ms:.1%} of the forward", flush=True)
        if args.single:
            q1, k1, v1 = (torch.randn((args.batch, args.seqlen, args.heads, args.head_dim),
                                      device=device, dtype=DTYPES[args.dtype]) for _ in range(3))
            single_ms = time_ms(lambda: flashjit.attention(q1, k1, v1, causal=args.causal),
                                args.iters, args.rounds)
            print(f"one GPU: forward {single_ms:.3f} ms ({flops / single_ms / 1e9:.0f} TFLOPS); "
                  f"ring efficiency {single_ms / (world * forward_ms):.1%} of {world} x one GPU",
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--simulate", type=int, metavar="N",
                   help="run N ranks in lockstep on one GPU (check only) instead of torchrun's")
    p.add_argument("--seqlen", type=int, default=131072, help="timed sequence length")
    p.add_argument("--check-seqlen", type=int, default=4096, help="checked sequence length")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--both", action="store_true", help="--simulate: causal and full")
    p.add_argument("--single", action="store_true",
                   help="also time one GPU on the whole sequence (rank 0; it must fit)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--bound", type=float, default=1e-2,
                   help="largest relative L2 error of each checked tensor")
    args = p.parse_args()
    ok = simulated(args) if args.simulate else distributed(args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
