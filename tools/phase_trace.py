#!/usr/bin/env python3
"""Where a wgmma forward's time goes, tile by tile: clock64 phase stamps per consumer warpgroup
and for the producer, written into the LSE buffer by an instrumented copy of the kernels.

    # here: an instrumented copy of kernels_src (the library reads it at run time)
    python3 tools/phase_trace.py make .ab/trace
    # there: the same problem as the grid's b32 x 512 d128 cell, optionally forced tiles
    FLASHJIT_KERNELS_DIR=$PWD/.ab/trace/kernels_src FLASHJIT_CACHE_DIR=/tmp/fjtrace \\
        PYTHONPATH=python python3 tools/phase_trace.py run 32 16 512 128 0 [128x128x2]

`make` edits a copy of kernels_src/wgmma/kernel.cu at fixed anchors (it stops, naming the anchor,
when the kernel has moved on); the copy's LSE stores are gone, the stamps take their buffer, so
its LSE is not an output (`run` checks O against PyTorch). Stamps: [CTA][consumer 0..2, producer
3][tile 0..30][8] u64, tile 31 a header (start and end clock64 and globaltimer, tile count), so
the clock is measured, not assumed. A consumer's tile: 0 start, 1 Q arrived, 2 first Q·Kᵀ and
softmax done, 3 main loop done, 4 last P·V done, 5 O stored; the producer: 0 before the wait for
Q's buffer, 1 Q issued. `run` prints medians over tiles after each CTA's first (first-tile
medians apart): Q wait, first step, loop (and per key tile), last P·V, epilogue, gap, period,
the time outside the loop, and the producer's wait for Q's buffer and Q's issue-to-arrival time
(the producer counts only tiles with keys: aligned with the consumers' where every tile has
keys). Dense problems only (one sequence's tiles, no varlen table).
One stamp a phase from one thread of 128: the traced kernel ran within 2 % of the plain one in
session 34 (docs/results/short-seq-trace-ncu-h100-2026-12-06-s34.txt).
"""

import re
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = Path("kernels_src/wgmma/kernel.cu")
CTAS, SLOTS, TILES, WORDS = 132, 4, 32, 8  # TILES - 1 traced tiles a warpgroup, then the header
HEADER = TILES - 1

HELPERS = r"""// phase_trace.py: clock64 stamps into the LSE buffer, [cta][slot][tile][8] u64 (slot 3: the
// producer; tile 31: the header).
__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}
__device__ __forceinline__ unsigned long long trace_gtime() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c));
  return c;
}
__device__ __forceinline__ void trace_put(const FmhaParams& p, int slot, int tile, int k,
                                          unsigned long long v) {
  reinterpret_cast<unsigned long long*>(p.lse)[((blockIdx.x * 4 + slot) * 32 + tile) * 8 + k] = v;
}
#define TRACE_C(k)                                                        \
  do {                                                                    \
    if (threadIdx.x % 128 == 0 && trace_tile < 31)                        \
      trace_put(p, consumer, trace_tile, k, trace_clock());               \
  } while (0)
"""

