"""The command line of tools/compare_sdpa.py: its arguments, and main() in named steps."""

import argparse
import os
import sys
import time
from pathlib import Path

import flashjit_ctypes as fj

from . import selftest
from .backends import select_variant
from .backward_backends import backward_variant_picks
from .backward_cases import (BACKWARD_GRIDS, DETERMINISTIC_MODES, backward_configs,
                             is_backward_case, parse_list)
from .backward_checks import GRADIENT_TOLERANCES
from .cases import GRIDS, build_cases, parse_families
from .checks import DEFAULT_CHECK_BUDGET, LSE_TOLERANCE, TOLERANCES
from .decode_backends import kv_variant_picks
from .decode_cases import HBM_TBS, KV_GRIDS, is_kv_case
from .varlen_backends import varlen_variant_picks
from .varlen_cases import VARLEN_GRIDS, is_varlen_case
from .environment import environment
from .fa4 import load_fa4
from .run_decode import NO_FA4
from .report import SCHEMA, Output, short
from .run_all import finish_report, kind_of, run_cases
from .timing import DEFAULT_SPIN_MS, CudaTimer


def build_parser():
    p = argparse.ArgumentParser(
        description="flashjit vs PyTorch SDPA (cuDNN, flash) and FlashAttention-4: correctness "
                    "and speed, one command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: LD_LIBRARY_PATH=.devpack python3 tools/compare_sdpa.py "
               "--lib .devpack/libflashjit.so.0 --grid standard --out out/compare")
    p.add_argument("--grid", action="append",
                   choices=sorted(GRIDS) + sorted(KV_GRIDS) + sorted(VARLEN_GRIDS)
                   + sorted(BACKWARD_GRIDS),
                   default=[], help="case set (repeatable); standard when neither --grid nor "
                   "--case is given; decode, decode-dense and paged are the KV-cache cases "
                   "(vs SDPA cuDNN, SDPA flash and FlashAttention-4); varlen a packed prefill "
                   "batch of 16 lengths (flashjit_forward_varlen vs FA4's varlen call, and both "
                   "dense on an equal-length batch of the same work); backward the backward "
                   "pass alone on the standard grid's shapes (flashjit vs SDPA cuDNN, SDPA flash "
                   "and FA4; --bwd-* below), backward-quick 6 of them")
    p.add_argument("--case", action="append", default=[], metavar="B,HQ,HKV,SQ,SK,D,CAUSAL,DTYPE,LAYOUT",
                   help="one explicit case (repeatable), e.g. 2,32,8,4096,4096,128,1,bf16,bshd; "
                        "a KV case: kv:B,HQ,HKV,SQ,SK,D,CAUSAL[,DTYPE[,dense|nhdN|hndN]], e.g. "
                        "kv:64,32,8,1,8192,128,0,bf16,nhd64; a varlen case: "
                        "varlen:B,HQ,HKV,D,CAUSAL[,DTYPE[,LO-HI[@SEED]|L1/L2/...]], e.g. "
                        "varlen:16,32,8,128,1,bf16,128-8192@6; a backward case: "
                        "bwd:B,HQ,HKV,SQ,SK,D,CAUSAL[,DTYPE], e.g. bwd:4,32,8,4096,4096,128,1")
    p.add_argument("--family", default="auto",
                   help="auto (dispatcher's pick, default), all (every family in the library, "
                        "each forced), or a comma list")
    p.add_argument("--bwd-family", default="auto",
                   help="backward cases: flashjit's dK/dV families to time, a comma list of auto "
                        "(the dispatcher's, default) and the library's dK/dV families (e.g. "
                        "bwd_wgmma_fused, bwd_wgmma, bwd_mma), each optionally @MxNxS (a forced tile shape), "
                        "e.g. auto,bwd_mma,bwd_wgmma@64x128x2: one row each, A/B in one run")
    p.add_argument("--deterministic", choices=sorted(DETERMINISTIC_MODES), default="off",
                   help="backward cases: flashjit's deterministic mode off (default: dQ by "
                        "atomics where the family uses them), on, or both (each --bwd-family "
                        "entry twice, '+det' the deterministic one)")
    p.add_argument("--bwd-dtype", default="bf16",
                   help="backward grids: dtypes, a comma list of bf16 and fp16 (default bf16)")
    p.add_argument("--bwd-gqa", default="1",
                   help="backward grids: GQA group sizes (heads_q / heads_kv), a comma list "
                        "(default 1: MHA), e.g. 1,4; a group that does not divide a shape's "
                        "heads leaves that shape out")
    p.add_argument("--lib", help="libflashjit path (default $FLASHJIT_LIBRARY, else build/libflashjit.so)")
    p.add_argument("--cache-dir", help="flashjit kernel cache directory (default: flashjit's own)")
    p.add_argument("--out", help="directory for results.json, table.txt and the PNG plots")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per implementation "
                   "(default 20, the contract's minimum)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--min-reps", type=int, default=5,
                   help="fewest repetitions when a call is too slow for --reps (default 5)")
    p.add_argument("--impl-budget", type=float, default=15.0,
                   help="seconds of timed calls one implementation may take per case before its "
                        "repetitions are cut (default 15; only very slow kernels hit it)")
    p.add_argument("--deadline", type=float, default=500.0,
                   help="seconds after start when no new case begins (default 500: results of a "
                        "10-minute device call survive); the rest are listed as skipped")
    p.add_argument("--sdpa-layout", choices=("same", "bhsd"), default="same",
                   help="same: SDPA reads flashjit's memory through .transpose(1,2) views "
                        "(default); bhsd: contiguous [b,h,s,d] copies made before timing")
    p.add_argument("--check-budget", type=int, default=DEFAULT_CHECK_BUDGET,
                   help="score elements (heads x rows x keys) the fp32 reference may compute per "
                        f"case before it samples heads/rows (default 2^33 = {DEFAULT_CHECK_BUDGET})")
    p.add_argument("--seed", type=int, default=1234, help="base seed; case i uses seed + i")
    p.add_argument("--spin-ms", type=float, default=DEFAULT_SPIN_MS,
                   help="GPU spin before each timed call, hiding launch overhead (0: none); an "
                        "implementation whose enqueue takes longer gets a spin of twice that")
    p.add_argument("--hbm-tbs", type=float, default=HBM_TBS,
                   help=f"HBM bandwidth (TB/s) of the KV cases' floor (default {HBM_TBS:g}, H200)")
    p.add_argument("--num-splits", type=int, default=0,
                   help="flashjit split-KV count for the KV and varlen cases (default 0: its "
                        "heuristic)")
    p.add_argument("--burst-ms", type=float, default=2.0,
                   help="KV and varlen cases: GPU time one timed burst of back-to-back calls "
                        "aims at (default 2 ms)")
    p.add_argument("--min-calls", type=int, default=10,
                   help="KV cases: fewest calls in one timed burst (default 10; varlen cases: "
                        "fewer when that many would outlast --burst-ms, at least 1)")
    p.add_argument("--no-fa4", action="store_true",
                   help="leave FlashAttention-4 (flash_attn.cute) out: by default it is a peer "
                        "of every grid when it can be imported (dense grids: the FA4, x FA4 and "
                        "x best columns)")
    p.add_argument("--limit", type=int, help="only the first N cases (smoke runs)")
    p.add_argument("--no-check", action="store_true", help="skip the reference check")
    p.add_argument("--no-time", action="store_true", help="skip timing (check only)")
    p.add_argument("--list-cases", action="store_true",
                   help="print the cases and exit (no GPU, no torch, no library needed)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cases, load the library, print versions and, when a GPU is "
                        "reachable, each case's variants; run nothing")
    p.add_argument("--selftest-report", metavar="DIR", help=argparse.SUPPRESS)
    return p


