"""The report of the KV cases: a small table per case (µs per call, TB/s, share of the HBM
floor, ratio to the best peer), the KV summary and its line."""

from .case_table import case_lines, check_failure_note, count_outputs, skipped_lines, table_row
from .report import check_word, fmt_num, geomean, short
from .run_decode import PEERS, headline_impl, label

COLUMNS = [  # (title, width, align)
    ("impl", 20, "<"), ("check", 5, "<"), ("rel_err", 8, ">"), ("max_err", 8, ">"),
    ("lse_err", 8, ">"), ("us/call", 9, ">"), ("TB/s", 5, ">"), ("floor", 5, ">"),
    ("TFLOPS", 6, ">"), ("x best", 6, ">"), ("calls", 5, ">"), ("variant / how", 0, "<"),
]


def _row(values):
    return table_row(COLUMNS, values)


def kv_case_rows(r):
    """The lines of one KV case: a title, its table, the ratio line, its notes."""
    title = f"{r['index']:>3}  {r['label']}    K+V {r['kv_bytes'] / 1e6:.1f} MB"
    if r.get("hbm_floor_us"):
        title += f"; HBM floor {r['hbm_floor_us']:.1f} us at {r['hbm_tbs']:g} TB/s"
    if r.get("skipped"):
        return skipped_lines(title, r)
    return case_lines([title], COLUMNS, [_impl_row(n, c) for n, c in r["impls"].items()],
                      _verdict(r), _notes(r))


def _impl_row(name, cell):
    chk = cell.get("check") or {}
    ok = cell["status"] == "ok"
    timed = ok and cell.get("median_us") is not None
    if name.startswith("flashjit"):
        what = cell.get("variant") or ""
        if ok and cell.get("num_splits"):
            what += f" ({cell['num_splits']} split{'s' if cell['num_splits'] > 1 else ''})"
    else:
        what = cell.get("how", "")
    if not ok:
        what = (what + "  " if what else "") + short(cell.get("reason", ""), 90)
    return _row([
        label(name), check_word(cell), fmt_num(chk.get("rel_err"), ".1e"),
        fmt_num(chk.get("max_abs_err"), ".1e"), fmt_num(chk.get("lse_max_abs_err"), ".1e"),
        fmt_num(cell.get("median_us"), ".1f") if timed else ("-" if ok else "n/a"),
        fmt_num(cell.get("tbs"), ".2f") if timed else "-",
        f"{cell['hbm_fraction'] * 100:.0f}%" if timed else "-",
        fmt_num(cell.get("tflops"), ".1f") if timed else "-",
        fmt_num(cell.get("ratio_best_peer"), ".2f") if timed else "-",
        str(cell.get("calls_per_rep", "-")) if timed else "-", what])


def _verdict(r):
    """'flashjit x 1.10 vs best peer FA4 (x SDPA cuDNN 1.31, ...); paged/dense 1.03 ...'."""
    main = r["impls"].get(headline_impl(r) or "", {})
    parts = []
    if main.get("ratio_best_peer"):
        each = ", ".join(f"{label(p)} {x:.2f}" for p, x in main["ratio_peers"].items())
        parts.append(f"flashjit x {main['ratio_best_peer']:.2f} vs best peer "
                     f"{label(r['best_peer'])} ({each}; > 1: flashjit faster)")
    if r.get("paged_over_dense") is not None:
        parts.append(f"paged / dense time {r['paged_over_dense']:.3f}: "
                     + ("within 5 %" if r["paged_within_5pct"] else "NOT within 5 %"))
    return "; ".join(parts)


def _notes(r):
    notes = list(r.get("notes", []))
    checked = r.get("check", {}).get("checked")
    if checked and checked != "all heads, all rows":
        notes.append(f"checked: {checked}")
    for name, cell in r["impls"].items():
        for note in cell.get("notes", []):
            notes.append(f"{label(name)}: {note}")
        chk = cell.get("check")
        if chk and not chk["pass"]:
            notes.append(check_failure_note(label(name), chk, name.startswith("flashjit")))
    if r.get("error"):
        notes.append(f"case error: {r['error']}")
    return notes


def kv_summarize(results):
    """Geomeans of flashjit's ratios (headline implementation of each case), the paged-vs-dense
    verdicts, and the failures: every flashjit implementation's, and crashed cases."""
    best, each = [], {p: [] for p in PEERS}
    for r in results:
        cell = r["impls"].get(headline_impl(r) or "", {})
        if cell.get("ratio_best_peer"):
            best.append(cell["ratio_best_peer"])
        for p, x in cell.get("ratio_peers", {}).items():
            each[p].append(x)
    paged = [r["paged_within_5pct"] for r in results if "paged_within_5pct" in r]
    return {"geomean_ratio_best_peer": geomean(best), "cases_best_peer": len(best),
            "geomean_ratio": {p: geomean(v) for p, v in each.items()},
            "cases": {p: len(v) for p, v in each.items()},
            "paged_within_5pct": sum(paged), "paged_compared": len(paged),
            **count_outputs(results, lambda name: name.startswith("flashjit"))}


def kv_summary_line(s):
    peers = ", ".join(f"{label(p)} x {fmt_num(s['geomean_ratio'][p], '.3f')} ({s['cases'][p]})"
                      for p in PEERS if s["cases"][p])
    extra = [f"paged within 5 % of dense {s['paged_within_5pct']} of {s['paged_compared']}"
             if s["paged_compared"] else None,
             f"failed checks {s['failed_checks']} (of {s['checked'] + s['errors']} flashjit "
             "outputs)",
             f"peer outputs outside bounds {s['peer_outputs_outside_bounds']}",
             f"{s['cases_skipped']} cases skipped (deadline)" if s["cases_skipped"] else None,
             f"{s['case_errors']} cases crashed" if s["case_errors"] else None]
    return (f"KV SUMMARY flashjit vs best peer: x {fmt_num(s['geomean_ratio_best_peer'], '.3f')} "
            f"geomean ({s['cases_best_peer']} of {s['cases_total']} cases)"
            + (f"; {peers}" if peers else "") + "; " + "; ".join(e for e in extra if e))
