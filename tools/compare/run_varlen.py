"""One varlen case from start to end: flashjit's varlen call (per --family) and its dense call
on the twin, once each into poisoned buffers; FA4's trial calls; the packed outputs checked
sequence by sequence, the dense ones on the twin, against the float32 reference; then all of it
timed in interleaved bursts. TFLOPS from exact FLOPs; varlen vs dense on the same work (each
implementation against its own dense call), flashjit vs FA4 (varlen, and dense)."""

import math
import time

import flashjit_ctypes as fj

from . import gpu
from .backends import FlashjitRunner
from .checks import REFERENCE_SELF_TOLERANCE, reference_check
from .run_case import case_entry, impl_cell
from .run_decode import NO_FA4, _refused, time_bursts
from .varlen_backends import (SDPA_REASON, Fa4VarlenRunner, FlashjitVarlenRunner, VarlenInputs,
                              first_call_variants, impl_names, sequence_case)

LABELS = {"flashjit": "flashjit varlen", "flashjit_dense": "flashjit dense",
          "fa4": "FA4 varlen", "fa4_dense": "FA4 dense", "sdpa": "SDPA (cuDNN, FA2)"}


def label(name):
    if name.startswith("flashjit."):
        return f"flashjit varlen [{name.split('.', 1)[1]}]"
    return LABELS.get(name, name)


def is_dense(name):
    return name.endswith("_dense")


def is_ours(name):
    return name.startswith("flashjit")


def headline_impl(result):
    """The flashjit varlen implementation a case's verdict and the summary use."""
    cells = result["impls"]
    if "flashjit" in cells:
        return "flashjit"
    return next((n for n in cells if n.startswith("flashjit.")), None)


def run_varlen_case(index, case, ctx):
    """Checks and times one varlen case; returns its results.json entry (varlen_cases[])."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = case_entry(index, case, impls={}, notes=[])
    inputs = VarlenInputs(case, args.seed + index)
    runners = start_flashjit(result, case, ctx, inputs, scale)
    runners.update(start_peers(result, case, inputs, scale, args))
    check_outputs(result, case, inputs, scale, runners, args)
    if runners and not args.no_time:
        time_impls(result, case, runners, ctx)
    add_ratios(result)
    return result


def start_flashjit(result, case, ctx, inputs, scale):
    """One checked call per flashjit implementation into NaN-poisoned output, LSE (and
    workspace): the variant's first call in this process. A varlen call's variant is read from
    the engine's record of that call. Returns {name: runner} of those that ran."""
    runners = {}
    picks = ctx["variants"][case.key()]
    for name in impl_names(case, ctx["families"]):
        variant, err = picks[name]
        if err is not None:
            result["impls"][name] = _refused(err, missing="no varlen API")
            continue
        dense = is_dense(name)
        try:
            if dense:
                runner = FlashjitRunner(ctx["engine"], inputs.dense, inputs.dq, inputs.dk,
                                        inputs.dv, "auto", scale)
            else:
                runner = FlashjitVarlenRunner(ctx["engine"], case, inputs, name, scale,
                                              ctx["args"].num_splits)
            runner.poison()
            gpu.sync()
            t0 = time.perf_counter()
            if dense:
                runner()
            else:
                recorded = first_call_variants(ctx["engine"], runner)
            gpu.sync()
        except (fj.FlashjitError, fj.FlashjitLoadError) as e:
            result["impls"][name] = _refused(e, variant, missing="no varlen API")
            continue
        cell = impl_cell("ok", variant=variant, first_call_ms=(time.perf_counter() - t0) * 1e3)
        if not dense:
            cell["variant"] = ", ".join(recorded) if recorded else None
            cell["variant_source"] = ("the engine's record of its first call" if recorded else
                                      "not named: this build cannot record variants"
                                      if recorded is None else "not named: none recorded")
            cell["workspace_bytes"] = runner.options.workspace_bytes
        result["impls"][name] = cell
        runners[name] = runner
    return runners


def start_peers(result, case, inputs, scale, args):
    """FA4's trial calls, varlen and on the dense twin (a refusal: n/a with the reason; none
    with --no-fa4); SDPA is n/a: it has no varlen call."""
    runners = {}
    for name, dense in (("fa4", False), ("fa4_dense", True)):
        if getattr(args, "no_fa4", False):
            result["impls"][name] = impl_cell("n/a", reason=NO_FA4)
            continue
        r = Fa4VarlenRunner(case, inputs, scale, dense)
        if r.error:
            result["impls"][name] = impl_cell("n/a", reason=r.error)
            continue
        result["impls"][name] = impl_cell("ok", how=r.how)
        runners[name] = r
    result["impls"]["sdpa"] = impl_cell("n/a", reason=SDPA_REASON)
    return runners