def parse_args(parser, argv=None):
    """The arguments, with args.cases built; --family is read once a ladder is known
    (choose_families)."""
    args = parser.parse_args(argv)
    try:
        backward = {"dtypes": parse_list(args.bwd_dtype, "--bwd-dtype", tuple(TOLERANCES)),
                    "gqa_groups": parse_list(args.bwd_gqa, "--bwd-gqa", cast=int)}
        if min(backward["gqa_groups"]) < 1:
            raise ValueError(f"--bwd-gqa {args.bwd_gqa!r}: group sizes are >= 1")
        args.cases = build_cases(args.grid, args.case, args.limit, kv=True, backward=backward)
        args.backward_configs = backward_configs(args.bwd_family, args.deterministic)
    except ValueError as e:
        parser.error(str(e))
    if args.reps < 1 or args.min_reps < 1 or args.warmup < 0:
        parser.error("--reps and --min-reps must be >= 1, --warmup >= 0")
    if args.min_calls < 1 or args.burst_ms <= 0 or args.hbm_tbs <= 0:
        parser.error("--min-calls must be >= 1, --burst-ms and --hbm-tbs > 0")
    if not 0 <= args.num_splits <= 128:
        parser.error("--num-splits: 0 (heuristic) or 1 to 128")
    args.min_reps = min(args.min_reps, args.reps)
    return args


