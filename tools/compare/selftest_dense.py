"""No-GPU tests of FA4 on the dense grids, run by --selftest-report: its bookkeeping on made-up
timings (ratios, the best peer, skip rows, geomeans and their case counts, the count of cases
where flashjit >= 1.0x the best peer, the column off with its reason said once), always; and,
where torch is installed, a CPU rehearsal of run_case with selftest_varlen's torch engine and
FA4 stand-in (BSHD and BHSD memory, GQA, fp16, a refused head dim, the copy fallback)."""

import functools
import importlib.util
import json
import tempfile
import time
import types
from pathlib import Path

from .cases import Case
from .fa4 import FA4_HELP
from .report import COLUMNS, Output, case_rows, summarize, summary_lines, table_header
from .run_case import add_ratios, case_entry, impl_cell
from .selftest_support import close, column, geomean

# (our ms, cuDNN ms, cuDNN top-left?, FA4 ms or None: skipped) per made-up case
TIMINGS = [(1.0, 1.2, False, 0.9), (1.0, 0.8, False, None), (2.0, 1.5, True, 2.5),
           (1.0, 1.1, False, 1.05), (2.0, 2.2, False, 2.0)]


def bookkeeping_results(fa4_on=True):
    """The TIMINGS cases as run_case would leave them (FA4 'off' throughout when not fa4_on)."""
    results = []
    for i, (ours, cudnn, top_left, fa4) in enumerate(TIMINGS):
        case = Case(2, 8, 8, 512 if top_left else 1024, 1024, 128, top_left, "bf16", "bshd",
                    "bookkeeping")
        r = case_entry(i, case, flops_exact=case.flops_exact(), flashjit={}, sdpa={}, fa4=None,
                       notes=[], auto_family="wgmma", check={"checked": "all heads, all rows"})
        r["sdpa"]["cudnn"] = impl_cell("ok", median_ms=cudnn, tflops=1.0,
                                       mask_alignment="top-left" if top_left else None)
        r["sdpa"]["flash"] = impl_cell("n/a", reason="synthetic")
        if not fa4_on:
            r["fa4"] = impl_cell("off")
        elif fa4 is None:
            r["fa4"] = impl_cell("n/a", reason="refused: AssertionError: synthetic refusal")
        else:
            r["fa4"] = impl_cell("ok", median_ms=fa4, tflops=1.0, how="synthetic",
                                 reference_error={"rel_err": 3e-3, "max_abs_err": 8e-3,
                                                  "max_abs_ref": 2.0, "nonfinite": 0,
                                                  "within_bounds": i != 3})
        r["flashjit"]["auto"] = impl_cell("ok", variant="wgmma.synthetic", median_ms=ours,
                                          tflops=1.0, check={"pass": True})
        add_ratios(r)
        results.append(r)
    return results


def check_ab_kernels_reads_dense():
    """(ok, message): tools/ab_kernels.py's reading of a results.json finds the dense cases'
    ratios (x cuDNN per flashjit row; it once read only the KV cases' layout and summarized
    nothing for dense A/Bs)."""
    path = Path(__file__).resolve().parents[1] / "ab_kernels.py"
    spec = importlib.util.spec_from_file_location("ab_kernels", path)
    ab_kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab_kernels)
    results = bookkeeping_results()
    for i, r in enumerate(results):  # distinct cells (the made-up cases share shapes)
        r["label"] = f"{r['label']} #{i}"
    want = {f"{r['label']} [flashjit]": cudnn / ours
            for r, (ours, cudnn, _, _) in zip(results, TIMINGS)}
    with tempfile.TemporaryDirectory() as tmp:
        results_path = Path(tmp) / "results.json"
        results_path.write_text(json.dumps({"cases": results}))
        ratios, failed = ab_kernels.flashjit_ratios(results_path)
    problems = [f"{cell}: {ratios.get(cell)} != {value}" for cell, value in want.items()
                if not close(ratios.get(cell), value)]
    if failed or set(ratios) != set(want):
        problems.append(f"cells {sorted(ratios)} (failed {failed}), expected {sorted(want)}")
    return (not problems, "ab_kernels' dense cells: bookkeeping " +
            ("ok" if not problems else "FAILED " + "; ".join(problems)))


