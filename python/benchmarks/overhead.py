"""Host time per forward call: flashjit.attention against a direct C API call through ctypes.

Same problem (a small one, so the GPU never holds the host back), warm cache and launch plan.
The direct call reuses prebuilt structs and a preallocated output: the C API's own cost
(validation, plan lookup, cuLaunchKernelEx). The package's calls add what Python pays: argument
checks, output allocation by torch, struct building, torch's custom-op dispatch. Each figure is
the median over batches of back-to-back calls, host clock only (the batch's launches are
queued, then the GPU drained between batches), the rows' batches interleaved round by round; a
row's excess is the median of its per-round difference to the C API's batch. Target:
flashjit.attention <= 15 us over the direct call.

    PYTHONPATH=python FLASHJIT_LIBRARY=/path/libflashjit.so.0 python3 python/benchmarks/overhead.py
"""

import argparse
import statistics
import time

import torch

import flashjit
from flashjit import _capi, ops

BUDGET_US = 15.0


def batch_us(fn, calls):
    """Host time per call of one batch of back-to-back calls; the GPU drained after it."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return elapsed


def interleaved_us(fns, calls, rounds):
    """Per function, the batch times of `rounds` rounds, each round timing one batch of every
    function in turn: the host's speed drifts between processes and over seconds (2x seen on the
    GPU machine), so the functions compared are timed side by side."""
    for fn in fns:  # warm: compile, load, launch plan, allocator
        batch_us(fn, calls)
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            samples[i].append(batch_us(fn, calls))
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per batch")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out = torch.empty_like(q)
    engine, index = ops._engine(q.device)
    views = [_capi.tensor_from_torch(t) for t in (q, k, v, out)]
    options = engine.options(args.causal)
    stream = torch.cuda.current_stream().cuda_stream

    rows = [
        ("C API (ctypes, prebuilt structs)",
         lambda: engine.forward_raw(*views, options, stream)),
        ("flashjit.attention",
         lambda: flashjit.attention(q, k, v, causal=args.causal)),
        ("  torch.ops.flashjit.attention",
         lambda: torch.ops.flashjit.attention(q, k, v, args.causal, 0.0, False, -1, -1, 0.0,
                                              None, None, 0, None, None, [], [], 0, False)),
        ("  its implementation, no dispatch",
         lambda: ops._run_attention(q, k, v, args.causal, 0.0, False, -1, -1, 0.0, None,
                                    None, 0, None, None, [], [], 0, False)),
        ("flashjit.attention, return_lse",
         lambda: flashjit.attention(q, k, v, causal=args.causal, return_lse=True)),
    ]
    assert torch.equal(flashjit.attention(q, k, v, causal=args.causal),
                       (engine.forward_raw(*views, options, stream), out)[1])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, libflashjit "
          f"{flashjit.library().path}; b1 s128 h2 d64 bf16{' causal' if args.causal else ''}, "
          f"{args.batches} rounds of {args.calls} calls per row, median host time per call")
    samples = interleaved_us([fn for _, fn in rows], args.calls, args.batches)
    times = {name: statistics.median(s) for (name, _), s in zip(rows, samples)}
    # Each row's excess over the C API, round by round (same moment, same host speed).
    added_by_round = {name: statistics.median(t - c for t, c in zip(s, samples[0]))
                      for (name, _), s in zip(rows, samples)}
    for name, _ in rows:
        extra = "" if name == rows[0][0] else f"  (+{added_by_round[name]:.1f} us)"
        print(f"{name:<40}{times[name]:8.1f} us{extra}")
    added = added_by_round["flashjit.attention"]
    verdict = "PASS" if added <= BUDGET_US else "FAIL"
    print(f"{verdict}: flashjit.attention adds {added:.1f} us per call over the C API "
          f"(budget {BUDGET_US:.0f} us)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