def choose_families(parser, args, ladder, backward_families=None):
    """args.families from --family; ladder: the families of the library (or the self-test's
    made-up one), slowest first. backward_families: the library's (flashjit_family_is_backward),
    which --bwd-family is checked against; None: not checked (no library)."""
    try:
        args.families = parse_families(args.family, ladder)
        args.backward_configs = backward_configs(args.bwd_family, args.deterministic,
                                                 backward_families)
    except ValueError as e:
        parser.error(str(e))


def main(argv=None):
    start = time.monotonic()
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.selftest_report:
        choose_families(parser, args, selftest.LADDER)
        return selftest.selftest_report(Path(args.selftest_report), args)
    if args.list_cases:
        print_cases(args.cases)
        return 0

    # Import torch before loading flashjit: torch preloads its own libnvrtc, and when the sonames
    # match that copy is the one flashjit binds to; results.json records which one it was.
    try:
        import torch
    except ImportError as e:
        if not args.dry_run:
            print(f"error: torch is needed to run cases ({e})", file=sys.stderr)
            return 2
        torch = None
    try:
        lib = fj.Flashjit(fj.find_library(args.lib))
        ladder = tuple(reversed(lib.families()))  # the optimization ladder, first kernel first
        backward_families = lib.backward_families()
    except fj.FlashjitLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    choose_families(parser, args, ladder,
                    backward_families if any(map(is_backward_case, args.cases)) else None)
    if args.dry_run:
        return dry_run(args, lib, torch)
    return measure(args, lib, ladder, torch, start)


def print_cases(cases, out=print):
    out(f"{len(cases)} cases  (TFLOP per call: 4*b*h*s_q*s_k*d, halved for causal; KV and "
        "varlen cases: 4*d*h_q per (query, key) pair the bottom-right mask lets through; "
        "backward cases: 2.5x the forward's)")
    w = max([42] + [len(c.label()) for c in cases])
    out(f"{'#':>3}  {'case':{w}}  {'--case spelling':40}  {'group':8}  {'TFLOP':>7}")
    for i, c in enumerate(cases):
        extra = f"  K+V {c.kv_bytes() / 1e6:.1f} MB" if is_kv_case(c) else ""
        if is_varlen_case(c):
            extra = (f"  {c.total()} tokens; dense twin b{c.batch} x {c.dense_seqlen()}: "
                     f"{c.dense_flops() / 1e12:.3f} TFLOP; lengths "
                     + " ".join(str(n) for n in c.seqlens))
        out(f"{i:>3}  {c.label():{w}}  {c.key():40}  {c.group:8}  {c.flops() / 1e12:7.3f}{extra}")


def dry_run(args, lib, torch):
    """Cases, versions and, when an engine can be created, each case's variants; runs nothing."""
    out = Output()
    print_cases(args.cases, out)
    nvrtc = fj.loaded_nvrtc(lib.path)
    out(f"flashjit {lib.version()} from {os.path.realpath(lib.path)}; NVRTC "
        f"{lib.nvrtc_version() or 'unknown'} ({nvrtc['path'] if nvrtc else 'not loaded'}); "
        f"CUDA driver {lib.driver_version() or 'none'}; torch "
        f"{torch.__version__ if torch else 'not installed'}")
    try:
        engine = lib.create_engine(args.device, args.cache_dir)
    except fj.FlashjitError as e:
        out(f"engine: not created ({e.status_name}: {e.message}); nothing would run here")
        return 0
    with engine:
        for i, case in enumerate(args.cases):
            picks = []
            for name, (v, e) in case_picks(engine, case, args).items():
                why = getattr(e, "message", str(e))
                named = "(named at its first call)" if e is None else f"n/a ({short(why, 60)})"
                picks.append(f"{name}={v or named}")
            out(f"{i:>3}  {case.label():42}  " + "  ".join(picks))
    return 0


def measure(args, lib, ladder, torch, start):
    """The run itself: every case checked and timed, the report written as cases finish."""
    engine = start_engine(args, lib, torch)
    if engine is None:
        return 2
    out = Output()
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(lib, args.device)
    print_preamble(out, env, args)
    ctx = {"args": args, "engine": engine, "families": args.families, "ladder": ladder,
           "backward_configs": args.backward_configs,
           "deadline": start + args.deadline, "fa4_off": fa4_off_reason(args),
           **pick_variants(engine, args)}
    print_fa4_line(out, env, args, ctx["fa4_off"])
    compile_info = precompile_variants(lib, ctx, out)
    ctx["timer"] = CudaTimer(args.spin_ms)

    document = {"schema": SCHEMA, "environment": env, "settings": run_settings(args),
                "compile": compile_info, "cases": [], "kv_cases": [], "varlen_cases": [],
                "backward_cases": [], "summary": None}
    results, kv_results, varlen_results, backward_results = run_cases(ctx, out, out_dir,
                                                                      document)
    summary = finish_report(ctx, results, kv_results, document, out, out_dir, start,
                            varlen_results, backward_results)
    engine.close()
    return 1 if summary["failed_checks_total"] else 0


