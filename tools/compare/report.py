"""The report: table rows as cases finish, the summary, results.json."""

import json
import math
import os
from pathlib import Path

from .backends import BEST_PEERS, SDPA_BACKENDS, SDPA_LABELS

SCHEMA = "flashjit-compare-sdpa/1"


def fmt_num(x, spec):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def check_word(cell):
    if cell is None:
        return "-"
    if cell["status"] == "n/a":
        return "n/a"
    if cell["status"] == "error":
        return "ERROR"
    chk = cell.get("check")
    if chk is None:
        return "-"
    return "pass" if chk["pass"] else "FAIL"


def headline_family(case_result, families):
    """The family whose numbers the summary line uses for this case: the requested one when a
    single family (or 'auto') was asked for, else the dispatcher's pick, else the fastest."""
    cells = case_result["flashjit"]
    if "auto" in cells:
        return "auto"
    if len(families) == 1:
        return families[0]
    auto = case_result.get("auto_family")
    if auto in cells and cells[auto].get("median_ms"):
        return auto
    timed = [(c["median_ms"], f) for f, c in cells.items() if c.get("median_ms")]
    return min(timed)[1] if timed else (auto if auto in cells else families[0])


COLUMNS = [  # (title, width, align)
    ("#", 3, ">"), ("case", 42, "<"), ("family", 6, "<"), ("check", 5, "<"),
    ("rel_err", 8, ">"), ("max_err", 8, ">"), ("lse_err", 8, ">"), ("TFLOPS", 7, ">"),
    ("cuDNN", 7, ">"), ("flash", 7, ">"), ("x cuDNN", 7, ">"), ("x flash", 7, ">"),
    ("FA4", 7, ">"), ("x FA4", 7, ">"), ("x best", 7, ">"), ("variant", 0, "<"),
]
PEER_LABELS = {"cudnn": "cuDNN", "flash": "flash", "fa4": "FA4"}


def format_row(values):
    cells = []
    for (title, width, align), value in zip(COLUMNS, values):
        cells.append(f"{value:{align}{width}}" if width else str(value))
    return "  ".join(cells).rstrip()


def table_header():
    return [format_row([t for t, _, _ in COLUMNS]),
            format_row(["-" * max(w, len(t)) if w else "-" * 7 for t, w, _ in COLUMNS])]


def case_rows(r):
    """Table lines of one case: one per flashjit family, SDPA's and FA4's numbers on the
    first; its notes (an FA4 that refused the case: 'FA4 skipped: reason')."""
    families = list(r["flashjit"]) or ["-"]
    lines = [_family_row(r, i, family) for i, family in enumerate(families)]
    for note in _case_notes(r):
        lines.append(" " * 5 + "note: " + note)
    return lines


def _sdpa_tflops(cell):
    if cell is None:
        return "-"
    if cell["status"] != "ok":
        return "n/a"
    mark = "†" if cell.get("mask_alignment") == "top-left" else ""
    return fmt_num(cell.get("tflops"), ".1f") + mark


def peer_tflops(cell):
    """A peer's TFLOPS cell: 'skip' where it refused the case, 'off' when it is off for the run,
    '-' where it has no entry."""
    if cell is None:
        return "-"
    if cell["status"] != "ok":
        return {"n/a": "skip"}.get(cell["status"], cell["status"])
    return fmt_num(cell.get("tflops"), ".1f")


def _family_row(r, i, family):
    """Line i of a case: `family`'s numbers; the case's, SDPA's and FA4's numbers on the first
    only."""
    cell = r["flashjit"].get(family)
    chk = (cell or {}).get("check") or {}
    shown_family = family
    if family == "auto" and cell and cell.get("variant"):
        shown_family = cell["variant"].split(".")[0] + "*"
    ok = cell is not None and cell["status"] == "ok"
    variant = (cell or {}).get("variant") or ""
    if cell and cell["status"] != "ok":
        variant = (variant + "  " if variant else "") + short(cell.get("reason", ""), 70)
    return format_row([
        str(r["index"]) if i == 0 else "",
        r["label"] if i == 0 else "",
        shown_family,
        check_word(cell),
        fmt_num(chk.get("rel_err"), ".1e"),
        fmt_num(chk.get("max_abs_err"), ".1e"),
        fmt_num(chk.get("lse_max_abs_err"), ".1e"),
        fmt_num(cell.get("tflops"), ".1f") if ok else ("n/a" if cell else "-"),
        _sdpa_tflops(r["sdpa"].get("cudnn")) if i == 0 else "",
        _sdpa_tflops(r["sdpa"].get("flash")) if i == 0 else "",
        fmt_num(cell.get("ratio_cudnn"), ".2f") if ok else "-",
        fmt_num(cell.get("ratio_flash"), ".2f") if ok else "-",
        peer_tflops(r.get("fa4")) if i == 0 else "",
        fmt_num(cell.get("ratio_fa4"), ".2f") if ok else "-",
        fmt_num(cell.get("ratio_best_peer"), ".2f") if ok else "-",
        variant,
    ])


