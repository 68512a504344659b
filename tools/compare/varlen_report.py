"""The report of the varlen cases: a small table per case (ms per call, TFLOPS, flashjit vs
FA4, varlen vs dense on the same work), the varlen summary and its line."""

from .case_table import (INDENT, case_lines, check_failure_note, count_outputs, skipped_lines,
                         table_row)
from .report import check_word, fmt_num, geomean, short
from .run_varlen import headline_impl, is_dense, is_ours, label

COLUMNS = [  # (title, width, align)
    ("impl", 24, "<"), ("check", 5, "<"), ("rel_err", 8, ">"), ("max_err", 8, ">"),
    ("lse_err", 8, ">"), ("ms/call", 9, ">"), ("TFLOPS", 6, ">"), ("x FA4", 6, ">"),
    ("vs dense", 8, ">"), ("calls", 5, ">"), ("variant / how", 0, "<"),
]


def _row(values):
    return table_row(COLUMNS, values)


def varlen_case_rows(r):
    """The lines of one varlen case: a title, its lengths, its table, the verdict, its notes."""
    title = (f"{r['index']:>3}  {r['label']}    {r['total_tokens']:,} tokens (max "
             f"{r['max_seqlen']:,}), {r['flops'] / 1e12:.2f} TFLOP; dense twin b{r['batch']} x "
             f"{r['dense_seqlen']:,}, {r['dense_flops'] / 1e12:.2f} TFLOP")
    lengths = INDENT + "lengths: " + " ".join(str(n) for n in r["seqlens"])
    if r.get("skipped"):
        return skipped_lines(title, r)
    return case_lines([title, lengths], COLUMNS,
                      [_impl_row(n, c) for n, c in r["impls"].items()], _verdict(r), _notes(r))


def _impl_row(name, cell):
    chk = cell.get("check") or {}
    ok = cell["status"] == "ok"
    timed = ok and cell.get("median_us") is not None
    what = (cell.get("variant") or "") if is_ours(name) else cell.get("how", "")
    if ok and is_ours(name) and not is_dense(name) and not cell.get("variant"):
        what = f"({cell.get('variant_source', 'not named')})"
    if not ok:
        what = (what + "  " if what else "") + short(cell.get("reason", ""), 90)
    return _row([
        label(name), check_word(cell), fmt_num(chk.get("rel_err"), ".1e"),
        fmt_num(chk.get("max_abs_err"), ".1e"), fmt_num(chk.get("lse_max_abs_err"), ".1e"),
        fmt_num(cell["median_us"] / 1e3, ".3f") if timed else ("-" if ok else "n/a"),
        fmt_num(cell.get("tflops"), ".1f") if timed else "-",
        fmt_num(cell.get("ratio_peer"), ".2f") if timed else "-",
        f"{cell['rate_vs_dense'] * 100:.0f}%" if cell.get("rate_vs_dense") else "-",
        str(cell.get("calls_per_rep", "-")) if timed else "-", what])


def _rate(r, name):
    cell = r["impls"].get(name or "", {})
    if not cell.get("rate_vs_dense"):
        return None
    return (f"{label(name)} at {cell['rate_vs_dense'] * 100:.0f} % of {label(cell['dense_impl'])}"
            f"'s TFLOPS on the same work (varlen costs {cell['varlen_cost_pct']:+.0f} %)")


def _verdict(r):
    """'flashjit varlen at 5 % of flashjit dense's TFLOPS ... (varlen costs +1900 %); FA4 ...;
    flashjit x 0.05 vs FA4 varlen, dense x 0.90 vs FA4 dense (> 1: flashjit faster)'."""
    main = headline_impl(r)
    parts = [p for p in (_rate(r, main), _rate(r, "fa4")) if p]
    versus = []
    for name in (main, "flashjit_dense"):
        cell = r["impls"].get(name or "", {})
        if cell.get("ratio_peer"):
            versus.append(f"{label(name)} x {cell['ratio_peer']:.2f} vs {label(cell['peer'])}")
    if versus:
        parts.append(", ".join(versus) + " (> 1: flashjit faster)")
    return "; ".join(parts)


def _notes(r):
    notes = list(r.get("notes", []))
    check = r.get("check", {})
    for key, what in (("checked", "varlen"), ("dense_checked", "dense twin")):
        if check.get(key) and check[key] != "all heads, all rows":
            notes.append(f"checked ({what}): {check[key]}")
    for name, cell in r["impls"].items():
        chk = cell.get("check")
        if chk and not chk["pass"]:
            notes.append(check_failure_note(label(name), chk, is_ours(name)))
    if r.get("error"):
        notes.append(f"case error: {r['error']}")
    return notes


def varlen_summarize(results):
    """Geomeans over cases of flashjit vs FA4 (varlen; dense) and of each implementation's
    varlen-vs-dense rate; the failures: every flashjit output's, and crashed cases."""
    lists = {k: [] for k in ("fa4", "fa4_dense", "rate_flashjit", "rate_fa4")}
    for r in results:
        cells = r["impls"]
        main = cells.get(headline_impl(r) or "", {})
        for key, value in (("fa4", main.get("ratio_peer")),
                           ("fa4_dense", cells.get("flashjit_dense", {}).get("ratio_peer")),
                           ("rate_flashjit", main.get("rate_vs_dense")),
                           ("rate_fa4", cells.get("fa4", {}).get("rate_vs_dense"))):
            if value:
                lists[key].append(value)
    return {"geomean_ratio_fa4": geomean(lists["fa4"]), "cases_fa4": len(lists["fa4"]),
            "geomean_ratio_fa4_dense": geomean(lists["fa4_dense"]),
            "cases_fa4_dense": len(lists["fa4_dense"]),
            "geomean_rate_vs_dense": {"flashjit": geomean(lists["rate_flashjit"]),
                                      "fa4": geomean(lists["rate_fa4"])},
            "cases_rate_vs_dense": {"flashjit": len(lists["rate_flashjit"]),
                                    "fa4": len(lists["rate_fa4"])},
            **count_outputs(results, is_ours)}


def _pct(x):
    return "-" if x is None else f"{x * 100:.0f} % (costs {(1 / x - 1) * 100:+.0f} %)"


def varlen_summary_line(s):
    rates = s["geomean_rate_vs_dense"]
    extra = [f"varlen / dense TFLOPS on the same work: flashjit {_pct(rates['flashjit'])}, "
             f"FA4 {_pct(rates['fa4'])}",
             f"failed checks {s['failed_checks']} (of {s['checked'] + s['errors']} flashjit "
             "outputs)",
             f"peer outputs outside bounds {s['peer_outputs_outside_bounds']}",
             f"{s['cases_skipped']} cases skipped (deadline)" if s["cases_skipped"] else None,
             f"{s['case_errors']} cases crashed" if s["case_errors"] else None]
    return (f"VARLEN SUMMARY flashjit varlen vs FA4 varlen: x "
            f"{fmt_num(s['geomean_ratio_fa4'], '.3f')} geomean ({s['cases_fa4']} of "
            f"{s['cases_total']} cases); flashjit dense vs FA4 dense x "
            f"{fmt_num(s['geomean_ratio_fa4_dense'], '.3f')} ({s['cases_fa4_dense']}); "
            + "; ".join(e for e in extra if e))
