#!/usr/bin/env python3
"""A/B timing of several flashjit builds (and forced tile shapes) against SDPA's cuDNN backend.

Kernel changes are compared in one process, with every implementation's repetitions interleaved
round-robin with cuDNN's, so drifts of the card (clock, temperature) hit all of them alike; the
ratio to cuDNN in the same run is what to compare. Each implementation is checked against the
float32 reference on fresh random inputs (poisoned outputs) before it is timed.

    python3 tools/ab_compare.py --lib base=.devpack/base/libflashjit.so.0 \
        --lib new=.devpack/new/libflashjit.so.0 --impl n128=new:128n:128x128x3 \
        --grid standard --out $OUT/ab

--lib NAME=PATH: an implementation with the library's own tile choice, on every case.
--impl NAME=LIB:D[n|c][:MxNxS]: LIB only on cases of head dim D ("any": all; suffix n: non-causal
only, c: causal only), with the tiles forced when given (on the family the dispatcher picks for
the case). --only-impls: --lib entries are not run on every case. --fa4: FlashAttention-4's
flash_attn_func as a peer too, checked and timed like the others (ratio_fa4 in ab.json).
Exit status 1 when a check of ours failed.
"""

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package and the binding
import flashjit_ctypes as fj  # noqa: E402
from compare import gpu  # noqa: E402
from compare.backends import (FlashjitRunner, SdpaRunner, fake_view, make_inputs,  # noqa: E402
                              select_variant)
from compare.cases import GRIDS, build_cases  # noqa: E402
from compare.fa4 import Fa4Runner  # noqa: E402
from compare.checks import DEFAULT_CHECK_BUDGET, reference_check  # noqa: E402
from compare.report import geomean  # noqa: E402
from compare.timing import DEFAULT_SPIN_MS, CudaTimer, enqueue_spins, round_robin  # noqa: E402


@dataclass
class Impl:
    name: str
    lib: str
    head_dim: int = 0          # 0: every case
    causal: bool | None = None  # None: both
    tiles: tuple | None = None

    def applies(self, case):
        return ((not self.head_dim or case.head_dim == self.head_dim)
                and (self.causal is None or case.causal == self.causal))


def parse_impl(text, libs):
    usage = (f"--impl {text!r}: expected NAME=LIB:D[n|c][:MxNxS], e.g. t128=base:128n:128x128x3 "
             "(without the shape: the library's own tiles)")
    try:
        name, rest = text.split("=", 1)
        lib, which, *tiles = rest.split(":")
        causal = {"n": False, "c": True}.get(which[-1])
        which = which[:-1] if causal is not None else which
        head_dim = 0 if which == "any" else int(which)
        shape = tuple(int(x) for x in tiles[0].lower().split("x")) if tiles else None
    except (ValueError, IndexError):
        raise SystemExit(usage) from None
    if lib not in libs or len(tiles) > 1 or (shape is not None and len(shape) != 3):
        raise SystemExit(f"{usage}; LIB must be one of {sorted(libs)}")
    return Impl(name, lib, head_dim, causal, shape)


def tiles_family(engine, case, tiles):
    """The family forced tiles go to: the one the library's dispatcher picks for the case (the
    first registered family may not take it: decode_tma refuses prefill). None: no tiles."""
    if not tiles:
        return None
    name, error = select_variant(engine, case, "auto")
    if error is not None:
        raise error
    return name.split(".")[0]


class Runner(FlashjitRunner):
    """compare_sdpa's runner with the tile shape forced (None: the library's choice)."""

    def __init__(self, engine, case, q, k, v, scale, tiles):
        family = tiles_family(engine, case, tiles)
        super().__init__(engine, case, q, k, v, family or "auto", scale)
        self.options = engine.options(case.causal, scale, self.lse.data_ptr(), family, tiles)


def run_case(index, case, impls, engines, timer, args):
    scale = 1.0 / math.sqrt(case.head_dim)
    q, k, v = make_inputs(case, args.seed + index)
    row = {"case": case.key(), "label": case.label(), "flops": case.flops(), "impls": {}}
    runners, outputs = {}, {}
    for impl in impls:
        if not impl.applies(case):
            continue
        try:
            runner = Runner(engines[impl.lib], case, q, k, v, scale, impl.tiles)
            runner.poison()
            runner()
            gpu.sync()
        except fj.FlashjitError as e:
            row["impls"][impl.name] = {"status": "error", "reason": e.message}
            continue
        row["impls"][impl.name] = {"status": "ok"}
        runners[impl.name] = runner
        outputs[impl.name] = (runner.out, runner.lse)
    cudnn = SdpaRunner("cudnn", case, q, k, v, scale, "same")
    if cudnn.error is None:
        runners["cudnn"] = cudnn
    if args.fa4:
        fa4 = Fa4Runner(case, SimpleNamespace(q=q, k=k, v=v), scale)
        if fa4.error is None:
            runners["fa4"] = fa4
            outputs["fa4"] = (fa4.out, None)  # checked like ours (no LSE)
            row["impls"]["fa4"] = {"status": "ok"}
        else:
            row["impls"]["fa4"] = {"status": "error", "reason": fa4.error}
    errors, _, _ = reference_check(case, q, k, v, scale, outputs, args.check_budget)
    for name in outputs:
        row["impls"][name]["check"] = errors[name]
        if not errors[name]["pass"]:
            row["impls"][name]["status"] = "failed check"
            del runners[name]
    for fn in runners.values():  # warm-up
        for _ in range(args.warmup):
            fn()
    gpu.sync()
    spins, spin_ms = enqueue_spins(runners, timer, DEFAULT_SPIN_MS)
    enqueue = {}
    samples = round_robin(runners, {n: args.reps for n in runners}, timer, spins, enqueue)
    medians = {n: statistics.median(t) for n, t in samples.items()}
    for name, ms in medians.items():
        cell = row["impls"].setdefault(name, {"status": "ok"})
        cell["median_ms"] = ms
        cell["spin_ms"] = spin_ms[name]
        cell["reps_enqueue_over_spin"] = sum(1 for e in enqueue[name] if e > spin_ms[name])
        cell["tflops"] = case.flops() / (ms * 1e-3) / 1e12
        if "cudnn" in medians and name != "cudnn":
            cell["ratio_cudnn"] = medians["cudnn"] / ms
        if "fa4" in medians and name not in ("fa4", "cudnn"):
            cell["ratio_fa4"] = medians["fa4"] / ms
    return row