def _case_notes(r):
    """What was sampled by the check, SDPA refusals and fallbacks, FA4 skipped (why), a peer
    outside our bounds, why checks failed."""
    notes = list(r.get("notes", []))
    checked = r.get("check", {}).get("checked")
    if checked and checked != "all heads, all rows":
        notes.append(f"checked: {checked}")
    for backend in SDPA_BACKENDS:
        cell = r["sdpa"].get(backend)
        if cell is None:
            continue
        if cell["status"] != "ok":
            notes.append(f"{SDPA_LABELS[backend]} n/a: {short(cell.get('reason', ''), 160)}")
        else:
            for note in cell.get("notes", []):
                notes.append(f"{SDPA_LABELS[backend]}: {note}")
            notes += _outside_bounds(SDPA_LABELS[backend], cell)
    fa4 = r.get("fa4")
    if fa4 and fa4["status"] == "n/a":
        notes.append(f"FA4 skipped: {short(fa4.get('reason', ''), 200)}")
    elif fa4 and fa4["status"] == "ok":
        notes += [f"FA4: {note}" for note in fa4.get("notes", [])] + _outside_bounds("FA4", fa4)
    for family, cell in r["flashjit"].items():
        chk = cell.get("check")
        if chk and not chk["pass"]:
            notes.append(f"{family} FAILED: " + "; ".join(_failure_reasons(chk)))
    if r.get("error"):
        notes.append(f"case error: {r['error']}")
    return notes


def _outside_bounds(label, cell):
    """['<peer> itself is outside our bounds (...)'] when the peer's output is, else []."""
    ref = cell.get("reference_error")
    if not ref or ref.get("within_bounds", True):
        return []
    return [f"{label} itself is outside our bounds (rel {ref['rel_err']:.1e}, max "
            f"{ref['max_abs_err']:.1e}" + (f", {ref['nonfinite']} non-finite"
                                           if ref.get("nonfinite") else "") + ")"]


def _failure_reasons(chk):
    why = []
    if chk["nonfinite"]:
        why.append(f"{chk['nonfinite']} non-finite outputs")
    if chk["rel_err"] > chk["rel_bound"]:
        why.append(f"rel {chk['rel_err']:.2e} > {chk['rel_bound']:.1e}")
    if chk["max_abs_err"] > chk["abs_bound"]:
        why.append(f"max {chk['max_abs_err']:.2e} > {chk['abs_bound']:.2e}")
    if chk.get("lse_mismatch"):
        why.append(f"{chk['lse_mismatch']} LSE entries -inf/finite/NaN mismatched")
    if chk.get("lse_max_abs_err", 0) > chk.get("lse_bound", math.inf):
        why.append(f"LSE {chk['lse_max_abs_err']:.2e} > {chk['lse_bound']:.0e}")
    return why