def check_fa4_bookkeeping():
    """(ok, message): the ratios, geomeans and counts of bookkeeping_results against numbers
    worked out here from TIMINGS, and what the table and summary say, FA4 on and off."""
    problems = []
    results = bookkeeping_results()
    for r, (ours, cudnn, top_left, fa4) in zip(results, TIMINGS):
        cell, i = r["flashjit"]["auto"], r["index"]
        peers = {"cudnn": cudnn} if not top_left else {}
        if fa4 is not None:
            peers["fa4"] = fa4
        best = min(peers, key=peers.get)
        want = {"ratio_fa4": fa4 / ours if fa4 else None, "ratio_best_peer": peers[best] / ours,
                "ratio_cudnn": cudnn / ours}
        for key, value in want.items():
            if not close(cell.get(key), value):
                problems.append(f"case {i}: {key} {cell.get(key)} != {value}")
        if r["best_peer"] != best:
            problems.append(f"case {i}: best peer {r['best_peer']} != {best}")
    s = summarize(results, ["auto"])
    h = s["headline"]
    fa4_ratios = [f / o for o, _, _, f in TIMINGS if f]
    best_ratios = [min(([] if t else [c]) + ([f] if f else [])) / o for o, c, t, f in TIMINGS]
    want = {"geomean_ratio_fa4": geomean(fa4_ratios), "cases_fa4": len(fa4_ratios),
            "geomean_ratio_best_peer": geomean(best_ratios), "cases_best_peer": len(best_ratios),
            "cases_at_least_best_peer": sum(1 for x in best_ratios if x >= 1.0),
            "geomean_ratio_cudnn": geomean([c / o for o, c, t, _ in TIMINGS if not t]),
            "cases_cudnn": sum(1 for t in TIMINGS if not t[2])}
    for key, value in want.items():
        if not close(h.get(key), value):
            problems.append(f"summary {key} {h.get(key)} != {value}")
    if (s["fa4"]["status"], s["fa4"]["ran"], s["fa4"]["skipped"], s["fa4"]["outside_bounds"]) \
            != ("on", len(fa4_ratios), len(TIMINGS) - len(fa4_ratios), 1):
        problems.append(f"summary fa4 {s['fa4']}")
    lines, n = _report_lines(results, s), len(TIMINGS)
    shown = [tuple(column(ln, t, COLUMNS) for t in ("FA4", "x FA4", "x best")) for ln in lines
             if ln[:3].strip().isdigit()]
    want_shown = [("1.0", f"{f / o:.2f}" if f else "-", f"{b:.2f}")
                  for (o, _, _, f), b in zip(TIMINGS, best_ratios)]
    want_shown[1] = ("skip",) + want_shown[1][1:]
    if shown != want_shown:
        problems.append(f"table FA4, x FA4, x best: {shown}, wanted {want_shown}")
    for needed in ("note: FA4 skipped: refused: AssertionError: synthetic refusal",
                   "FA4 itself is outside our bounds",
                   f"x FA4 {geomean(fa4_ratios):.3f} ({len(fa4_ratios)} of {n} cases)",
                   f"x best peer (faster of cuDNN and FA4) {geomean(best_ratios):.3f} ({n} of "
                   f"{n} cases), flashjit >= 1.0x the best peer in "
                   f"{want['cases_at_least_best_peer']} of {n}", "FA4 skipped 1"):
        if not any(needed in ln for ln in lines):
            problems.append(f"report lacks {needed!r}")

    off_reason = f"not importable (ModuleNotFoundError: synthetic); {FA4_HELP}"
    off = bookkeeping_results(fa4_on=False)
    s_off = summarize(off, ["auto"], off_reason)
    from .cli import print_fa4_line  # cli imports selftest, which imports this: not at load
    out = _QuietOutput()
    print_fa4_line(out, {}, types.SimpleNamespace(cases=[Case(1, 1, 1, 1, 1, 64, False)]),
                   off_reason)
    lines = out.lines + _report_lines(off, s_off)
    if sum(ln.count(FA4_HELP) for ln in lines) != 1:
        problems.append("FA4 off: its reason is not said exactly once")
    if any(r["flashjit"]["auto"].get("ratio_fa4") for r in off) or \
            s_off["headline"]["cases_fa4"] != 0 or s_off["fa4"]["status"] != "off":
        problems.append("FA4 off: ratios or counts were made")
    if any(column(ln, "FA4", COLUMNS) != "off" for ln in lines if ln[:3].strip().isdigit()):
        problems.append("FA4 off: a row's FA4 column does not say off")
    if not any("x FA4 off (not importable)" in ln and "cuDNN only: FA4 off" in ln
               for ln in lines):
        problems.append("FA4 off: the summary line does not say so")
    if problems:
        return False, "FA4 bookkeeping FAILED: " + "; ".join(problems)
    return True, ("FA4 bookkeeping: ratios, best peer (top-left cuDNN left out), skip rows, "
                  "geomeans and counts, >= 1.0x count, column off with one reason: ok")


