"""The report of the backward cases: one table (a row per flashjit configuration, the peers'
TFLOPS on a case's first row, as the forward grids' table), the summary (geomeans per
configuration), its lines, and backward.csv."""

import csv

from .case_table import count_outputs
from .report import fmt_num, geomean, peer_tflops, short
from .run_backward import LABELS, PEERS, is_ours, label

COLUMNS = [  # (title, width, align)
    ("#", 3, ">"), ("case", 36, "<"), ("flashjit", 16, "<"), ("check", 5, "<"),
    ("dq_err", 7, ">"), ("dk_err", 7, ">"), ("dv_err", 7, ">"), ("ms", 7, ">"),
    ("TFLOPS", 6, ">"), ("cuDNN", 6, ">"), ("FA2", 6, ">"), ("FA4", 6, ">"),
    ("x best", 6, ">"), ("x FA2", 6, ">"), ("x cuDNN", 7, ">"), ("x FA4", 6, ">"),
    ("variant", 0, "<"),
]


def format_row(values):
    return "  ".join(f"{v:{a}{w}}" if w else str(v)
                     for (_, w, a), v in zip(COLUMNS, values)).rstrip()


def backward_table_header():
    return [format_row([t for t, _, _ in COLUMNS]),
            format_row(["-" * max(w, len(t)) if w else "-" * 7 for t, w, _ in COLUMNS])]


def configs_of(r):
    return [n for n in r["impls"] if is_ours(n)]


def backward_case_rows(r):
    """Lines of one backward case: a row per flashjit configuration (the peers' TFLOPS on the
    first), then its notes."""
    if r.get("skipped"):
        return [format_row([str(r["index"]), r["label"], "", "skip"])] + \
            [" " * 5 + "note: " + n for n in r.get("notes", [])]
    names = configs_of(r) or ["-"]
    lines = [_row(r, i, name) for i, name in enumerate(names)]
    return lines + [" " * 5 + "note: " + n for n in _notes(r)]


def _check_word(cell):
    if cell is None:
        return "-"
    if cell["status"] != "ok":
        return {"n/a": "n/a", "error": "ERROR"}.get(cell["status"], cell["status"])
    chk = cell.get("check")
    return "-" if chk is None else ("pass" if chk["pass"] else "FAIL")


def _row(r, i, name):
    cell = r["impls"].get(name)
    chk = (cell or {}).get("check") or {}
    ok = cell is not None and cell["status"] == "ok"
    timed = ok and cell.get("median_us") is not None
    variant = (cell or {}).get("variant") or ""
    if cell and not ok:
        variant = (variant + "  " if variant else "") + short(cell.get("reason", ""), 80)
    err = {x: fmt_num((chk.get(x) or {}).get("rel_max_err"), ".1e") for x in ("dq", "dk", "dv")}
    first = i == 0
    peers = r["impls"]
    return format_row([
        str(r["index"]) if first else "", r["label"] if first else "",
        name.split(".", 1)[1] if is_ours(name) else name, _check_word(cell),
        err["dq"], err["dk"], err["dv"],
        fmt_num(cell["median_us"] / 1e3, ".3f") if timed else ("-" if ok or not cell else "n/a"),
        fmt_num(cell.get("tflops"), ".1f") if timed else "-",
        *[peer_tflops(peers.get(p)) if first else "" for p in PEERS],
        *[fmt_num(cell.get(f"ratio_{k}"), ".2f") if timed else "-"
          for k in ("best_peer", "flash", "cudnn", "fa4")],
        variant])


def _notes(r):
    notes = list(r.get("notes", []))
    checked = (r.get("check") or {}).get("checked")
    if checked and checked != "all heads, all rows":
        notes.append(f"checked: {checked}")
    for p in PEERS:
        cell = r["impls"].get(p)
        if cell is None:
            continue
        if cell["status"] == "n/a":
            notes.append(f"{LABELS[p]} skipped: {short(cell.get('reason', ''), 200)}")
        for note in cell.get("notes", []):
            notes.append(f"{LABELS[p]}: {note}")
        ref = cell.get("check")
        if ref and not ref["pass"]:
            notes.append(f"{LABELS[p]} itself is outside our bounds ({_errors(ref)})")
    for name, cell in r["impls"].items():
        chk = cell.get("check")
        if is_ours(name) and chk and not chk["pass"]:
            notes.append(f"{label(name)} FAILED: {_errors(chk)}")
    if r.get("error"):
        notes.append(f"case error: {r['error']}")
    return notes


def _errors(chk):
    parts = [f"{x} {chk[x]['rel_max_err']:.1e}" + (f" ({chk[x]['nonfinite']} non-finite)"
                                                    if chk[x]["nonfinite"] else "")
             for x in ("dq", "dk", "dv")]
    return ", ".join(parts) + f"; bound {chk['dq']['bound']:.1e} of max |ref|"


