"""One backward case from start to end: flashjit's forward once (its out and LSE), then each
flashjit backward configuration once into poisoned gradients and workspace; SDPA cuDNN, SDPA
flash (FA2) and FA4 forward once and backward once through autograd; every gradient checked
against the float32 reference; then the backward calls alone timed in interleaved bursts of
back-to-back calls between CUDA events (run_decode.time_bursts); ratios to each peer and to
the best of cuDNN and FA4."""

import math
import time

import flashjit_ctypes as fj

from . import gpu
from .backward_backends import (BackwardInputs, Fa4BackwardRunner, FlashjitBackwardRunner,
                                FlashjitForward, SdpaBackwardRunner)
from .backward_checks import gradient_check
from .run_case import case_entry, impl_cell
from .run_decode import _refused, time_bursts

PEERS = ("cudnn", "flash", "fa4")
BEST_PEERS = ("cudnn", "fa4")  # backends.BEST_PEERS's reasoning: FA2 is superseded by FA4
LABELS = {"cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2)", "fa4": "FA4"}


def impl_name(config):
    return f"flashjit.{config}"


def is_ours(name):
    return name.startswith("flashjit")


def label(name):
    if is_ours(name):
        return f"flashjit [{name.split('.', 1)[1]}]"
    return LABELS.get(name, name)


def run_backward_case(index, case, ctx):
    """Checks and times one backward case; returns its results.json entry (backward_cases[]).

    ctx: args, engine, backward_configs, variants (per case key: {config: (variant, error)}),
    deadline, timer, fa4_off (why FA4 is off for the whole run, None when on)."""
    args = ctx["args"]
    scale = 1.0 / math.sqrt(case.head_dim)
    result = case_entry(index, case, flops_exact=case.flops_exact(),
                        forward_flops=case.forward_flops(), impls={}, notes=[])
    inputs = BackwardInputs(case, args.seed + index)
    runners = start_flashjit(result, case, ctx, inputs, scale)
    peers = start_peers(result, case, inputs, scale, ctx.get("fa4_off"))
    check_gradients(result, case, inputs, scale, runners, peers, args)
    runners.update(peers)
    if runners and not args.no_time:
        time_backward(result, case, runners, ctx)
    add_ratios(result)
    return result


def start_flashjit(result, case, ctx, inputs, scale):
    """flashjit's forward once, then one call per backward configuration into NaN gradients and
    a 0xff workspace (its variants' first call in this process: module load, or NVRTC).
    Returns {name: runner} of the configurations that ran."""
    runners, picks = {}, ctx["variants"][case.key()]
    forward = None
    for config in ctx["backward_configs"]:
        name = impl_name(config)
        variant, err = picks[config]
        if err is not None:
            result["impls"][name] = _refusal(err, variant)
            continue
        try:
            if forward is None:
                forward = FlashjitForward(ctx["engine"], case, inputs, scale)
        except fj.FlashjitError as e:
            result["impls"][name] = impl_cell("n/a" if e.unsupported else "error",
                                              variant=variant, status_name=e.status_name,
                                              reason=f"the forward (its out and LSE): "
                                                     f"{e.message}")
            continue
        try:
            runner = FlashjitBackwardRunner(ctx["engine"], case, inputs, forward, config, scale)
            runner.poison()
            gpu.sync()
            t0 = time.perf_counter()
            runner()
            gpu.sync()
        except (fj.FlashjitError, fj.FlashjitLoadError, ValueError) as e:
            result["impls"][name] = _refusal(e, variant)
            continue
        result["impls"][name] = impl_cell(
            "ok", variant=variant, first_call_ms=(time.perf_counter() - t0) * 1e3,
            workspace_bytes=runner.options.workspace_bytes)
        runners[name] = runner
    return runners


def _refusal(err, variant=None):
    if isinstance(err, ValueError):  # the binding's check of the family name
        return impl_cell("n/a", variant=variant, reason=str(err), status_name="bad family")
    return _refused(err, variant, missing="no backward API")


def start_peers(result, case, inputs, scale, fa4_off):
    """SDPA cuDNN, SDPA flash and FA4: forward, then the trial backward (a refusal of either:
    n/a with the reason). Returns {name: runner} of those that ran."""
    runners = {}
    for backend in ("cudnn", "flash"):
        r = SdpaBackwardRunner(backend, case, inputs, scale)
        if r.error:
            result["impls"][backend] = impl_cell("n/a", reason=r.error)
            continue
        result["impls"][backend] = impl_cell("ok", gqa=r.forward.gqa_mode, mask=r.forward.mask,
                                             layout=r.forward.layout, notes=list(r.notes))
        runners[backend] = r
    if fa4_off:
        result["impls"]["fa4"] = impl_cell("off", reason=fa4_off)
        return runners
    r = Fa4BackwardRunner(case, inputs, scale)
    if r.error:
        result["impls"]["fa4"] = impl_cell("n/a", reason=r.error)
    else:
        result["impls"]["fa4"] = impl_cell("ok", how=r.how, layout=r.forward.layout)
        runners["fa4"] = r
    return runners


def check_gradients(result, case, inputs, scale, flashjit, peers, args):
    """Every implementation's dq, dk, dv against the float32 reference (backward_checks), into
    its cell's check; only flashjit's failures count (a peer's: outside our bounds, noted)."""
    if args.no_check:
        result["check"] = {"checked": "not checked (--no-check)"}
    elif flashjit or peers:
        gradients = {name: r.gradients() for name, r in flashjit.items()}
        gradients.update({name: r.gradients(case) for name, r in peers.items()})
        t0 = time.perf_counter()
        q, k, v = inputs.detached()
        errors, checked = gradient_check(case, q, k, v, inputs.dout, scale, gradients,
                                         args.check_budget)
        result["check"] = {"checked": checked, "seconds": time.perf_counter() - t0}
        for name, err in errors.items():  # a peer's: what bf16/fp16 costs a trusted kernel
            result["impls"][name]["check"] = err
    else:
        result["check"] = {"checked": "nothing"}
    for r in peers.values():
        r.drop_trial()  # checked; free them before timing


def time_backward(result, case, runners, ctx):
    """The KV cases' interleaved bursts, as the varlen grid calls them: a burst holds the calls
    that fill --burst-ms (at least one; --min-calls where that many fit); TFLOPS at 2.5x the
    forward's FLOPs."""
    args = ctx["args"]

    def metrics(name, median_us):
        return {"median_ms": median_us / 1e3, "tflops": case.flops() / (median_us * 1e-6) / 1e12}

    def fewest_calls(name, wall_s):
        return max(1, min(args.min_calls, int(args.burst_ms / max(wall_s * 1e3, 1e-6))))
    time_bursts(result, runners, ctx, metrics, fewest_calls, label)


def add_ratios(result):
    """Peer time / flashjit time per configuration (> 1: flashjit faster): ratio_cudnn,
    ratio_flash (x FA2), ratio_fa4, and ratio_best_peer against the faster of cuDNN and FA4
    (result's best_peer names it)."""
    cells = result["impls"]
    times = {p: cells[p]["median_us"] for p in PEERS if cells.get(p, {}).get("median_us")}
    best_times = {p: t for p, t in times.items() if p in BEST_PEERS}
    best = min(best_times, key=best_times.get) if best_times else None
    result["best_peer"] = best
    for name, cell in cells.items():
        if not is_ours(name) or not cell.get("median_us"):
            continue
        for p, t in times.items():
            cell[f"ratio_{p}"] = t / cell["median_us"]
        if best:
            cell["ratio_best_peer"] = best_times[best] / cell["median_us"]
