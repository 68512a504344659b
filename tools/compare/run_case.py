"""One case from start to end: flashjit, SDPA and FA4 run once, checked, timed, then
compared."""

import math
import statistics
import time
from types import SimpleNamespace

import flashjit_ctypes as fj

from . import gpu
from .backends import BEST_PEERS, SDPA_BACKENDS, FlashjitRunner, SdpaRunner, make_inputs
from .checks import REFERENCE_SELF_TOLERANCE, reference_check
from .fa4 import Fa4Runner
from .timing import enqueue_spins, plan_reps, round_robin


def impl_cell(status, **values):
    cell = {"status": status}
    cell.update(values)
    return cell


def case_entry(index, case, **values):
    """A case's results.json entry: what names the case, then `values` in their order."""
    return {"index": index, "case": case.key(), "label": case.label(), **case.fields(),
            "flops": case.flops(), **values}


def run_case(index, case, ctx):
    """Checks and times one case; returns its results.json entry.

    ctx: args, engine, families, variants and auto_family (per case key), deadline, timer;
    fa4_off: why FA4 is off for the whole run (--no-fa4, not importable), None when on."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = case_entry(index, case, flops_exact=case.flops_exact(), flashjit={}, sdpa={},
                        fa4=None, notes=[])
    result["auto_family"] = ctx["auto_family"].get(case.key())

    q, k, v = make_inputs(case, args.seed + index)
    flashjit = run_flashjit(result, case, ctx, q, k, v, scale)
    sdpa = start_sdpa(result, case, q, k, v, scale, args.sdpa_layout)
    fa4 = start_fa4(result, case, q, k, v, scale, ctx.get("fa4_off"))
    errors = check_outputs(result, case, q, k, v, scale, flashjit, sdpa, args, fa4)
    record_checks(result, sdpa, errors, fa4)
    runners = {**{f"flashjit:{f}": r for f, r in flashjit.items()},
               **{f"sdpa:{b}": r for b, r in sdpa.items()}, **({"fa4": fa4} if fa4 else {})}
    if runners and not args.no_time:
        time_runners(result, case, runners, ctx)
    add_ratios(result)
    return result


def run_flashjit(result, case, ctx, q, k, v, scale):
    """One checked call per family into poisoned buffers (the first call of the variant in this
    process: module load, or NVRTC when precompile did not cover it). Returns {family: runner}
    for the families that ran."""
    runners = {}
    variants = ctx["variants"][case.key()]
    for family in ctx["families"]:
        variant, err = variants[family]
        if err is not None:
            result["flashjit"][family] = _refused_cell(err, None)
            continue
        runner = FlashjitRunner(ctx["engine"], case, q, k, v, family, scale)
        runner.poison()
        gpu.sync()
        t0 = time.perf_counter()
        try:
            runner()
            gpu.sync()
        except fj.FlashjitError as e:
            result["flashjit"][family] = _refused_cell(e, variant)
            continue
        first_ms = (time.perf_counter() - t0) * 1e3
        result["flashjit"][family] = impl_cell("ok", variant=variant, first_call_ms=first_ms)
        runners[family] = runner
    return runners


def _refused_cell(err, variant):
    """An unsupported case is n/a; any other error status is an error."""
    status = "n/a" if err.unsupported else "error"
    return impl_cell(status, variant=variant, reason=err.message, status_name=err.status_name)


def start_sdpa(result, case, q, k, v, scale, layout_mode):
    """{backend: SdpaRunner} of the backends that take the case; the trial call is also its
    first (graph-building) call. A refusal goes into result as n/a."""
    runners = {}
    for backend in SDPA_BACKENDS:
        runner = SdpaRunner(backend, case, q, k, v, scale, layout_mode)
        if runner.error:
            result["sdpa"][backend] = impl_cell("n/a", reason=runner.error)
            continue
        runners[backend] = runner
    return runners


def start_fa4(result, case, q, k, v, scale, off):
    """FA4's trial call (fa4.Fa4Runner: flash_attn_func on the same q, k, v views, its first
    call, which compiles the kernel), or None. off: why FA4 is off for the whole run (a cell
    'off'; the report says why once); a refusal is an n/a cell with FA4's reason."""
    if off:
        result["fa4"] = impl_cell("off")
        return None
    runner = Fa4Runner(case, SimpleNamespace(q=q, k=k, v=v), scale)
    if runner.error:
        result["fa4"] = impl_cell("n/a", reason=runner.error)
        return None
    result["fa4"] = impl_cell("ok", how=runner.how, layout=runner.layout,
                              notes=["contiguous [b,s,h,d] copies (not timed); the same-memory "
                                     "views were refused"] if runner.layout == "copy" else [])
    return runner


def check_outputs(result, case, q, k, v, scale, flashjit, sdpa, args, fa4=None):
    """Every output against the float32 reference; returns {output name: check result}.

    SDPA's and FA4's outputs go through it too: their error shows what bf16/fp16 costs a
    trusted kernel, and tells whether an is_causal=True call computed our (bottom-right) mask
    after all."""
    outputs = {f"flashjit:{f}": (r.out, r.lse) for f, r in flashjit.items()}
    outputs.update({f"sdpa:{b}": (r.out.transpose(1, 2), None) for b, r in sdpa.items()})
    if fa4 is not None:
        outputs["fa4"] = (fa4.out, None)  # [b, s_q, h, d], as q (FA4 returns no LSE here)
    if not outputs or args.no_check:
        result["check"] = {"checked": "not checked (--no-check)" if args.no_check else "nothing"}
        return {}
    t0 = time.perf_counter()
    errors, description, math_diff = reference_check(case, q, k, v, scale, outputs,
                                                     args.check_budget)
    result["check"] = {"checked": description, "seconds": time.perf_counter() - t0,
                       "reference_vs_sdpa_math_fp32": math_diff}
    if math_diff is not None and math_diff > REFERENCE_SELF_TOLERANCE:
        result["notes"].append(f"the fp32 reference differs from SDPA's math backend in fp32 "
                               f"by {math_diff:.1e}: suspect the harness, not the kernel")
    return errors