def start_engine(args, lib, torch):
    """torch's CUDA context on --device, then flashjit's engine there; None (said why) if not."""
    if not torch.cuda.is_available():
        print("error: torch sees no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return None
    torch.cuda.set_device(args.device)
    torch.cuda.init()
    try:
        return lib.create_engine(args.device, args.cache_dir)
    except fj.FlashjitError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def run_settings(args):
    """results.json's settings: what the run was asked to do and the bounds it checks with."""
    return {"grids": args.grid or (["standard"] if not args.case else []),
            "explicit_cases": args.case, "families": args.families, "reps": args.reps,
            "warmup": args.warmup, "min_reps": args.min_reps, "impl_budget_s": args.impl_budget,
            "sdpa_layout": args.sdpa_layout, "check_budget": args.check_budget,
            "seed": args.seed, "spin_ms": args.spin_ms, "tolerances": TOLERANCES,
            "lse_tolerance": LSE_TOLERANCE, "cache_dir": args.cache_dir,
            "deadline_s": args.deadline, "hbm_tbs": args.hbm_tbs,
            "num_splits": args.num_splits, "burst_ms": args.burst_ms,
            "min_calls": args.min_calls, "fa4": not args.no_fa4,
            "backward": {"configs": args.backward_configs, "bwd_family": args.bwd_family,
                         "deterministic": args.deterministic, "dtypes": args.bwd_dtype,
                         "gqa_groups": args.bwd_gqa, "gradient_tolerances": GRADIENT_TOLERANCES,
                         "flop_factor": 2.5},
            "reference": "float32 torch ops (matmul without TF32, logsumexp, softmax), "
                         "bottom-right causal mask, on the same bf16/fp16 inputs; first chunk "
                         "cross-checked against SDPA's math backend in fp32"}


def print_preamble(out, env, args):
    """What runs against what, how it is timed and what passes, above the table."""
    out(f"flashjit {env['flashjit']} (NVRTC {env['nvrtc']}) vs torch {env['torch']} SDPA "
        f"(cuDNN {env['cudnn']}, CUDA {env['torch_cuda']}) on {env['gpu']} "
        f"(cc {env['compute_capability']}, driver {env['cuda_driver']})")
    out(f"timing: CUDA events, median of {args.reps} repetitions interleaved round-robin across "
        f"implementations, after {args.warmup} warm-up calls; SDPA reads "
        + ("the same memory via .transpose(1,2) views" if args.sdpa_layout == "same"
           else "contiguous [b,h,s,d] copies"))
    out(f"check: vs float32 reference; pass: rel_err <= {TOLERANCES['bf16']['rel']:g} (bf16) / "
        f"{TOLERANCES['fp16']['rel']:g} (fp16), max_err <= {TOLERANCES['bf16']['abs']:g} / "
        f"{TOLERANCES['fp16']['abs']:g} x max(1, max|ref|), lse_err <= {LSE_TOLERANCE:g}")
    out("ratios: flashjit TFLOPS / SDPA TFLOPS (> 1: flashjit faster); † SDPA timed with "
        "is_causal=True (top-left mask) where s_q != s_k, not comparable, left out of geomeans")
    if any(is_kv_case(c) for c in args.cases):
        out(f"KV cases: bursts of >= {args.min_calls} back-to-back calls (~{args.burst_ms:g} ms "
            "of GPU time) between two CUDA events after a spin that covers their enqueue; "
            f"us/call = burst / calls, median of {args.reps} bursts interleaved round-robin; "
            f"floor = (K+V bytes / {args.hbm_tbs:g} TB/s) / time; x best = best peer's time / "
            "flashjit's (> 1: flashjit faster); SDPA only with the bottom-right mask; FA4 "
            f"{env.get('flash_attn_4') or 'not found'} (CuTe DSL {env.get('cutlass_dsl')})")
    if any(is_backward_case(c) for c in args.cases):
        out("backward cases: the backward alone, from each implementation's own forward (run "
            "once, not timed): flashjit_backward through the binding (its out and LSE; "
            f"configurations {', '.join(args.backward_configs)}), SDPA cuDNN and flash and FA4 "
            "through torch.autograd.grad(out, inputs, dout, retain_graph=True); bursts as the "
            f"KV cases' (as many calls as fill {args.burst_ms:g} ms, at least 1) interleaved "
            f"round-robin, median of {args.reps}; TFLOPS at 2.5x the forward's FLOPs (causal "
            "halved); x best = the faster of cuDNN and FA4 / flashjit (> 1: flashjit faster); "
            "check: dq, dk, dv vs autograd of fp32 math attention, max |err| / max |ref| <= "
            f"{GRADIENT_TOLERANCES['bf16']:g} (bf16) / {GRADIENT_TOLERANCES['fp16']:g} (fp16); "
            "flashjit's gradients and workspace poisoned before its checked call")
    if any(is_varlen_case(c) for c in args.cases):
        out("varlen cases: flashjit_forward_varlen and FA4 flash_attn_varlen_func on the packed "
            "batch, flashjit and FA4 dense on its dense twin (b x round(sqrt(mean L^2)), about "
            "the same causal work); bursts as the KV cases' (as many calls as fill "
            f"{args.burst_ms:g} ms, at least 1); TFLOPS from exact FLOPs (4*d*h_q per visible "
            "pair); vs dense = varlen TFLOPS / the same implementation's dense TFLOPS; x FA4 = "
            "FA4's time / flashjit's on the same call; packed outputs checked per sequence")


def fa4_off_reason(args):
    """Why FA4 is off for the dense grids' cases, None when it is on: --no-fa4, or
    flash_attn.cute not importable (tried once, here; the reason ends with FA4_HELP)."""
    if args.no_fa4:
        return NO_FA4
    if not any(kind_of(c) in ("attention", "backward") for c in args.cases):
        return None
    return load_fa4()[1]


def print_fa4_line(out, env, args, off):
    """The dense grids' FA4 line above the table: how it is called and timed, or, once for the
    whole column, why it is off."""
    if not any(kind_of(c) in ("attention", "backward") for c in args.cases):
        return
    if off:
        out("FA4 column: " + (off if off.startswith("off") else f"off, {off}"))
        return
    out(f"FA4 {env.get('flash_attn_4') or '(version unknown)'} (CuTe DSL "
        f"{env.get('cutlass_dsl')}): flash_attn.cute.flash_attn_func(q, k, v, softmax_scale=, "
        "causal=) on flashjit's memory (BHSD through .transpose(1,2) views; GQA: K/V with h_kv "
        "heads; causal bottom-right); its first call (compile) untimed, then timed and checked "
        "like SDPA; skip = FA4 refused the case (a note says why; left out of its geomeans); "
        "x FA4 = FA4 time / flashjit time; x best = the faster of cuDNN and FA4 / flashjit "
        "(> 1: flashjit faster)")


def case_picks(engine, case, args):
    """{family or KV implementation: (variant, None) or (None, error)} of one case."""
    if is_kv_case(case):
        return kv_variant_picks(engine, case, args.families, args.num_splits)
    if is_varlen_case(case):
        return varlen_variant_picks(engine, case, args.families)
    if is_backward_case(case):
        return backward_variant_picks(engine, case, args.backward_configs)
    return {f: select_variant(engine, case, f) for f in args.families}


def pick_variants(engine, args):
    """The variant of every case and family (or the refusal), and the dispatcher's family."""
    variants, auto_family = {}, {}
    for case in args.cases:
        variants[case.key()] = case_picks(engine, case, args)
        if is_kv_case(case) or is_varlen_case(case) or is_backward_case(case):
            continue
        auto_variant, _ = select_variant(engine, case, "auto")
        auto_family[case.key()] = auto_variant.split(".")[0] if auto_variant else None
    return {"variants": variants, "auto_family": auto_family}


def precompile_variants(lib, ctx, out):
    """Compiles every distinct variant the run needs, in parallel, before anything is timed.
    The backward cases' are left to their first (untimed) call: a dK/dV variant name does not
    name the dQ and row kernels that run with it."""
    backward = {c.key() for c in ctx["args"].cases if is_backward_case(c)}
    names = sorted({v for key, picks in ctx["variants"].items() if key not in backward
                    for v, _ in picks.values() if v})
    info = {"variants": names, "seconds": None, "error": None}
    if not names:
        return info
    t0 = time.perf_counter()
    try:
        lib.precompile(names, ctx["args"].cache_dir)
    except fj.FlashjitError as e:
        info["error"] = e.message
        out(f"precompile: some variants failed (their cases will show the error): "
            f"{short(e.message, 300)}")
    info["seconds"] = time.perf_counter() - t0
    out(f"compile: {len(names)} variants precompiled in {info['seconds']:.1f} s (NVRTC, in "
        "parallel; variants already in the disk cache cost ~0)")
    return info
