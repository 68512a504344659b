"""One KV case from start to end: flashjit's implementations run once into poisoned buffers,
every peer's trial call, all outputs checked against the float32 reference, then everything
timed in interleaved bursts; TB/s against the HBM floor, ratios to the best peer."""

import math
import statistics
import time

import flashjit_ctypes as fj

from . import gpu
from .backends import SdpaRunner
from .checks import reference_check
from .decode_backends import FlashjitKvRunner, KvInputs, gather_pages, impl_names
from .fa4 import Fa4Runner
from .run_case import case_entry, impl_cell
from .timing import burst, covering_spin_ms, plan_reps, round_robin

PEERS = ("sdpa_cudnn", "sdpa_flash", "fa4")
LABELS = {"flashjit": "flashjit", "flashjit_dense": "flashjit dense",
          "flashjit_seqused": "flashjit +seqused_k", "sdpa_cudnn": "SDPA cuDNN",
          "sdpa_flash": "SDPA flash (FA2)", "fa4": "FA4"}
NO_FA4 = "off (--no-fa4)"
MAX_CALLS = 256       # calls in one burst at most (CUDA's launch queue holds ~1000)
PAGED_TOLERANCE = 1.05  # paged within 5 % of flashjit's dense call on the same keys


def label(name):
    if name.startswith("flashjit."):
        return f"flashjit [{name.split('.', 1)[1]}]"
    return LABELS.get(name, name)


def headline_impl(result):
    """The flashjit implementation a case's ratio and the summary use."""
    cells = result["impls"]
    if "flashjit" in cells:
        return "flashjit"
    return next((n for n in cells if n.startswith("flashjit.")), None)