class _QuietOutput(Output):
    def __call__(self, line=""):
        self.lines.append(line)


def _report_lines(results, summary):
    lines = table_header()
    for r in results:
        lines += case_rows(r)
    return lines + summary_lines(summary, ["auto"], None, 1.0)



# --- CPU rehearsal of run_case with FA4 ----------------------------------------------------

def rehearsal_cases():
    """GQA causal bf16 BSHD; BHSD fp16 with s_q < s_k; a head dim the stand-in refuses."""
    return [Case(2, 4, 2, 64, 64, 32, True, "bf16", "bshd", "rehearsal"),
            Case(2, 4, 4, 48, 80, 32, False, "fp16", "bhsd", "rehearsal"),
            Case(1, 2, 2, 32, 32, 160, False, "bf16", "bshd", "rehearsal")]


def fake_dense_fa4(calls, strict=False):
    """selftest_varlen's FA4 stand-in with flash_attn_func wrapped: it records what it gets
    (calls: [(q contiguous?, k heads, dtype)]), refuses head dims over 128 as FA4 refuses what it
    lacks (an AssertionError), and, strict, refuses tensors that are not contiguous."""
    from .selftest_varlen import fake_fa4
    mod = fake_fa4()
    inner = mod.flash_attn_func

    @functools.wraps(inner)  # the same signature: Fa4Runner checks it
    def flash_attn_func(q, k, v, *args, **kwargs):
        if q.shape[-1] > 128:
            raise AssertionError("synthetic: head_dim must be <= 128")
        if strict and not all(t.is_contiguous() for t in (q, k, v)):
            raise ValueError("synthetic: expected contiguous tensors")
        calls.append((q.is_contiguous(), k.shape[2], q.dtype))
        return inner(q, k, v, *args, **kwargs)
    mod.flash_attn_func = flash_attn_func
    return mod