def backward_summarize(results, fa4_off=None):
    """Per flashjit configuration: geomeans of x best (the faster of cuDNN and FA4), x FA2,
    x cuDNN and x FA4 over the cases that have them, and how often flashjit >= the best peer;
    the counts of checked and failed gradients (case_table.count_outputs) and the peers'
    skips."""
    summary = count_outputs(results, is_ours)
    configs = list(dict.fromkeys(n for r in results for n in configs_of(r)))
    per = {}
    for name in configs:
        ratios = {k: [] for k in ("best_peer", "flash", "cudnn", "fa4")}
        for r in results:
            cell = r["impls"].get(name) or {}
            for k in ratios:
                if cell.get(f"ratio_{k}"):
                    ratios[k].append(cell[f"ratio_{k}"])
        per[name] = {**{f"geomean_ratio_{k}": geomean(v) for k, v in ratios.items()},
                     **{f"cases_{k}": len(v) for k, v in ratios.items()},
                     "cases_at_least_best_peer": sum(1 for x in ratios["best_peer"] if x >= 1)}
    summary["configs"] = per
    summary["fa4"] = {"status": "off" if fa4_off else "on", "reason": fa4_off}
    summary["peers_timed"] = {p: sum(1 for r in results
                                     if (r["impls"].get(p) or {}).get("median_us"))
                              for p in PEERS}
    return summary


def backward_summary_lines(s):
    total = s["cases_total"]
    lines = ["backward (geomean of flashjit TFLOPS / peer TFLOPS; > 1: flashjit faster; x best: "
             "the faster of cuDNN and FA4" + (", cuDNN only: FA4 off" if s["fa4"]["status"] ==
                                              "off" else "") + "):"]
    for name, c in s["configs"].items():
        parts = [f"x best {fmt_num(c['geomean_ratio_best_peer'], '.3f')} "
                 f"({c['cases_best_peer']} of {total} cases, >= 1.0x in "
                 f"{c['cases_at_least_best_peer']})"]
        for k, title in (("flash", "x FA2"), ("cudnn", "x cuDNN"), ("fa4", "x FA4")):
            parts.append(f"{title} {fmt_num(c[f'geomean_ratio_{k}'], '.3f')} ({c[f'cases_{k}']})")
        lines.append(f"  {label(name):28s} " + ", ".join(parts))
    extra = [f"failed checks {s['failed_checks']} of {s['checked'] + s['errors']} checked"]
    if s["case_errors"]:
        extra.append(f"{s['case_errors']} cases crashed")
    na = {n: c for n, c in s["not_applicable"].items() if c}
    if na:
        extra.append("n/a: " + ", ".join(f"{label(n)} {c}" for n, c in na.items()))
    if s["peer_outputs_outside_bounds"]:
        extra.append(f"peer gradients outside our bounds in {s['peer_outputs_outside_bounds']}")
    if s["fa4"]["status"] == "off":
        extra.append(f"FA4 off: {short(s['fa4']['reason'] or '', 80)}")
    if s["cases_skipped"]:
        extra.append(f"{s['cases_skipped']} cases skipped (deadline)")
    if s["cases_reduced_reps"]:
        extra.append(f"{s['cases_reduced_reps']} cases with fewer repetitions")
    lines.append(f"BACKWARD SUMMARY {total} cases: " + "; ".join(extra))
    return lines


CSV_FIELDS = ["index", "case", "label", "impl", "status", "variant", "median_ms", "tflops",
              "ratio_best_peer", "ratio_flash", "ratio_cudnn", "ratio_fa4", "check",
              "dq_rel_max_err", "dk_rel_max_err", "dv_rel_max_err", "reason"]


def write_backward_csv(path, results):
    """backward.csv: a row per (case, implementation), flashjit's configurations and the
    peers, the numbers of the table."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in results:
            for name, cell in r["impls"].items():
                chk = cell.get("check") or {}
                w.writerow({
                    "index": r["index"], "case": r["case"], "label": r["label"],
                    "impl": label(name), "status": cell["status"],
                    "variant": cell.get("variant") or cell.get("how") or "",
                    "median_ms": cell.get("median_ms", ""), "tflops": cell.get("tflops", ""),
                    **{f"ratio_{k}": cell.get(f"ratio_{k}", "")
                       for k in ("best_peer", "flash", "cudnn", "fa4")},
                    "check": "" if not chk else ("pass" if chk.get("pass") else "FAIL"),
                    **{f"{x}_rel_max_err": (chk.get(x) or {}).get("rel_max_err", "")
                       for x in ("dq", "dk", "dv")},
                    "reason": short(cell.get("reason", ""), 300)})
