#!/usr/bin/env python3
"""When each query tile of a wgmma forward ran, and when its CTA got the unit: globaltimer stamps
per tile, per unit fetch and per scheduler claim, written into the LSE buffer by an instrumented
copy of the kernels; each launch traced once with the stream's tile counter (taken tiles, where
the plan takes them) and once inside a CUDA graph (no counter: every unit dealt round-robin).

    # here: an instrumented copy of kernels_src (the library reads it at run time)
    python3 tools/unit_trace.py make .ab/units
    # there: B H SQ SK D CAUSAL, e.g. the features grid's b2 h8 3001 d256 causal cell
    FLASHJIT_KERNELS_DIR=$PWD/.ab/units/kernels_src FLASHJIT_CACHE_DIR=/tmp/fjunits \\
        PYTHONPATH=python python3 tools/unit_trace.py run 2 8 3001 3001 256 1 [--raw DIR]

`make` edits kernel.cu and schedule.cuh at fixed anchors (as tools/phase_trace.py, whose copy
it shares; it stops, naming the anchor, when the kernels have moved on); the copy's LSE stores
are gone, so its LSE is not an output. Stamps: int64 [CTA][slot][tile 0..63][4]; slots 0..2 a
consumer warpgroup's tiles (start before its Q wait, end after its store, unit, m_block << 16 |
key tiles), slot 3 the producer (time it got its n-th unit, the unit) and, in the same rows, the
scheduler thread (field 3: every reader had unit n - 1; field 1: unit n published). `run` prints
per mode the makespan, when the CTAs end, busy share, gaps between a warpgroup's tiles, the
scheduler's lead, and a fit of tile time against key tiles for single tiles and a pair's first
and second; --raw DIR saves the stamps (numpy .npz) per mode, and `show FILE.npz...` prints saved
ones again (no GPU needed). Dense problems only.
Session 39 found with it that taken tiles were claimed a whole tile early (docs/perf-log.md).
"""

import statistics
import sys
from pathlib import Path

from phase_trace import KERNEL, ROOT, instrumented_copy, percentile

CTAS, SLOTS, TILES, WORDS = 132, 4, 64, 4
SCHEDULE = Path("kernels_src/wgmma/schedule.cuh")

HELPERS = r"""// unit_trace.py: globaltimer stamps into the LSE buffer, [cta][slot][tile][4] int64.
__device__ __forceinline__ long long trace_gtime() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
  return static_cast<long long>(c);
}
__device__ __forceinline__ void trace_put(const FmhaParams& p, int slot, int tile, int k,
                                          long long v) {
  if (tile < 64) reinterpret_cast<long long*>(p.lse)[((blockIdx.x * 4 + slot) * 64 + tile) * 4 + k] = v;
}
"""

KERNEL_EDITS = [
    # producer: when it got each unit
    ("""  int pipe = 0, q_loads = 0;
  UnitSequence<Varlen, MayTakeUnits, false> units(p, sched, table, &bars->units);
  for (int unit = units.next(); unit >= 0; unit = units.next()) {
""", """  int pipe = 0, q_loads = 0;
  int trace_n = 0;
  UnitSequence<Varlen, MayTakeUnits, false> units(p, sched, table, &bars->units);
  for (int unit = units.next(); unit >= 0; unit = units.next()) {
    if (leader) { trace_put(p, 3, trace_n, 0, trace_gtime()); trace_put(p, 3, trace_n, 2, unit); }
    ++trace_n;
"""),
    # consumers: a tile's start (before its Q wait), unit and key tiles, then its end
    ("""  int pipe = 0, q_loads = 0;
  UnitSequence<Varlen, kMayTake, true> units(p, sched, table, &bars->units);
""", """  int pipe = 0, q_loads = 0;
  int trace_tile = 0;
  UnitSequence<Varlen, kMayTake, true> units(p, sched, table, &bars->units);
"""),
    ("""      const int n_tiles = order.count();
      float o[HeadDim / 2];""", """      const int n_tiles = order.count();
      if (threadIdx.x % 128 == 0) {
        trace_put(p, consumer, trace_tile, 0, trace_gtime());
        trace_put(p, consumer, trace_tile, 2, unit);
        trace_put(p, consumer, trace_tile, 3, (c.m_block << 16) | n_tiles);
      }
      float o[HeadDim / 2];"""),
    ("""        store_output<T, HeadDim, Varlen, Sink>(p, rows, c, row0, at, o, softmax);
    }
  }
  if constexpr (Shape::kStageO) staged.drain();""", """        store_output<T, HeadDim, Varlen, Sink>(p, rows, c, row0, at, o, softmax);
      if (threadIdx.x % 128 == 0) trace_put(p, consumer, trace_tile, 1, trace_gtime());
      ++trace_tile;
    }
  }
  if constexpr (Shape::kStageO) staged.drain();"""),
]

