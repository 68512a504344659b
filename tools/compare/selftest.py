"""Self-test of the report path with synthetic numbers (no GPU, no torch, no library):
--selftest-report DIR feeds them through the table, the summary, results.json and the plots.
FA4's dense bookkeeping (selftest_dense: skip rows, ratios, geomeans, best-peer counts, the
column off) is checked on made-up timings every time, and with dense cases a CPU rehearsal of
run_case with a torch engine and FA4 stand-in runs too. KV cases (selftest_kv) add their
report, the binding's struct layouts and a CPU rehearsal; varlen cases (selftest_varlen) their
report and a CPU rehearsal of their own; backward cases (selftest_backward) their report and the
backward bookkeeping."""

import math
import random

from pathlib import Path

from .backward_cases import is_backward_case
from .backward_report import (backward_case_rows, backward_summarize, backward_summary_lines,
                              backward_table_header, write_backward_csv)
from .decode_cases import is_kv_case
from .decode_report import kv_case_rows, kv_summarize, kv_summary_line
from .report import SCHEMA, Output, case_rows, summarize, summary_lines, table_header, write_json
from .plots import plot_results
from .run_case import add_ratios, case_entry, impl_cell
from .selftest_backward import check_backward_bookkeeping, synthetic_backward_results
from .selftest_dense import check_ab_kernels_reads_dense, check_fa4_bookkeeping, dense_rehearsal
from .selftest_kv import check_binding_layout, cpu_rehearsal, synthetic_kv_results
from .selftest_varlen import synthetic_varlen_results, varlen_rehearsal
from .varlen_cases import is_varlen_case
from .varlen_report import varlen_case_rows, varlen_summarize, varlen_summary_line

# A made-up library: its kernel families fastest first, as flashjit_family_name lists them,
# each with its synthetic speed as a fraction of cuDNN's.
SPEEDS = {"wgmma": 0.95, "mma": 0.55, "simt": 0.02}
LADDER = tuple(reversed(SPEEDS))  # slowest first, as a real run derives it from the library
FASTEST = LADDER[-1]


def synthetic_results(cases, families, seed=0):
    rng = random.Random(seed)
    results = []
    for index, case in enumerate(cases):
        r = case_entry(index, case, flops_exact=case.flops_exact(), flashjit={}, sdpa={},
                       fa4=None, notes=[], auto_family=FASTEST,
                       check={"checked": "all heads, all rows" if case.seqlen_q < 16384 else
                              "8 of 16 (batch, head) pairs, all rows"})
        for b, base in {"cudnn": 480.0, "flash": 380.0}.items():
            r["sdpa"][b] = synthetic_sdpa_cell(case, b, base, rng)
        r["fa4"] = synthetic_fa4_cell(case, rng)
        for family in families:
            r["flashjit"][family] = synthetic_flashjit_cell(r, index, case, family, families,
                                                            rng)
        add_ratios(r)
        results.append(r)
    return results


def synthetic_fa4_cell(case, rng):
    """FA4 refuses the non-causal d=256 cases (skip rows), else runs ~10 % faster than cuDNN."""
    if case.head_dim == 256 and not case.causal:
        return impl_cell("n/a", reason="refused: AssertionError: synthetic: FA4 refuses "
                                       "non-causal d=256 here")
    tf = 530.0 * (0.5 + 0.5 * math.log2(case.seqlen_q) / 14) * rng.uniform(0.95, 1.05)
    return impl_cell("ok", how="flash_attn_func, pack_gqa auto, same memory", layout="same",
                     notes=[], median_ms=case.flops() / (tf * 1e12) * 1e3, tflops=tf, reps=20,
                     reference_error={"rel_err": 3e-3, "max_abs_err": 8e-3, "max_abs_ref": 2.0,
                                      "nonfinite": 0, "within_bounds": True})


def synthetic_sdpa_cell(case, backend, base, rng):
    if backend == "flash" and case.head_dim == 256 and case.causal:
        return impl_cell("n/a", reason="synthetic: flash refuses d=256 here")
    tf = base * (0.5 + 0.5 * math.log2(case.seqlen_q) / 14) * rng.uniform(0.95, 1.05)
    ms = case.flops() / (tf * 1e12) * 1e3
    return impl_cell("ok", median_ms=ms, tflops=tf, reps=20, gqa=None,
                     mask="is_causal" if case.causal else None,
                     mask_alignment="bottom-right" if case.causal else None,
                     notes=[], reference_error={"rel_err": 3e-3, "max_abs_err": 8e-3,
                                                "max_abs_ref": 2.0, "within_bounds": True})