def run_kv_case(index, case, ctx):
    """Checks and times one KV case; returns its results.json entry (kv_cases[])."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = case_entry(index, case, impls={}, notes=[], hbm_tbs=args.hbm_tbs,
                        hbm_floor_us=case.hbm_floor_us(args.hbm_tbs))
    inputs = KvInputs(case, args.seed + index)
    runners = start_flashjit(result, case, ctx, inputs, scale)
    runners.update(start_peers(result, case, inputs, scale, args))
    check_outputs(result, case, inputs, scale, runners, args)
    if runners and not args.no_time:
        time_impls(result, case, runners, ctx)
    add_ratios(result, case)
    return result


def _refused(err, variant=None, missing="no KV API"):
    if isinstance(err, fj.FlashjitLoadError):  # a build without flashjit_forward_kv
        return impl_cell("n/a", variant=variant, reason=str(err), status_name=missing)
    status = "n/a" if err.unsupported else "error"
    return impl_cell(status, variant=variant, reason=err.message, status_name=err.status_name)


def start_flashjit(result, case, ctx, inputs, scale):
    """One checked call per flashjit implementation into NaN-poisoned output, LSE and workspace
    (the variant's first call in this process). Returns {name: runner} of those that ran."""
    runners = {}
    picks = ctx["variants"][case.key()]
    for name in impl_names(case, ctx["families"]):
        variant, err = picks[name]
        if err is not None:
            result["impls"][name] = _refused(err)
            continue
        try:
            runner = FlashjitKvRunner(ctx["engine"], case, inputs, name, scale,
                                      ctx["args"].num_splits)
            runner.poison()
            gpu.sync()
            t0 = time.perf_counter()
            runner()
            gpu.sync()
        except (fj.FlashjitError, fj.FlashjitLoadError) as e:
            result["impls"][name] = _refused(e, variant)
            continue
        result["impls"][name] = impl_cell(
            "ok", variant=runner.variant, num_splits=runner.num_splits,
            workspace_bytes=runner.options.workspace_bytes,
            first_call_ms=(time.perf_counter() - t0) * 1e3)
        runners[name] = runner
    return runners


def start_peers(result, case, inputs, scale, args):
    """The peers' trial calls: SDPA cuDNN and flash on dense cases (bottom-right mask only),
    FA4 on every case (unless --no-fa4). A refusal is an n/a cell with the reason."""
    runners = {}
    if not case.paged:
        for backend in ("cudnn", "flash"):
            r = SdpaRunner(backend, case, inputs.q, inputs.k, inputs.v, scale, args.sdpa_layout,
                           bottom_right_only=True)
            name = f"sdpa_{backend}"
            if r.error:
                result["impls"][name] = impl_cell("n/a", reason=r.error)
                continue
            result["impls"][name] = impl_cell(
                "ok", layout=r.layout, gqa=r.gqa_mode, mask=r.mask,
                mask_alignment=r.mask_alignment, notes=r.notes, how=_sdpa_how(r))
            runners[name] = r
    if getattr(args, "no_fa4", False):
        result["impls"]["fa4"] = impl_cell("n/a", reason=NO_FA4)
        return runners
    r = Fa4Runner(case, inputs, scale)
    if r.error:
        result["impls"]["fa4"] = impl_cell("n/a", reason=r.error)
    else:
        result["impls"]["fa4"] = impl_cell("ok", how=r.how)
        runners["fa4"] = r
    return runners


def _sdpa_how(r):
    """GQA handling, memory and mask of an SDPA cell, for the table."""
    parts = []
    if r.gqa_mode == "enable_gqa":
        parts.append("enable_gqa=True")
    elif r.gqa_mode == "repeat_interleave":
        group = r.case.heads_q // r.case.heads_kv
        parts.append(f"K/V expanded x{group} (repeat_interleave, not timed: reads {group}x "
                     "the bytes)")
    parts.append("same memory" if r.layout == "same" else "contiguous bhsd copies")
    if r.mask == "bool_mask":
        parts.append("bool attn_mask (bottom-right)")
    elif r.mask == "lower_right":
        parts.append("causal_lower_right")
    return ", ".join(parts)


def _output(name, runner):
    if name.startswith("flashjit"):
        return runner.out, runner.lse
    if name.startswith("sdpa_"):
        return runner.out.transpose(1, 2), None
    return runner.out, None


def check_outputs(result, case, inputs, scale, runners, args):
    """Every output against the float32 reference on the dense K/V (the pages hold the same
    keys: checked too); peers' results are recorded, only flashjit's count as failures."""
    if args.no_check or not runners:
        result["check"] = {"checked": "not checked (--no-check)" if args.no_check else "nothing"}
        return
    t0 = time.perf_counter()
    outputs = {name: _output(name, r) for name, r in runners.items()}
    errors, description, math_diff = reference_check(case, inputs.q, inputs.k, inputs.v, scale,
                                                     outputs, args.check_budget)
    result["check"] = {"checked": description, "seconds": time.perf_counter() - t0,
                       "reference_vs_sdpa_math_fp32": math_diff}
    if case.paged:
        same = all(bool((gather_pages(case, pages, inputs.page_table) == dense).all())
                   for pages, dense in ((inputs.k_pages, inputs.k), (inputs.v_pages, inputs.v)))
        result["check"]["pages_match_dense"] = same
        if not same:
            result["notes"].append("harness bug: the pages do not hold the dense keys")
    for name, err in errors.items():
        result["impls"][name]["check"] = err
    for name, r in runners.items():
        if not name.startswith("flashjit"):
            r.out = None  # the trial output is checked; free it before timing


def time_impls(result, case, runners, ctx):
    """The KV cases' bursts (time_bursts), with TB/s, share of the HBM floor and TFLOPS."""
    hbm_tbs = ctx["args"].hbm_tbs

    def metrics(name, median_us):
        return {"tbs": case.kv_bytes() / (median_us * 1e-6) / 1e12,
                "hbm_fraction": case.hbm_floor_us(hbm_tbs) / median_us,
                "tflops": case.flops() / (median_us * 1e-6) / 1e12}
    time_bursts(result, runners, ctx, metrics)


def time_bursts(result, runners, ctx, metrics, fewest_calls=None, name_of=label):
    """Warm-up; a calibration burst per implementation (host enqueue and GPU time per call,
    the queue held by a spin); then round-robin bursts of `calls` back-to-back calls between
    two CUDA events, each after a spin long enough to cover the burst's enqueue. Per-call time:
    burst time / calls; the median over bursts goes into the cell, with metrics(name, median
    us). fewest_calls(name, seconds of one warm-up call): the fewest calls in a burst (default
    --min-calls), also the calibration burst's size; name_of(name): its name in notes."""
    args, timer = ctx["args"], ctx["timer"]
    wall = {}
    for name, fn in runners.items():
        for _ in range(max(1, args.warmup)):
            t0 = time.perf_counter()
            fn()
            gpu.sync()
            wall[name] = time.perf_counter() - t0
    calls, spins, spin_ms, per_burst = {}, {}, {}, {}
    for name, fn in runners.items():
        k = fewest_calls(name, wall[name]) if fewest_calls else args.min_calls
        handle = timer.launch(burst(fn, k), timer.cycles_for(1.5 * k * wall[name] * 1e3 + 1.0))
        gpu.sync()
        gpu_ms, host_ms = max(1e-4, timer.elapsed_ms(handle) / k), handle[2] / k
        calls[name] = max(k, min(MAX_CALLS, math.ceil(args.burst_ms / gpu_ms)))
        spin_ms[name] = covering_spin_ms(timer, args.spin_ms, calls[name] * host_ms)
        spins[name] = timer.cycles_for(spin_ms[name])
        per_burst[name] = (calls[name] * gpu_ms + spin_ms[name]) / 1e3
    time_left = ctx["deadline"] - time.monotonic() - 5.0
    targets = plan_reps(per_burst, args.reps, args.min_reps, args.impl_budget, time_left)
    enqueue = {}
    samples = round_robin({n: burst(fn, calls[n]) for n, fn in runners.items()}, targets, timer,
                          spins, enqueue)
    for name, times in samples.items():
        per_call_us = [t * 1e3 / calls[name] for t in times]
        median = statistics.median(per_call_us)
        uncovered = sum(1 for e in enqueue[name] if e > spin_ms[name]) if spin_ms[name] else None
        result["impls"][name].update({
            "median_us": median, "min_us": min(per_call_us), "max_us": max(per_call_us),
            "reps": len(times), "calls_per_rep": calls[name], "spin_ms": spin_ms[name],
            "enqueue_ms_max": max(enqueue[name]), "reps_enqueue_over_spin": uncovered,
            **metrics(name, median)})
        if uncovered:
            result["notes"].append(f"{name_of(name)}: {uncovered} of {len(times)} bursts took "
                                   f"longer to enqueue than their {spin_ms[name]:.2f} ms spin "
                                   "(host time may be in those samples)")
        if len(times) < args.reps:
            result["reduced_reps"] = True
            result["notes"].append(f"{name_of(name)}: only {len(times)} bursts (--impl-budget "
                                   f"{args.impl_budget:g} s, --deadline {args.deadline:g} s)")


def add_ratios(result, case):
    """Best peer time / flashjit time per flashjit implementation (> 1: flashjit faster), each
    peer's ratio, and for paged cases flashjit paged / flashjit dense (time; <= 1.05 passes)."""
    cells = result["impls"]
    peers = {n: cells[n]["median_us"] for n in PEERS if cells.get(n, {}).get("median_us")
             and cells[n].get("mask_alignment") != "top-left"}
    best = min(peers, key=peers.get) if peers else None
    result["best_peer"] = best
    for name, cell in cells.items():
        if not name.startswith("flashjit") or not cell.get("median_us"):
            continue
        cell["ratio_peers"] = {p: t / cell["median_us"] for p, t in peers.items()}
        if best:
            cell["ratio_best_peer"] = peers[best] / cell["median_us"]
    main, dense = cells.get(headline_impl(result) or "", {}), cells.get("flashjit_dense", {})
    if case.paged and main.get("median_us") and dense.get("median_us"):
        result["paged_over_dense"] = main["median_us"] / dense["median_us"]
        result["paged_within_5pct"] = result["paged_over_dense"] <= PAGED_TOLERANCE