SCHEDULE_EDITS = [
    ("""    mbarrier_wait(&ring->empty, (n & 1) ^ 1);  // every reader has unit n - 1
""", """    mbarrier_wait(&ring->empty, (n & 1) ^ 1);  // every reader has unit n - 1
    unsigned long long trace_t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_t));
    if (n < 64) reinterpret_cast<long long*>(p.lse)[((blockIdx.x * 4 + 3) * 64 + n) * 4 + 3] = trace_t;
"""),
    ("""    mbarrier_arrive(&ring->full);  // release: the readers see the word
""", """    mbarrier_arrive(&ring->full);  // release: the readers see the word
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_t));
    if (n < 64) reinterpret_cast<long long*>(p.lse)[((blockIdx.x * 4 + 3) * 64 + n) * 4 + 1] = trace_t;
"""),
]


def make(out):
    instrumented_copy(out, "unit_trace", HELPERS, {KERNEL: KERNEL_EDITS, SCHEDULE: SCHEDULE_EDITS})


def summarize(mode, t):
    """Prints the timeline of stamps t (numpy int64 [CTA][slot][tile][word]), in microseconds."""
    import numpy as np

    starts = t[:, :3, :, 0]
    t0 = starts[starts > 0].min()
    ends, busy, gaps, producer_lead = [], [], [], []
    fit = {"single": [], "pair1": [], "pair2": []}
    tiles_a_cta = []
    for cta in range(CTAS):
        for c in range(3):
            rows = [t[cta, c, i] for i in range(TILES) if t[cta, c, i, 0] > 0]
            if not rows:
                continue
            if c == 0:
                tiles_a_cta.append(len(rows))
            ends.append((rows[-1][1] - t0) / 1e3)
            busy.append(sum(r[1] - r[0] for r in rows) / 1e3)
            for i, r in enumerate(rows):
                same_as_previous = i > 0 and rows[i - 1][2] == r[2]
                same_as_next = i + 1 < len(rows) and rows[i + 1][2] == r[2]
                kind = "pair2" if same_as_previous else ("pair1" if same_as_next else "single")
                fit[kind].append((int(r[3] & 0xFFFF), (r[1] - r[0]) / 1e3))
                if i > 0:
                    gaps.append((r[0] - rows[i - 1][1]) / 1e3)
            if c == 0:  # the producer got unit u at P; consumer 0 started it at S
                got = {int(t[cta, 3, i, 2]): t[cta, 3, i, 0] for i in range(TILES)
                       if t[cta, 3, i, 0] > 0}
                producer_lead += [(r[0] - got[int(r[2])]) / 1e3 for r in rows if int(r[2]) in got]
    claim, published_lead = [], []
    for cta in range(CTAS):
        for i in range(TILES):
            r = t[cta, 3, i]
            if r[1] > 0 and r[3] > 0:
                claim.append((r[1] - r[3]) / 1e3)
            if r[1] > 0 and r[0] > 0:
                published_lead.append((r[0] - r[1]) / 1e3)
    if claim:
        print(f"   scheduler: readers done -> published median {statistics.median(claim):.2f} "
              f"p90 {percentile(claim, 0.9):.2f} us; published -> producer has it median "
              f"{statistics.median(published_lead) if published_lead else 0:.2f} us")
    p10, p50, p90 = (percentile(ends, f) for f in (0.1, 0.5, 0.9))
    print(f"-- {mode}: makespan {max(ends):.1f} us; consumer end p10/p50/p90 "
          f"{p10:.1f} / {p50:.1f} / {p90:.1f}; "
          f"busy/span {sum(busy) / (len(busy) * max(ends)):.3f}; tiles a CTA "
          f"{min(tiles_a_cta)}-{max(tiles_a_cta)}")
    if gaps:
        print(f"   gaps between a warpgroup's tiles: n {len(gaps)} median "
              f"{statistics.median(gaps):.2f} p90 {percentile(gaps, 0.9):.2f} us; producer got "
              f"the unit before consumer 0 started it: median "
              f"{statistics.median(producer_lead) if producer_lead else 0:.2f} us")
    for kind, points in fit.items():
        if len(points) < 3:
            continue
        x = np.array([p[0] for p in points], float)
        y = np.array([p[1] for p in points], float)
        if len(set(x)) > 1:
            (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)
        else:
            a, b = y.mean(), 0.0
        print(f"   {kind:<6} n {len(points):4d}: duration = {a:6.2f} + {b:5.3f} x key tiles us "
              f"(key tiles {int(x.min())}-{int(x.max())}, mean {y.mean():.2f} p10 "
              f"{np.percentile(y, 10):.2f} p90 {np.percentile(y, 90):.2f})")
    print("   sorted ends (every 16th): " + " ".join(f"{x:.0f}" for x in sorted(ends)[::16]))