def reference_error(err):
    """A peer's error against the reference, as its cell records it (no pass/fail of ours)."""
    out = {key: err[key] for key in ("rel_err", "max_abs_err", "max_abs_ref", "nonfinite")}
    out["within_bounds"] = err["pass"]
    return out


def record_checks(result, sdpa, errors, fa4=None):
    """Check results into the flashjit cells; the SDPA cells written, FA4's error into its
    cell, trial outputs dropped."""
    for family, cell in result["flashjit"].items():
        if f"flashjit:{family}" in errors:
            cell["check"] = errors[f"flashjit:{family}"]
    for backend, runner in sdpa.items():
        err = errors.get(f"sdpa:{backend}")
        if err and runner.mask_alignment == "top-left" and err["pass"]:
            runner.verified_bottom_right()
        cell = impl_cell("ok", layout=runner.layout, gqa=runner.gqa_mode, mask=runner.mask,
                         mask_alignment=runner.mask_alignment, notes=runner.notes)
        if err and runner.mask_alignment != "top-left":
            cell["reference_error"] = reference_error(err)
        result["sdpa"][backend] = cell
        runner.out = None
    if fa4 is not None:
        if errors.get("fa4"):
            result["fa4"]["reference_error"] = reference_error(errors["fa4"])
        fa4.out = None


def time_runners(result, case, runners, ctx):
    """Warm-up, a repetition plan that fits the deadline, round-robin timing; medians into the
    cells of result. runners: {'flashjit:FAMILY', 'sdpa:BACKEND' or 'fa4': callable}, all
    timed alike. Each call's enqueue (host) time is kept: a call that outlasted its spin may
    have host time in its sample (FA4's Python path is ~100 us a call), and a note says so."""
    args = ctx["args"]
    per_call = {}
    for name, fn in runners.items():
        for i in range(max(1, args.warmup)):  # >= 1: the repetition plan needs a time
            t0 = time.perf_counter()
            fn()
            gpu.sync()
            per_call[name] = time.perf_counter() - t0
            if per_call[name] > 1.0:  # one warm call is enough for a kernel that slow
                break
    timer = ctx["timer"]
    spins, spin_ms = enqueue_spins(runners, timer, args.spin_ms)
    time_left = ctx["deadline"] - time.monotonic()
    targets = plan_reps(per_call, args.reps, args.min_reps, args.impl_budget, time_left - 5.0)
    enqueue = {}
    samples = round_robin(runners, targets, timer, spins, enqueue)
    for name, times in samples.items():
        cell = timed_cell(result, name)
        median = statistics.median(times)
        cell.update({"median_ms": median, "min_ms": min(times), "max_ms": max(times),
                     "reps": len(times), "tflops": case.flops() / (median * 1e-3) / 1e12,
                     "enqueue_ms_max": max(enqueue[name]), "spin_ms": spin_ms[name]})
        if spin_ms[name]:
            over = sum(1 for e in enqueue[name] if e > spin_ms[name])
            cell["reps_enqueue_over_spin"] = over
            if over:
                result["notes"].append(f"{name}: {over} of {len(times)} calls took longer to "
                                       f"enqueue than their {spin_ms[name]:.2f} ms spin (host "
                                       "time may be in those samples)")
        if len(times) < args.reps:
            result["reduced_reps"] = True
            result["notes"].append(f"{name}: only {len(times)} repetitions (calls of "
                                   f"{per_call[name] * 1e3:.0f} ms; --impl-budget "
                                   f"{args.impl_budget:g} s, --deadline {args.deadline:g} s)")


def timed_cell(result, name):
    """The cell of result that runner `name` ('flashjit:FAMILY', 'sdpa:BACKEND', 'fa4') fills."""
    kind, _, which = name.partition(":")
    return result[kind][which] if which else result[kind]


def add_ratios(result):
    """Ours / theirs in TFLOPS = their median time / ours (> 1: flashjit is faster): per SDPA
    backend, FA4 (ratio_fa4), and the best peer, the faster of cuDNN and FA4 where each did our
    work (ratio_best_peer; result's best_peer names it)."""
    fa4 = result.get("fa4") or {}
    cells = {"fa4": fa4, **result["sdpa"]}
    peers = {p: cells[p]["median_ms"] for p in BEST_PEERS if cells.get(p, {}).get("median_ms")
             and cells[p].get("mask_alignment") != "top-left"}
    best = min(peers, key=peers.get) if peers else None
    result["best_peer"] = best
    for family, cell in result["flashjit"].items():
        for backend in SDPA_BACKENDS:
            theirs = result["sdpa"].get(backend, {})
            if cell.get("median_ms") and theirs.get("median_ms"):
                cell[f"ratio_{backend}"] = theirs["median_ms"] / cell["median_ms"]
                # comparable: same mask semantics (a top-left causal SDPA does other work)
                cell[f"ratio_{backend}_comparable"] = theirs.get("mask_alignment") != "top-left"
        if cell.get("median_ms") and fa4.get("median_ms"):
            cell["ratio_fa4"] = fa4["median_ms"] / cell["median_ms"]
        if cell.get("median_ms") and best:
            cell["ratio_best_peer"] = peers[best] / cell["median_ms"]
