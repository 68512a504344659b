"""The run over all cases: each case in turn (attention, KV, varlen or backward), a crash kept
as its error, results.json rewritten as cases finish; then the summaries, the plots and
table.txt."""

import time
import traceback

from . import gpu
from .backward_cases import is_backward_case
from .backward_report import (backward_case_rows, backward_summarize, backward_summary_lines,
                              backward_table_header, write_backward_csv)
from .decode_cases import is_kv_case
from .decode_report import kv_case_rows, kv_summarize, kv_summary_line
from .plots import plot_results
from .report import (case_rows, fmt_num, format_row, short, summarize, summary_lines,
                     table_header, write_json)
from .run_backward import run_backward_case
from .run_case import case_entry, run_case
from .run_decode import run_kv_case
from .run_varlen import run_varlen_case
from .varlen_cases import is_varlen_case
from .varlen_report import varlen_case_rows, varlen_summarize, varlen_summary_line

# kind: (run it, its table lines, the empty cells of a skipped or crashed entry)
KINDS = {"attention": (run_case, case_rows, lambda: {"flashjit": {}, "sdpa": {}, "fa4": None}),
         "kv": (run_kv_case, kv_case_rows, lambda: {"impls": {}}),
         "varlen": (run_varlen_case, varlen_case_rows, lambda: {"impls": {}}),
         "backward": (run_backward_case, backward_case_rows, lambda: {"impls": {}})}
DOCUMENT_KEYS = {"attention": "cases", "kv": "kv_cases", "varlen": "varlen_cases",
                 "backward": "backward_cases"}
# The kinds whose cases share one table (its header above the first case's rows); the others
# print a small table per case.
TABLE_HEADERS = {"attention": table_header, "backward": backward_table_header}


def kind_of(case):
    if is_backward_case(case):
        return "backward"
    return "kv" if is_kv_case(case) else "varlen" if is_varlen_case(case) else "attention"


def run_cases(ctx, out, out_dir, document):
    """Every case in turn, its rows printed and results.json rewritten as it finishes; a case
    after the deadline, or after the CUDA context died, is listed as skipped. Returns the
    entries of the attention, KV, varlen and backward cases (results.json: cases, kv_cases,
    varlen_cases, backward_cases)."""
    args = ctx["args"]
    entries = {kind: [] for kind in KINDS}
    aborted = None
    for index, case in enumerate(args.cases):
        kind = kind_of(case)
        _, rows, empty = KINDS[kind]
        if kind in TABLE_HEADERS and not entries[kind]:
            out()
            for line in TABLE_HEADERS[kind]():  # above the first such case's rows
                out(line)
        if aborted or time.monotonic() > ctx["deadline"]:
            why = aborted or f"deadline ({args.deadline:g} s) reached"
            r = case_entry(index, case, **empty(), skipped=why, notes=[f"skipped: {why}"])
            entries[kind].append(r)
            out(format_row([str(index), case.label(), "", "skip"]) if kind == "attention"
                else rows(r)[0])
            continue
        r, aborted = run_guarded(index, case, ctx)
        entries[kind].append(r)
        if kind not in TABLE_HEADERS:
            out()
        for line in rows(r):
            out(line)
        if out_dir:
            document.update({DOCUMENT_KEYS[k]: v for k, v in entries.items()})
            write_json(out_dir / "results.json", document)
    return entries["attention"], entries["kv"], entries["varlen"], entries["backward"]


def run_guarded(index, case, ctx):
    """run_case (run_kv_case, run_varlen_case) with a crash kept as the case's error: (entry,
    None), or (entry, why no further case can run) when the CUDA context is unusable after
    it."""
    run, _, empty = KINDS[kind_of(case)]
    try:
        return run(index, case, ctx), None
    except Exception as e:  # keep the run going; a dead CUDA context stops it
        traceback.print_exc()
        r = case_entry(index, case, **empty(), notes=[],
                       error=f"{type(e).__name__}: {short(e, 300)}")
        try:
            gpu.sync()
        except Exception as e2:
            return r, f"CUDA context unusable after case {index} ({short(e2, 120)})"
        return r, None


def finish_report(ctx, results, kv_results, document, out, out_dir, start, varlen_results=(),
                  backward_results=()):
    """Summary, the final results.json, the plots, table.txt (and backward.csv); returns the
    summary."""
    families = ctx["families"]
    summary = summarize(results, families, ctx.get("fa4_off"))
    if kv_results:
        summary["kv"] = kv_summarize(kv_results)
        summary["failed_checks_total"] += summary["kv"]["failed_checks"]
    if varlen_results:
        summary["varlen"] = varlen_summarize(varlen_results)
        summary["failed_checks_total"] += summary["varlen"]["failed_checks"]
    if backward_results:
        summary["backward"] = backward_summarize(backward_results, ctx.get("fa4_off"))
        summary["failed_checks_total"] += summary["backward"]["failed_checks"]
    compile_info = document["compile"]
    first_calls = sum(c.get("first_call_ms", 0) for r in results for c in r["flashjit"].values())
    first_calls += sum(c.get("first_call_ms", 0)
                       for r in (*kv_results, *varlen_results, *backward_results)
                       for c in r["impls"].values() if c.get("first_call_ms"))
    compile_info["first_calls_ms"] = first_calls
    document["cases"], document["kv_cases"] = results, kv_results
    document["varlen_cases"] = list(varlen_results)
    document["backward_cases"] = list(backward_results)
    document["summary"] = summary
    wall = time.monotonic() - start
    document["wall_s"] = wall
    out()
    out(f"first flashjit calls (module load; NVRTC only where precompile missed): "
        f"{first_calls / 1e3:.2f} s in total")
    if out_dir:
        write_json(out_dir / "results.json", document)
        env = document["environment"]
        subtitle = (f"{env.get('gpu', '?')}, torch {env['torch']}, cuDNN {env['cudnn']}, "
                    f"flashjit {env['flashjit']}")
        written = plot_results(results, families, ctx["ladder"], out_dir, subtitle) \
            if results else []
        if backward_results:
            write_backward_csv(out_dir / "backward.csv", backward_results)
            written.append(str(out_dir / "backward.csv"))
        out(f"wrote {out_dir / 'results.json'}" + "".join(f", {w}" for w in written))
    if kv_results:
        out(kv_summary_line(summary["kv"]))
    if varlen_results:
        out(varlen_summary_line(summary["varlen"]))
    for line in backward_summary_lines(summary["backward"]) if backward_results else []:
        out(line)
    for line in summary_lines(summary, families, compile_info, wall) if results else []:
        out(line)
    if not results:
        out(f"failed checks {summary['failed_checks_total']}; compile "
            f"{fmt_num(compile_info.get('seconds'), '.1f')} s; wall {wall:.0f} s")
    if out_dir:
        (out_dir / "table.txt").write_text("\n".join(out.lines) + "\n")
    return summary