def precompile(impls, cases, libs, engines):
    """Compiles every variant the run needs up front, in parallel (timing never waits on NVRTC)."""
    t0 = time.monotonic()
    wanted = {name: set() for name in libs}
    for case in cases:
        q = fake_view(case, case.seqlen_q, case.heads_q)
        k = fake_view(case, case.seqlen_k, case.heads_kv)
        for impl in impls:
            if impl.applies(case):
                try:
                    engine = engines[impl.lib]
                    wanted[impl.lib].add(engine.select_variant(
                        q, k, k, q, causal=case.causal,
                        family=tiles_family(engine, case, impl.tiles),
                        tiles=impl.tiles))
                except fj.FlashjitError as e:
                    print(f"{impl.name} {case.label()}: {e.message}")
    for name, variants in wanted.items():
        if variants:
            libs[name].precompile(sorted(variants))
    print(f"precompiled {sum(map(len, wanted.values()))} variants in "
          f"{time.monotonic() - t0:.1f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--impl", action="append", default=[], help="NAME=LIB:D[n|c]:MxNxS")
    ap.add_argument("--only-impls", action="store_true", help="run only the --impl entries")
    ap.add_argument("--grid", action="append", default=[], choices=sorted(GRIDS))
    ap.add_argument("--case", action="append", default=[], help="b,hq,hkv,sq,sk,d,causal")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check-budget", type=int, default=DEFAULT_CHECK_BUDGET)
    ap.add_argument("--fa4", action="store_true",
                    help="FlashAttention-4 as a peer too (flash_attn.cute importable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    libs = {}
    for text in args.lib:
        name, _, path = text.partition("=")
        if not name or not path:
            raise SystemExit(f"--lib {text!r}: expected NAME=PATH")
        libs[name] = fj.Flashjit(path)
    impls = ([] if args.only_impls else [Impl(name, name) for name in libs]) + \
        [parse_impl(t, libs) for t in args.impl]
    engines = {name: lib.create_engine(0) for name, lib in libs.items()}
    cases = build_cases(args.grid, args.case)
    precompile(impls, cases, libs, engines)
    timer = CudaTimer(DEFAULT_SPIN_MS)
    args.out.mkdir(parents=True, exist_ok=True)

    rows, failed = [], False
    names = [i.name for i in impls] + ["cudnn"] + (["fa4"] if args.fa4 else [])
    print(f"{'case':44} " + " ".join(f"{n:>14}" for n in names), flush=True)
    t0 = time.monotonic()
    for index, case in enumerate(cases):
        row = run_case(index, case, impls, engines, timer, args)
        rows.append(row)
        cells = []
        for n in names:
            c = row["impls"].get(n)
            if c is None:
                cells.append(f"{'':>14}")
            elif "tflops" not in c:
                failed = failed or n != "fa4"  # a peer that cannot run is reported, not failed
                cells.append(f"{c['status'][:14]:>14}")
            else:
                ratio = f" {c['ratio_cudnn']:.3f}" if "ratio_cudnn" in c else ""
                cells.append(f"{c['tflops']:7.1f}{ratio:>7}")
        print(f"{case.label():44} " + " ".join(cells), flush=True)

    summary = {}
    for impl in impls:
        ratios = [r["impls"][impl.name]["ratio_cudnn"] for r in rows
                  if "ratio_cudnn" in r["impls"].get(impl.name, {})]
        if ratios:
            summary[impl.name] = {"geomean_ratio_cudnn": geomean(ratios), "cases": len(ratios),
                                  "min_ratio_cudnn": min(ratios)}
            print(f"{impl.name}: geomean {summary[impl.name]['geomean_ratio_cudnn']:.3f}x cuDNN "
                  f"over {len(ratios)} cases, lowest {min(ratios):.3f}")
        to_fa4 = [r["impls"][impl.name]["ratio_fa4"] for r in rows
                  if "ratio_fa4" in r["impls"].get(impl.name, {})]
        if to_fa4:
            summary[impl.name].update(geomean_ratio_fa4=geomean(to_fa4), min_ratio_fa4=min(to_fa4))
            print(f"{impl.name}: geomean {geomean(to_fa4):.3f}x FA4 over {len(to_fa4)} cases, "
                  f"lowest {min(to_fa4):.3f}")
    print(f"wall {time.monotonic() - t0:.0f} s")
    (args.out / "ab.json").write_text(json.dumps(
        {"libs": {n: str(lib.path) for n, lib in libs.items()}, "impls": [vars(i) for i in impls],
         "rows": rows, "summary": summary}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