def run(args):
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np
    import torch
    from compare.timing import CudaTimer, per_call_ms
    from flashjit import ops

    raw = None
    if "--raw" in args:
        raw = Path(args[args.index("--raw") + 1])
        raw.mkdir(parents=True, exist_ok=True)
        args = args[:args.index("--raw")]
    b, h, sq, sk, d, causal = (int(x) for x in args[:6])
    torch.manual_seed(0)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    stamps = torch.zeros(CTAS * SLOTS * TILES * WORDS, dtype=torch.int64, device="cuda")
    engine, _ = ops._engine(q.device)
    structs = engine.kv_args(q, k, v, out, None, None, bool(causal), lse=stamps.data_ptr())
    name = engine.select_variant_kv_raw(*structs)
    # The stream at call time: the side stream, then the graph's capture stream, launch it too.
    taken = lambda: engine.forward_kv_raw(  # noqa: E731
        *structs, torch.cuda.current_stream().cuda_stream)
    for _ in range(3):
        taken()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # the graph's capture stream must be a side stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        taken()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        taken()
    torch.cuda.synchronize()
    samples = per_call_ms({"taken": taken, "graph": graph.replay}, 5, 9, CudaTimer())
    flops = 4 * b * h * sq * sk * d - (2 * b * h * sq * sq * d if causal else 0)
    print(f"== b{b} h{h} {sq}x{sk} d{d} causal={causal} {name} (traced: LSE off)")
    for mode, xs in samples.items():
        ms = statistics.median(xs)
        print(f"   {mode:<6} {ms * 1e3:8.1f} us/call  ~{flops / ms / 1e9:.0f} TFLOPS")
    for mode, launch in (("taken", taken), ("graph", graph.replay)):
        stamps.zero_()
        launch()
        torch.cuda.synchronize()
        t = stamps.view(CTAS, SLOTS, TILES, WORDS).cpu().numpy()
        if raw is not None:
            np.savez_compressed(raw / f"b{b}h{h}-{sq}x{sk}-d{d}-c{causal}-{mode}.npz", t=t)
        summarize(mode, t)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        return make(sys.argv[2])
    if len(sys.argv) >= 8 and sys.argv[1] == "run":
        return run(sys.argv[2:])
    if len(sys.argv) >= 3 and sys.argv[1] == "show":  # saved stamps: show FILE.npz...
        import numpy as np
        for path in sys.argv[2:]:
            print(f"== {path}")
            summarize(Path(path).stem.rsplit("-", 1)[-1], np.load(path)["t"])
        return None
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