def dense_rehearsal(args, out):
    """run_cases over rehearsal_cases on the CPU with FA4 on (a stand-in); (ok, entries,
    message). ok: flashjit's outputs pass, FA4 ran the first two cases on the same memory
    (the BHSD one through its transposed views, GQA with h_kv heads), within bounds, timed,
    with ratio_fa4 and a best peer; it is a skip row on the third; a strict stand-in makes
    contiguous copies of the BHSD views; with FA4 off no FA4 runner is made."""
    if importlib.util.find_spec("torch") is None:
        return None, [], "dense FA4 CPU rehearsal: skipped (torch not installed)"
    from .backends import make_inputs, select_variant
    from .fa4 import Fa4Runner
    from .run_all import run_cases
    from .run_case import run_case
    from .selftest_kv import CpuTimer, on_cpu
    from .selftest_varlen import TorchVarlenEngine
    calls, strict_calls = [], []
    with on_cpu(fake_dense_fa4(calls)):
        engine, cases = TorchVarlenEngine(), rehearsal_cases()
        run_args = _RehearsalArgs(args, cases)
        ctx = {"args": run_args, "engine": engine, "families": ["auto"], "timer": CpuTimer(),
               "deadline": time.monotonic() + 120, "fa4_off": None,
               "variants": {c.key(): {"auto": select_variant(engine, c, "auto")}
                            for c in cases},
               "auto_family": {c.key(): "torch" for c in cases}}
        entries, _, _, _ = run_cases(ctx, out, None, {"cases": []})
        q, k, v = make_inputs(cases[1], 0)
        copied = Fa4Runner(cases[1], types.SimpleNamespace(q=q, k=k, v=v), 0.1,
                           module=fake_dense_fa4(strict_calls, strict=True))
        made = len(calls)
        off_entry = run_case(0, cases[0], dict(ctx, fa4_off="off (--no-fa4)"))
        made = len(calls) - made
    problems = _verify(entries, calls)
    if copied.error or copied.layout != "copy" or "copies" not in copied.how or \
            strict_calls[-1][0] is not True:
        problems.append(f"strict FA4 on BHSD: error {copied.error!r}, layout {copied.layout}, "
                        f"how {copied.how!r}")
    if off_entry["fa4"] != {"status": "off"} or "ratio_fa4" in off_entry["flashjit"]["auto"] \
            or made:
        problems.append(f"--no-fa4: FA4 cell {off_entry['fa4']}, {made} FA4 calls")
    if problems:
        return False, entries, "dense FA4 CPU rehearsal FAILED: " + "; ".join(problems)
    return True, entries, (f"dense FA4 CPU rehearsal: {len(entries)} cases through run_case "
                           "with a torch engine and FA4 stand-in: BSHD and BHSD views, GQA, "
                           "fp16, checked, timed, ratios; refusal a skip row; copy fallback; "
                           "--no-fa4 ok")


def _verify(entries, calls):
    problems = []
    for r in entries:
        i, fa4, cell = r["index"], r["fa4"] or {}, r["flashjit"].get("auto", {})
        if r.get("error"):
            problems.append(f"case {i} crashed: {r['error']}")
            continue
        if not (cell.get("check") or {}).get("pass") or not cell.get("median_ms"):
            problems.append(f"case {i}: flashjit {cell}")
        if i == 2:
            rows = case_rows(r)
            if fa4.get("status") != "n/a" or "ratio_fa4" in cell or \
                    not any("FA4 skipped: refused: AssertionError" in ln for ln in rows):
                problems.append(f"case 2: FA4 {fa4} not a skip row: {rows}")
            continue
        ref = fa4.get("reference_error") or {}
        if fa4.get("status") != "ok" or not ref.get("within_bounds") or \
                not fa4.get("median_ms") or fa4.get("layout") != "same":
            problems.append(f"case {i}: FA4 {fa4}")
        if not cell.get("ratio_fa4") or r.get("best_peer") not in ("fa4", "cudnn"):
            problems.append(f"case {i}: ratio_fa4 {cell.get('ratio_fa4')}, best peer "
                            f"{r.get('best_peer')}")
    want = [(True, 2, "torch.bfloat16"), (False, 4, "torch.float16")]  # GQA 4:2; BHSD views
    got = sorted({(c, h, str(d)) for c, h, d in calls}, reverse=True)
    if got != want:
        problems.append(f"FA4 got (contiguous, K/V heads, dtype) {got}, wanted {want}")
    if entries and "transpose" not in (entries[1]["fa4"] or {}).get("how", ""):
        problems.append(f"case 1: FA4 how {(entries[1]['fa4'] or {}).get('how')!r}")
    return problems


class _RehearsalArgs:
    def __init__(self, args, cases):
        self.__dict__.update(vars(args))
        self.cases = cases
        self.reps, self.min_reps, self.warmup = 3, 1, 1
        self.no_check = self.no_time = self.no_fa4 = False