# (anchor, replacement) pairs, each anchor found exactly once.
EDITS = [
    ("""  int pipe = 0, q_loads = 0;
  UnitSequence<Varlen, kMayTake, true> units(p, sched, table, &bars->units);""",
     """  int pipe = 0, q_loads = 0;
  int trace_tile = 0;
  if (threadIdx.x % 128 == 0) {
    trace_put(p, consumer, 31, 0, trace_clock());
    trace_put(p, consumer, 31, 1, trace_gtime());
  }
  UnitSequence<Varlen, kMayTake, true> units(p, sched, table, &bars->units);"""),
    ("""      if (Varlen && c.m_block * TileM >= seq.seqlen_q) continue;  // as the producer skips it
""", """      if (Varlen && c.m_block * TileM >= seq.seqlen_q) continue;  // as the producer skips it
      TRACE_C(0);
"""),
    ("""        mbarrier_wait(&bars->q_full, q_loads++ & 1);
        const int unmasked = order.unmasked();""",
     """        mbarrier_wait(&bars->q_full, q_loads++ & 1);
        TRACE_C(1);
        const int unmasked = order.unmasked();"""),
    ("""          scores_alone(0, False{});
        int i = 1;""", """          scores_alone(0, False{});
        TRACE_C(2);
        int i = 1;"""),
    ("""        for (; i < n_tiles; ++i) overlapped_step(i, True{});
        values_alone(n_tiles - 1);""", """        for (; i < n_tiles; ++i) overlapped_step(i, True{});
        TRACE_C(3);
        values_alone(n_tiles - 1);
        TRACE_C(4);"""),
    ("""        store_output<T, HeadDim, Varlen, Sink>(p, rows, c, row0, at, o, softmax);
    }
  }
  if constexpr (Shape::kStageO) staged.drain();""",
     """        store_output<T, HeadDim, Varlen, Sink>(p, rows, c, row0, at, o, softmax);
      TRACE_C(5);
      if (threadIdx.x % 128 == 0 && trace_tile < 31) trace_put(p, consumer, trace_tile, 6, n_tiles);
      ++trace_tile;
    }
  }
  if constexpr (Shape::kStageO) staged.drain();
  if (threadIdx.x % 128 == 0) {
    trace_put(p, consumer, 31, 2, trace_clock());
    trace_put(p, consumer, 31, 3, trace_gtime());
    trace_put(p, consumer, 31, 4, trace_tile);
  }"""),
    ("""      if (q_loads > 0) mbarrier_wait(&bars->q_empty, (q_loads - 1) & 1);
      ++q_loads;""", """      if (leader && q_loads < 31) trace_put(p, 3, q_loads, 0, trace_clock());
      if (q_loads > 0) mbarrier_wait(&bars->q_empty, (q_loads - 1) & 1);
      if (leader && q_loads < 31) trace_put(p, 3, q_loads, 1, trace_clock());
      ++q_loads;"""),
]


def instrumented_copy(out, tool, helpers, edits):
    """Copies kernels_src to out/kernels_src, applies `edits` ({path under kernels_src: [(anchor,
    replacement)]}, each anchor found exactly once), turns kernel.cu's two LSE stores off (the
    stamps take their buffer) and puts `helpers` before its first template after
    PipelineBarriers. `tool` names the caller in errors."""
    out = Path(out)
    shutil.rmtree(out / "kernels_src", ignore_errors=True)
    shutil.copytree(ROOT / "kernels_src", out / "kernels_src")
    for relative, pairs in edits.items():
        path = out / relative
        text = path.read_text()
        for anchor, replacement in pairs:
            if text.count(anchor) != 1:
                raise SystemExit(f"{tool} make: {relative} no longer has this anchor once "
                                 f"({text.count(anchor)} times):\n{anchor}")
            text = text.replace(anchor, replacement)
        if relative == KERNEL:
            stores = text.count("p.lse != nullptr && at.col == 0")
            if stores != 2:
                raise SystemExit(f"{tool} make: expected 2 LSE stores to remove, found {stores}")
            text = text.replace("p.lse != nullptr && at.col == 0", "false && at.col == 0")
            first = re.search(r"^template", text[text.index("struct PipelineBarriers"):], re.M)
            at = text.index("struct PipelineBarriers") + first.start()
            text = text[:at] + helpers + "\n" + text[at:]
        path.write_text(text)
    print(f"instrumented kernels in {out / 'kernels_src'}")


def make(out):
    instrumented_copy(out, "phase_trace", HELPERS, {KERNEL: EDITS})