def check_outputs(result, case, inputs, scale, runners, args):
    """Packed outputs against the float32 reference sequence by sequence, dense outputs on the
    twin; peers' results are recorded, only flashjit's count as failures."""
    if args.no_check or not runners:
        result["check"] = {"checked": "not checked (--no-check)" if args.no_check else "nothing"}
        return
    t0 = time.perf_counter()
    outputs = {name: (r.out, r.lse if is_ours(name) else None) for name, r in runners.items()}
    packed = {n: o for n, o in outputs.items() if not is_dense(n)}
    dense = {n: o for n, o in outputs.items() if is_dense(n)}
    errors, check = {}, {}
    if packed:
        found, check["checked"], check["reference_vs_sdpa_math_fp32"] = check_packed(
            case, inputs, scale, packed, args.check_budget)
        errors.update(found)
    if dense:
        found, check["dense_checked"], check["dense_reference_vs_sdpa_math_fp32"] = \
            reference_check(inputs.dense, inputs.dq, inputs.dk, inputs.dv, scale, dense,
                            args.check_budget)
        errors.update(found)
    check["seconds"] = time.perf_counter() - t0
    result["check"] = check
    for key in ("reference_vs_sdpa_math_fp32", "dense_reference_vs_sdpa_math_fp32"):
        if (check.get(key) or 0) > REFERENCE_SELF_TOLERANCE:
            result["notes"].append(f"the fp32 reference differs from SDPA's math backend in "
                                   f"fp32 by {check[key]:.1e}: suspect the harness")
    for name, err in errors.items():
        result["impls"][name]["check"] = err
    for name, r in runners.items():
        if not is_ours(name):
            r.out = None  # the trial output is checked; free it before timing


def check_packed(case, inputs, scale, outputs, budget):
    """Every sequence against its own fp32 reference (its rows of the packed q, k, v, the mask
    within it), errors summed over sequences into one result per output; --check-budget shared
    among sequences in proportion to their scores. outputs: {name: (out [1, total, h, d],
    lse [h, total] or None)}. Returns (errors, what was checked, max reference-vs-SDPA-math)."""
    stats, described, diffs = {}, {}, []
    cu = case.cu_seqlens()
    scores = case.heads_q * sum(n * n for n in case.seqlens)
    for i, n in enumerate(case.seqlens):
        a, b = cu[i], cu[i + 1]
        sliced = {name: (out[:, a:b], None if lse is None else lse[:, a:b].unsqueeze(0))
                  for name, (out, lse) in outputs.items()}
        _, what, diff = reference_check(sequence_case(case, n), inputs.q[:, a:b],
                                        inputs.k[:, a:b], inputs.v[:, a:b], scale, sliced,
                                        budget * case.heads_q * n * n // scores, stats)
        described[what] = described.get(what, 0) + 1
        if diff is not None:
            diffs.append(diff)
    if list(described) == ["all heads, all rows"]:
        what = "all heads, all rows"
    else:
        what = "per sequence: " + "; ".join(
            f"{w.replace('(batch, head) pairs', 'heads')} ({c} of {case.batch})"
            for w, c in described.items())
    return ({name: stats[name].result() for name in outputs}, what,
            max(diffs) if diffs else None)


def time_impls(result, case, runners, ctx):
    """The KV cases' interleaved bursts (run_decode.time_bursts), TFLOPS from each call's exact
    FLOPs (the twin's for the dense calls). A prefill call takes milliseconds, so the fewest
    calls in a burst is --min-calls only when that many fit in --burst-ms, else as many as fit,
    at least one (a burst still holds as many as fill --burst-ms)."""
    args = ctx["args"]

    def metrics(name, median_us):
        flops = case.dense_flops() if is_dense(name) else case.flops()
        return {"tflops": flops / (median_us * 1e-6) / 1e12}

    def fewest_calls(name, wall_s):
        return max(1, min(args.min_calls, int(args.burst_ms / max(wall_s * 1e3, 1e-6))))
    time_bursts(result, runners, ctx, metrics, fewest_calls, label)


def add_ratios(result):
    """flashjit vs FA4 on the same call (peer time / ours: > 1, flashjit faster): varlen vs FA4
    varlen, dense vs FA4 dense; and each varlen call's rate against its own dense call's on the
    twin: rate_vs_dense = TFLOPS / dense TFLOPS, varlen_cost_pct = (dense / varlen - 1) x 100."""
    cells = result["impls"]
    for name, cell in cells.items():
        if not cell.get("median_us"):
            continue
        if is_ours(name):
            peer = cells.get("fa4_dense" if is_dense(name) else "fa4", {})
            if peer.get("median_us"):
                cell["peer"] = "fa4_dense" if is_dense(name) else "fa4"
                cell["ratio_peer"] = peer["median_us"] / cell["median_us"]
        if not is_dense(name):
            twin = "fa4_dense" if name == "fa4" else "flashjit_dense"
            dense = cells.get(twin, {})
            if dense.get("tflops") and cell.get("tflops"):
                cell["dense_impl"] = twin
                cell["rate_vs_dense"] = cell["tflops"] / dense["tflops"]
                cell["varlen_cost_pct"] = (dense["tflops"] / cell["tflops"] - 1.0) * 100.0
