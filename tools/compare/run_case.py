"""One case from start to end: flashjit and SDPA run once, checked, timed, then compared."""

import math
import statistics
import time

import flashjit_ctypes as fj

from . import gpu
from .backends import SDPA_BACKENDS, FlashjitRunner, SdpaRunner, make_inputs
from .checks import REFERENCE_SELF_TOLERANCE, reference_check
from .timing import plan_reps, round_robin


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

    ctx: args, engine, families, variants and auto_family (per case key), deadline, timer."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = case_entry(index, case, flops_exact=case.flops_exact(), flashjit={}, sdpa={},
                        notes=[])
    result["auto_family"] = ctx["auto_family"].get(case.key())

    q, k, v = make_inputs(case, args.seed + index)
    flashjit = run_flashjit(result, case, ctx, q, k, v, scale)
    sdpa = start_sdpa(result, case, q, k, v, scale, args.sdpa_layout)
    errors = check_outputs(result, case, q, k, v, scale, flashjit, sdpa, args)
    record_checks(result, sdpa, errors)
    runners = {**{f"flashjit:{f}": r for f, r in flashjit.items()},
               **{f"sdpa:{b}": r for b, r in sdpa.items()}}
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


def check_outputs(result, case, q, k, v, scale, flashjit, sdpa, args):
    """Every output against the float32 reference; returns {output name: check result}.

    SDPA's outputs go through it too: their error shows what bf16/fp16 costs a trusted kernel,
    and tells whether an is_causal=True call computed our (bottom-right) mask after all."""
    outputs = {f"flashjit:{f}": (r.out, r.lse) for f, r in flashjit.items()}
    outputs.update({f"sdpa:{b}": (r.out.transpose(1, 2), None) for b, r in sdpa.items()})
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


def record_checks(result, sdpa, errors):
    """Check results into the flashjit cells; the SDPA cells written, trial outputs dropped."""
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
            cell["reference_error"] = {key: err[key] for key in
                                       ("rel_err", "max_abs_err", "max_abs_ref", "nonfinite")}
            cell["reference_error"]["within_bounds"] = err["pass"]
        result["sdpa"][backend] = cell
        runner.out = None


def time_runners(result, case, runners, ctx):
    """Warm-up, a repetition plan that fits the deadline, round-robin timing; medians into the
    cells of result. runners: {'flashjit:FAMILY' or 'sdpa:BACKEND': callable}."""
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
    time_left = ctx["deadline"] - time.monotonic()
    targets = plan_reps(per_call, args.reps, args.min_reps, args.impl_budget, time_left - 5.0)
    samples = round_robin(runners, targets, ctx["timer"])
    for name, times in samples.items():
        kind, which = name.split(":")
        cell = result["flashjit" if kind == "flashjit" else "sdpa"][which]
        median = statistics.median(times)
        cell.update({"median_ms": median, "min_ms": min(times), "max_ms": max(times),
                     "reps": len(times), "tflops": case.flops() / (median * 1e-3) / 1e12})
        if len(times) < args.reps:
            result["reduced_reps"] = True
            result["notes"].append(f"{name}: only {len(times)} repetitions (calls of "
                                   f"{per_call[name] * 1e3:.0f} ms; --impl-budget "
                                   f"{args.impl_budget:g} s, --deadline {args.deadline:g} s)")


def add_ratios(result):
    """Ours / theirs in TFLOPS = their median time / ours (> 1: flashjit is faster)."""
    for family, cell in result["flashjit"].items():
        for backend in SDPA_BACKENDS:
            theirs = result["sdpa"].get(backend, {})
            if cell.get("median_ms") and theirs.get("median_ms"):
                cell[f"ratio_{backend}"] = theirs["median_ms"] / cell["median_ms"]
                # comparable: same mask semantics (a top-left causal SDPA does other work)
                cell[f"ratio_{backend}_comparable"] = theirs.get("mask_alignment") != "top-left"