def percentile(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def summarize(t):
    """Prints the phases of stamps t ([CTA][slot][tile][word] ints), clock measured from them."""
    rates = [(hd[2] - hd[0]) / (hd[3] - hd[1]) for cta in t for hd in (c[HEADER] for c in cta[:3])
             if hd[0] and hd[2] > hd[0] and hd[3] > hd[1]]
    ghz = statistics.median(rates)
    us = lambda cycles: cycles / ghz / 1e3  # noqa: E731
    print(f"   clock {ghz * 1e3:.0f} MHz (clock64 over globaltimer)")
    later = {name: [] for name in ("q_wait", "first_step", "loop", "loop_per_key_tile",
                                   "last_pv", "epilogue", "gap", "period", "outside_loop")}
    first = {name: [] for name in ("q_wait", "first_step", "loop", "last_pv", "epilogue")}
    producer = {"q_buffer_wait": [], "q_issue_to_arrival": []}
    key_tiles = []
    for cta in t:
        for c in range(3):
            count = min(int(cta[c][HEADER][4]), HEADER)
            for i in range(count):
                st = cta[c][i]
                if st[1] == 0:  # a tile without keys: no Q, no loop
                    continue
                key_tiles.append(int(st[6]))
                phases = dict(q_wait=st[1] - st[0], first_step=st[2] - st[1], loop=st[3] - st[2],
                              last_pv=st[4] - st[3], epilogue=st[5] - st[4])
                into = first if i == 0 else later
                for phase, cycles in phases.items():
                    into[phase].append(us(cycles))
                if i == 0:
                    continue
                prev = cta[c][i - 1]
                if st[6] > 1:
                    later["loop_per_key_tile"].append(us(phases["loop"]) / (st[6] - 1))
                later["gap"].append(us(st[0] - prev[5]))
                later["period"].append(us(st[0] - prev[0]))
                later["outside_loop"].append(us(st[0] - prev[0]) - us(prev[3] - prev[2]))
                if c == 0 and cta[3][i][1]:
                    producer["q_buffer_wait"].append(us(cta[3][i][1] - cta[3][i][0]))
                    producer["q_issue_to_arrival"].append(us(st[1] - cta[3][i][1]))
    print(f"   key tiles a query tile: median {statistics.median(key_tiles)}, "
          f"{min(key_tiles)}..{max(key_tiles)}")
    print(f"   {'phase, us':<20}{'median':>8}{'mean':>8}{'p10':>8}{'p90':>8}{'n':>7}{'1st tile':>9}")
    for phase, xs in list(later.items()) + list(producer.items()):
        if xs:
            one = f"{statistics.median(first[phase]):9.3f}" if first.get(phase) else f"{'-':>9}"
            print(f"   {phase:<20}{statistics.median(xs):8.3f}{statistics.mean(xs):8.3f}"
                  f"{percentile(xs, 0.1):8.3f}{percentile(xs, 0.9):8.3f}{len(xs):7d}{one}")


def run(args):
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(ROOT / "python"))
    import torch
    from compare.timing import CudaTimer, per_call_ms
    from flashjit import ops

    b, h, s, d, causal = (int(x) for x in args[:5])
    tiles = tuple(int(x) for x in args[5].split("x")) if len(args) > 5 else None
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    stamps = torch.zeros(CTAS * SLOTS * TILES * WORDS, dtype=torch.int64, device="cuda")
    engine, _ = ops._engine(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    structs = engine.kv_args(q, k, v, out, None, None, bool(causal), lse=stamps.data_ptr(),
                             tiles=tiles)
    name = engine.select_variant_kv_raw(*structs)
    call = lambda: engine.forward_kv_raw(*structs, stream)  # noqa: E731
    ms = statistics.median(per_call_ms({"t": call}, 5, 9, CudaTimer())["t"])
    stamps.zero_()
    call()
    torch.cuda.synchronize()
    t = stamps.view(CTAS, SLOTS, TILES, WORDS).cpu().tolist()
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=bool(causal)).transpose(1, 2)
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    print(f"== b{b} h{h} s{s} d{d} causal={causal} {name}: {ms * 1e3:.1f} us/call (traced), "
          f"{flops / ms / 1e9:.0f} TFLOPS, O max err {err:.2e} of max |ref|")
    summarize(t)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        return make(sys.argv[2])
    if len(sys.argv) >= 7 and sys.argv[1] == "run":
        return run(sys.argv[2:])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