def synthetic_flashjit_cell(r, index, case, family, families, rng):
    """The fastest family refuses every other d=256 case; case 3 fails the last family's check."""
    if family == FASTEST and case.head_dim == 256 and index % 2:
        return impl_cell("n/a", variant=None, status_name="FLASHJIT_UNSUPPORTED",
                         reason=f"no kernel family can run this problem on sm_90a: {FASTEST} "
                                "needs ...")
    fam = FASTEST if family == "auto" else family
    tf = r["sdpa"]["cudnn"]["tflops"] * SPEEDS[fam] * rng.uniform(0.9, 1.1)
    ms = case.flops() / (tf * 1e12) * 1e3
    rel = rng.uniform(2e-3, 4e-3)
    failing = index == 3 and family == families[-1]
    chk = {"rel_err": rel * (10 if failing else 1), "max_abs_err": 1e-2,
           "max_abs_ref": 2.5, "rel_bound": 1.2e-2, "abs_bound": 6.25e-2,
           "nonfinite": 0, "elements": 1, "lse_max_abs_err": 2e-6, "lse_bound": 1e-3,
           "lse_mismatch": 0}
    chk["pass"] = not failing
    return impl_cell("ok", variant=f"{fam}.sm90a.{case.dtype}.d{case.head_dim}.m128n64s2"
                     + (".causal" if case.causal else ""), first_call_ms=850.0,
                     median_ms=ms, tflops=tf, reps=20, check=chk)


def selftest_report(out_dir, args):
    """Feeds synthetic numbers through the table, summary, results.json and plot code; checks
    the binding's struct layouts, FA4's dense bookkeeping and ab_kernels' reading of dense
    cells; with dense, KV or varlen cases, (torch on the CPU) a rehearsal of their run, and the
    KV and varlen cases' report. Returns 1 when the layouts, the bookkeeping or a rehearsal are
    wrong."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = Output()
    kv_cases = [c for c in args.cases if is_kv_case(c)]
    varlen_cases = [c for c in args.cases if is_varlen_case(c)]
    backward_cases = [c for c in args.cases if is_backward_case(c)]
    results = synthetic_results([c for c in args.cases if not is_kv_case(c)
                                 and not is_varlen_case(c) and not is_backward_case(c)],
                                args.families)
    for line in table_header() if results else []:
        out(line)
    for r in results:
        for line in case_rows(r):
            out(line)
    kv_results = synthetic_kv_results(kv_cases)
    for r in kv_results:
        out()
        for line in kv_case_rows(r):
            out(line)
    varlen_results = synthetic_varlen_results(varlen_cases, args.families)
    for r in varlen_results:
        out()
        for line in varlen_case_rows(r):
            out(line)
    backward_results = synthetic_backward_results(backward_cases, args.backward_configs)
    for line in ([""] + backward_table_header()) if backward_results else []:
        out(line)
    for r in backward_results:
        for line in backward_case_rows(r):
            out(line)
    summary = summarize(results, args.families)
    verdicts = [check_binding_layout(Path(__file__).resolve().parents[2] / "include"),
                check_fa4_bookkeeping(), check_ab_kernels_reads_dense()]
    if results:
        ok, rehearsed, message = dense_rehearsal(args, out)
        verdicts.append((ok, message))
        summary["dense_rehearsal"] = summarize(rehearsed, ["auto"]) if rehearsed else None
    if kv_cases:
        summary["kv"] = kv_summarize(kv_results)
        out(kv_summary_line(summary["kv"]))
        args.rehearsal_out = out
        ok, rehearsed, message = cpu_rehearsal(args)
        verdicts.append((ok, message))
        summary["kv_rehearsal"] = kv_summarize(rehearsed) if rehearsed else None
    if varlen_cases:
        summary["varlen"] = varlen_summarize(varlen_results)
        out(varlen_summary_line(summary["varlen"]))
        ok, rehearsed, message = varlen_rehearsal(args, out)
        verdicts.append((ok, message))
        summary["varlen_rehearsal"] = varlen_summarize(rehearsed) if rehearsed else None
    if backward_cases:
        summary["backward"] = backward_summarize(backward_results)
        for line in backward_summary_lines(summary["backward"]):
            out(line)
        write_backward_csv(out_dir / "backward.csv", backward_results)
        verdicts.append(check_backward_bookkeeping(out_dir))
    document = {"schema": SCHEMA, "environment": {"synthetic": True}, "settings": {},
                "compile": {"seconds": 3.2}, "cases": results, "kv_cases": kv_results,
                "varlen_cases": varlen_results, "backward_cases": backward_results,
                "summary": summary}
    write_json(out_dir / "results.json", document)
    written = plot_results(results, args.families, LADDER, out_dir,
                           "synthetic numbers (self-test)")
    out(f"wrote {out_dir / 'results.json'}" + "".join(f", {w}" for w in written))
    for line in summary_lines(summary, args.families, {"seconds": 3.2}, 1.0) if results else []:
        out(line)
    for _, message in verdicts:
        out(message)
    (out_dir / "table.txt").write_text("\n".join(out.lines) + "\n")
    return 1 if any(ok is False for ok, _ in verdicts) else 0