def short(text, n):
    """text on one line, cut to n characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def geomean(values):
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(results, families, fa4_off=None):
    """Per-family ladder numbers plus the headline (see headline_family); FA4's counts.
    fa4_off: why FA4 was off for the whole run (None: it was on)."""
    def collect(pick):
        ratios = {b: [] for b in SDPA_BACKENDS + ("fa4", "best_peer")}
        failed = checked = na = errors = timed = 0
        for r in results:
            family = pick(r)
            cell = r["flashjit"].get(family)
            if cell is None:
                continue
            if cell["status"] == "n/a":
                na += 1
                continue
            if cell["status"] == "error":
                errors += 1
                continue
            chk = cell.get("check")
            if chk is not None:
                checked += 1
                failed += 0 if chk["pass"] else 1
            if cell.get("median_ms"):
                timed += 1
            for b in SDPA_BACKENDS:
                if cell.get(f"ratio_{b}") and cell.get(f"ratio_{b}_comparable", True):
                    ratios[b].append(cell[f"ratio_{b}"])
            for key in ("fa4", "best_peer"):  # FA4 skipped or off: no ratio, not counted
                if cell.get(f"ratio_{key}"):
                    ratios[key].append(cell[f"ratio_{key}"])
        best = ratios["best_peer"]
        return {"geomean_ratio_cudnn": geomean(ratios["cudnn"]), "cases_cudnn": len(ratios["cudnn"]),
                "geomean_ratio_flash": geomean(ratios["flash"]), "cases_flash": len(ratios["flash"]),
                "geomean_ratio_fa4": geomean(ratios["fa4"]), "cases_fa4": len(ratios["fa4"]),
                "geomean_ratio_best_peer": geomean(best), "cases_best_peer": len(best),
                "cases_at_least_best_peer": sum(1 for x in best if x >= 1.0),
                "checked": checked, "failed_checks": failed + errors, "errors": errors,
                "not_applicable": na, "timed": timed}

    summary = {"families": {f: collect(lambda r, f=f: f) for f in families}}
    summary["headline"] = collect(lambda r: headline_family(r, families))
    # Every failed check counts, whichever family it was in, and so does a case that crashed.
    summary["case_errors"] = sum(1 for r in results if r.get("error"))
    summary["failed_checks_total"] = (sum(s["failed_checks"] for s in summary["families"].values())
                                      + summary["case_errors"])
    summary["sdpa_not_applicable"] = {
        b: sum(1 for r in results if r["sdpa"].get(b, {}).get("status") == "n/a")
        for b in SDPA_BACKENDS}
    summary["fa4"] = fa4_summary(results, fa4_off)
    summary["cases"] = len(results)
    summary["cases_skipped"] = sum(1 for r in results if r.get("skipped"))
    summary["cases_reduced_reps"] = sum(1 for r in results if r.get("reduced_reps"))
    return summary


def fa4_summary(results, off):
    """FA4 over the run: on or off (and why), cases it ran, was timed on, skipped (refused),
    and where its output was outside our bounds."""
    cells = [r.get("fa4") or {} for r in results]
    return {"status": "off" if off else "on", "reason": off,
            "ran": sum(1 for c in cells if c.get("status") == "ok"),
            "timed": sum(1 for c in cells if c.get("median_ms")),
            "skipped": sum(1 for c in cells if c.get("status") == "n/a"),
            "outside_bounds": sum(1 for c in cells
                                  if (c.get("reference_error") or {}).get("within_bounds")
                                  is False)}


def fa4_off_word(reason):
    """'--no-fa4' or 'not importable': the short form of why FA4 is off."""
    return "--no-fa4" if "--no-fa4" in reason else reason.split(" (", 1)[0].split(";", 1)[0]


def summary_lines(summary, families, compile_info, wall_s):
    fa4 = summary.get("fa4") or {"status": "on"}
    total = summary["cases"]

    def ratio_text(s):
        parts = []
        for b, label in (("cudnn", "cuDNN"), ("flash", "flash")):
            g = s[f"geomean_ratio_{b}"]
            parts.append(f"x {label} {fmt_num(g, '.3f')} ({s[f'cases_{b}']} cases)")
        peers = "faster of " + " and ".join(PEER_LABELS[p] for p in BEST_PEERS)
        if fa4["status"] == "off":
            parts.append(f"x FA4 off ({fa4_off_word(fa4.get('reason') or '')})")
            peers = "cuDNN only: FA4 off"
        else:
            parts.append(f"x FA4 {fmt_num(s['geomean_ratio_fa4'], '.3f')} ({s['cases_fa4']} of "
                         f"{total} cases)")
        n = s["cases_best_peer"]
        return (", ".join(parts) + f"; x best peer ({peers}) "
                f"{fmt_num(s['geomean_ratio_best_peer'], '.3f')} ({n} of {total} cases), "
                f"flashjit >= 1.0x the best peer in {s['cases_at_least_best_peer']} of {n}")

    lines = []
    if len(families) > 1:
        lines.append("ladder (geomean of flashjit TFLOPS / peer TFLOPS; > 1: flashjit faster):")
        for f in families:
            s = summary["families"][f]
            lines.append(f"  {f:6s} {ratio_text(s)}; checks failed {s['failed_checks']} of "
                         f"{s['checked'] + s['errors']}; n/a {s['not_applicable']}")
    h = summary["headline"]
    who = families[0] if len(families) == 1 else "dispatcher's pick"
    if families == ["auto"]:
        who = "auto"
    extra = []
    na = summary["sdpa_not_applicable"]
    if any(na.values()):
        extra.append("SDPA n/a: " + ", ".join(f"{b} {n}" for b, n in na.items() if n))
    if fa4.get("skipped"):
        extra.append(f"FA4 skipped {fa4['skipped']} (refused: notes say why)")
    if fa4.get("outside_bounds"):
        extra.append(f"FA4 outside our bounds in {fa4['outside_bounds']}")
    if h["not_applicable"]:
        extra.append(f"flashjit n/a {h['not_applicable']}")
    if summary["cases_skipped"]:
        extra.append(f"{summary['cases_skipped']} cases skipped (deadline)")
    if summary["cases_reduced_reps"]:
        extra.append(f"{summary['cases_reduced_reps']} cases with fewer repetitions")
    if summary["case_errors"]:
        extra.append(f"{summary['case_errors']} cases crashed")
    if compile_info and compile_info.get("seconds") is not None:
        extra.append(f"compile {compile_info['seconds']:.1f} s")
    extra.append(f"wall {wall_s:.0f} s")
    lines.append(f"SUMMARY flashjit ({who}) vs SDPA and FA4: {ratio_text(h)}; failed checks "
                 f"{summary['failed_checks_total']}; " + "; ".join(extra))
    return lines


def json_clean(x):
    """results.json is strict JSON: non-finite floats become strings ('inf', 'nan')."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    return x


def write_json(path, document):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(json_clean(document), indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # a run cut short still leaves a whole file


class Output:
    """Prints lines as they come and keeps them for table.txt."""

    def __init__(self):
        self.lines = []

    def __call__(self, line=""):
        print(line, flush=True)
        self.lines.append(line)
