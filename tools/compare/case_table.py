"""What the KV and varlen reports share: a case's table (title lines, header, one row per
implementation, verdict, notes), the note for an output outside its bounds, and the count of
checked, failed and not-applicable outputs over the cases."""

INDENT = " " * 5


def table_row(columns, values):
    """One line of a table whose columns are (title, width, align); width 0: as wide as it is."""
    cells = [f"{v:{a}{w}}" if w else str(v) for (_, w, a), v in zip(columns, values)]
    return INDENT + "  ".join(cells).rstrip()


def case_lines(head, columns, rows, verdict, notes):
    """head: the title and any lines under it; rows: the implementations' table rows."""
    lines = list(head) + [table_row(columns, [t for t, _, _ in columns]),
                          table_row(columns, ["-" * max(w, len(t)) if w else "-" * 13
                                              for t, w, _ in columns])]
    lines += rows
    if verdict:
        lines.append(INDENT + "=> " + verdict)
    return lines + [INDENT + "note: " + note for note in notes]


def skipped_lines(title, r):
    return [title + "  [skipped]"] + [INDENT + "note: " + n for n in r.get("notes", [])]


def check_failure_note(label, chk, ours):
    """'<impl> FAILED (rel .., max .., n non-finite[, m LSE mismatched])' for our outputs,
    '... is outside our bounds (...)' for a peer's."""
    who = "FAILED" if ours else "is outside our bounds"
    return (f"{label} {who} (rel {chk['rel_err']:.1e}, max {chk['max_abs_err']:.1e}, "
            f"{chk['nonfinite']} non-finite"
            + (f", {chk['lse_mismatch']} LSE mismatched" if chk.get("lse_mismatch") else "")
            + ")")


def count_outputs(results, is_ours):
    """The summary's failure counts: our outputs checked, failed and in error (crashed cases
    count as failed too), peers' outputs outside our bounds, n/a cells per implementation."""
    failed = checked = errors = peers_outside = 0
    not_applicable = {}
    for r in results:
        for name, c in r["impls"].items():
            chk = c.get("check")
            if c["status"] == "n/a":
                not_applicable[name] = not_applicable.get(name, 0) + 1
            if not is_ours(name):
                peers_outside += 1 if chk and not chk["pass"] else 0
                continue
            errors += c["status"] == "error"
            checked += chk is not None
            failed += 1 if chk and not chk["pass"] else 0
    case_errors = sum(1 for r in results if r.get("error"))
    return {"checked": checked, "errors": errors, "case_errors": case_errors,
            "failed_checks": failed + errors + case_errors,
            "peer_outputs_outside_bounds": peers_outside, "not_applicable": not_applicable,
            "cases_total": len(results),
            "cases_skipped": sum(1 for r in results if r.get("skipped")),
            "cases_reduced_reps": sum(1 for r in results if r.get("reduced_reps"))}
