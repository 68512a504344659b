#!/usr/bin/env python3
"""Where a backward call's time goes, kernel by kernel: flashjit (its prep, dK/dV (+dQ) and
convert kernels), SDPA cuDNN and FA4 on the same backward cases, each call's kernels recorded by
torch.profiler (CUPTI), next to the call's elapsed time between CUDA events. The difference is
what no kernel of the call ran: launch gaps and host time between them.

    LD_LIBRARY_PATH=.devpack python3 tools/bwd_kernel_times.py --lib .devpack/libflashjit.so.0 \
        --case bwd:32,32,32,512,512,64,1 --case bwd:2,16,16,8192,8192,128,0

Per case and backend: each kernel's name (shortened), its microseconds per call and launches per
call, their sum, the elapsed microseconds per call (median of --rounds bursts of --calls calls,
interleaved round-robin with the other backends as compare_sdpa.py times them),
and the gap. The elapsed times are taken as compare_sdpa.py takes them; the kernel times come
from a separate profiled burst (the profiler adds its own cost per launch to the call, not to the
kernels' durations): this says which kernel to look at, compare_sdpa.py gives the ratios.
"""

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashjit_ctypes as fj  # noqa: E402
from compare import gpu  # noqa: E402
from compare.backward_backends import (BackwardInputs, Fa4BackwardRunner,  # noqa: E402
                                       FlashjitBackwardRunner, FlashjitForward,
                                       SdpaBackwardRunner)
from compare.backward_cases import parse_backward_case  # noqa: E402
from compare.timing import CudaTimer, per_call_ms  # noqa: E402


def kernel_times(fn, calls):
    """{kernel name: (microseconds per call, launches per call)} of `calls` calls of fn."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():  # GPU-side events: kernels, memsets, copies
        if str(event.device_type).endswith("CUDA"):
            totals[event.name] += event.time_range.elapsed_us()
            counts[event.name] += 1
    return {name: (totals[name] / calls, counts[name] / calls) for name in totals}


def short(name, width=70):
    name = name.split("(")[0]
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="libflashjit path")
    ap.add_argument("--case", action="append", required=True,
                    help="bwd:B,HQ,HKV,SQ,SK,D,CAUSAL[,DTYPE] (repeatable)")
    ap.add_argument("--calls", type=int, default=20, help="calls per burst and per profile")
    ap.add_argument("--rounds", type=int, default=5, help="timed bursts of each (median)")
    ap.add_argument("--no-fa4", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    try:
        cases = [parse_backward_case(text) for text in args.case]
    except ValueError as e:
        raise SystemExit(str(e)) from None

    engine = fj.Flashjit(args.lib).create_engine(0)
    timer = CudaTimer()
    for index, case in enumerate(cases):
        scale = case.head_dim ** -0.5
        inputs = BackwardInputs(case, args.seed + index)
        runners = {}
        forward = FlashjitForward(engine, case, inputs, scale)
        runners["flashjit"] = FlashjitBackwardRunner(engine, case, inputs, forward, "auto", scale)
        cudnn = SdpaBackwardRunner("cudnn", case, inputs, scale)
        if cudnn.error is None:
            runners["cudnn"] = cudnn
        if not args.no_fa4:
            fa4 = Fa4BackwardRunner(case, inputs, scale)
            if fa4.error is None:
                runners["fa4"] = fa4
            else:
                print(f"  fa4: {fa4.error}")
        print(f"== {case.label()}", flush=True)
        for runner in runners.values():  # first calls compile and load
            runner()
        gpu.sync()
        # Bursts of back-to-back calls, interleaved round-robin (the harness's timing).
        elapsed = per_call_ms(runners, args.calls, args.rounds, timer)
        for name, runner in runners.items():
            per_call = statistics.median(elapsed[name]) * 1e3
            kernels = kernel_times(runner, args.calls)
            busy = sum(us for us, _ in kernels.values())
            print(f"  {name}: {per_call:9.1f} us a call, kernels {busy:9.1f} us, "
                  f"gap {per_call - busy:7.1f} us")
            for kernel, (us, launches) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                print(f"    {us:9.1f} us  x{launches:g}  {short(kernel)}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
