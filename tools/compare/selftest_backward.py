"""No-GPU tests of the backward cases, run by --selftest-report: the grids, the --case bwd:
spelling, FLOPs at 2.5x the forward's, --bwd-family x --deterministic configurations, the
reference check's sampling plan; synthetic backward results through the table, the summary,
backward.csv and results.json; and the bookkeeping (ratios, the best of cuDNN and FA4, skip
rows, geomeans and their counts, FA4 off) on made-up timings checked against numbers worked
out here."""

import csv

from .backward_cases import (BackwardCase, backward_configs, backward_grid, parse_backward_case,
                             parse_config)
from .backward_checks import GRADIENT_TOLERANCES, plan_backward_check
from .backward_report import (COLUMNS, backward_case_rows, backward_summarize,
                              backward_summary_lines, backward_table_header, write_backward_csv)
from .run_backward import add_ratios, impl_name
from .run_case import case_entry, impl_cell
from .selftest_support import close, column, geomean

# (flashjit ms per configuration, cuDNN ms, FA2 ms or None: n/a, FA4 ms or None: refused)
TIMINGS = [({"auto": 1.0, "bwd_mma": 2.0}, 1.2, 2.0, 0.9),
           ({"auto": 1.0, "bwd_mma": 1.5}, 0.8, None, None),
           ({"auto": 2.0, "bwd_mma": 2.5}, 2.2, 3.0, 2.5)]
CONFIGS = ("auto", "bwd_mma")


def _grads(rel, dtype="bf16", fail=False):
    bound = GRADIENT_TOLERANCES[dtype]
    cell = {x: {"rel_max_err": rel * (4 if fail and x == "dk" else 1), "max_abs_err": rel,
                "max_abs_ref": 1.0, "rel_l2_err": rel / 3, "nonfinite": 0, "elements": 1,
                "bound": bound} for x in ("dq", "dk", "dv")}
    for x in ("dq", "dk", "dv"):
        cell[x]["pass"] = cell[x]["rel_max_err"] <= bound
    cell["pass"] = all(cell[x]["pass"] for x in ("dq", "dk", "dv"))
    cell["worst"] = max(cell[x]["rel_max_err"] for x in ("dq", "dk", "dv"))
    cell["nonfinite"] = 0
    return cell


def _timed(case, ms, **values):
    us = ms * 1e3
    return impl_cell("ok", median_us=us, median_ms=ms, reps=20, calls_per_rep=4,
                     tflops=case.flops() / (us * 1e-6) / 1e12, **values)


def bookkeeping_results(fa4_on=True):
    """The TIMINGS cases as run_backward_case would leave them; case 2's bwd_mma fails dk."""
    results = []
    for i, (ours, cudnn, fa2, fa4) in enumerate(TIMINGS):
        case = BackwardCase(2, 8, 8, 1024, 1024, 128, i == 1, "bf16",
                            group="bookkeeping")
        r = case_entry(i, case, flops_exact=case.flops_exact(),
                       forward_flops=case.forward_flops(), impls={}, notes=[],
                       check={"checked": "all heads, all rows"})
        for config, ms in ours.items():
            r["impls"][impl_name(config)] = _timed(
                case, ms, variant=f"{config}.synthetic", first_call_ms=900.0,
                check=_grads(8e-3, fail=i == 2 and config == "bwd_mma"))
        r["impls"]["cudnn"] = _timed(case, cudnn, check=_grads(6e-3))
        r["impls"]["flash"] = _timed(case, fa2, check=_grads(6e-3)) if fa2 else \
            impl_cell("n/a", reason="synthetic: flash refuses this")
        if not fa4_on:
            r["impls"]["fa4"] = impl_cell("off", reason="off (--no-fa4)")
        elif fa4 is None:
            r["impls"]["fa4"] = impl_cell("n/a", reason="refused: AssertionError: synthetic")
        else:
            r["impls"]["fa4"] = _timed(case, fa4, check=_grads(3e-2 if i == 0 else 5e-3))
        add_ratios(r)
        results.append(r)
    return results



def check_cases_and_configs():
    """Problems with the grids, spellings, FLOPs, configurations and the check's plan."""
    problems = []
    grid, quick = backward_grid("backward"), backward_grid("backward-quick")
    if len(grid) != 24 or len(quick) != 6:
        problems.append(f"grid sizes {len(grid)}, {len(quick)} (wanted 24, 6)")
    if any(c.batch * c.seqlen_q != 16384 or c.heads_q * c.head_dim != 2048 for c in grid):
        problems.append("the backward grid is not 16k tokens x hidden 2048")
    gqa = backward_grid("backward-quick", ("bf16", "fp16"), (1, 4))
    if len(gqa) != 24 or {c.heads_q // c.heads_kv for c in gqa} != {1, 4} \
            or {c.dtype for c in gqa} != {"bf16", "fp16"}:
        problems.append(f"--bwd-gqa 1,4 --bwd-dtype bf16,fp16: {len(gqa)} cases")
    c = parse_backward_case("bwd:2,32,8,4096,4096,128,1,fp16")
    if parse_backward_case(c.key()) != c or c.flops() != int(2.5 * 4 * 2 * 32 * 4096 ** 2 * 128
                                                             / 2):
        problems.append(f"bwd: spelling or FLOPs: {c.key()} {c.flops()}")
    for bad in ("bwd:2,32,8,4096,4096,128", "bwd:2,32,7,64,64,128,1", "bwd:1,1,1,1,1,64,1,fp8"):
        try:
            parse_backward_case(bad)
            problems.append(f"{bad!r} was accepted")
        except ValueError:
            pass
    got = backward_configs("auto,bwd_mma@64x128x2", "both", ("bwd_mma", "bwd_wgmma"))
    if got != ["auto", "auto+det", "bwd_mma@64x128x2", "bwd_mma@64x128x2+det"] or \
            parse_config(got[3]) != ("bwd_mma", (64, 128, 2), True) or \
            parse_config("auto") != (None, None, False):
        problems.append(f"configurations {got}")
    for text in ("nosuch", "bwd_mma@64x64"):
        try:
            backward_configs(text, "off", ("bwd_mma",))
            problems.append(f"--bwd-family {text!r} was accepted")
        except ValueError:
            pass
    pairs, what = plan_backward_check(BackwardCase(1, 16, 16, 16384, 16384, 128, True), 1 << 33)
    if len(pairs) != 16 or what != "all heads, all rows":
        problems.append(f"check plan at 16k: {len(pairs)} pairs, {what!r}")
    pairs, what = plan_backward_check(BackwardCase(32, 32, 8, 512, 512, 64, False), 1 << 33)
    if len(pairs) != 64 or pairs[0] != (0, 0) or pairs[-1] != (31, 7) or "4 query heads" \
            not in what:
        problems.append(f"check plan at 512 GQA: {len(pairs)} pairs, {what!r}")
    return problems


def check_backward_bookkeeping(out_dir):
    """(ok, message): ratios, best peer, geomeans and counts of bookkeeping_results against
    TIMINGS; what the table, the summary lines and backward.csv say; FA4 off."""
    problems = check_cases_and_configs()
    results = bookkeeping_results()
    for r, (ours, cudnn, fa2, fa4) in zip(results, TIMINGS):
        peers = {"cudnn": cudnn, **({"fa4": fa4} if fa4 else {})}
        best = min(peers, key=peers.get)
        if r["best_peer"] != best:
            problems.append(f"case {r['index']}: best peer {r['best_peer']} != {best}")
        for config, ms in ours.items():
            cell = r["impls"][impl_name(config)]
            want = {"ratio_best_peer": peers[best] / ms, "ratio_cudnn": cudnn / ms,
                    "ratio_flash": fa2 / ms if fa2 else None, "ratio_fa4": fa4 / ms if fa4
                    else None}
            for key, value in want.items():
                if not close(cell.get(key), value):
                    problems.append(f"case {r['index']} {config}: {key} {cell.get(key)} != "
                                    f"{value}")
    s = backward_summarize(results)
    for config in CONFIGS:
        c = s["configs"][impl_name(config)]
        best = [min([cu] + ([f4] if f4 else [])) / o[config] for o, cu, _, f4 in TIMINGS]
        fa2 = [f2 / o[config] for o, _, f2, _ in TIMINGS if f2]
        want = {"geomean_ratio_best_peer": geomean(best), "cases_best_peer": len(best),
                "cases_at_least_best_peer": sum(1 for x in best if x >= 1.0),
                "geomean_ratio_flash": geomean(fa2), "cases_flash": len(fa2),
                "cases_fa4": sum(1 for t in TIMINGS if t[3])}
        for key, value in want.items():
            if not close(c.get(key), value):
                problems.append(f"summary {config}: {key} {c.get(key)} != {value}")
    if (s["failed_checks"], s["checked"], s["peer_outputs_outside_bounds"]) != (1, 6, 1):
        problems.append(f"summary counts: failed {s['failed_checks']}, checked {s['checked']}, "
                        f"peers outside {s['peer_outputs_outside_bounds']}")
    lines = backward_table_header()
    for r in results:
        lines += backward_case_rows(r)
    lines += backward_summary_lines(s)
    first = [ln for ln in lines if ln[:3].strip().isdigit()]
    shown = [tuple(column(ln, t, COLUMNS) for t in ("FA4", "FA2", "x best")) for ln in first]
    want_shown = [(f"{results[0]['impls']['fa4']['tflops']:.1f}",
                   f"{results[0]['impls']['flash']['tflops']:.1f}",
                   f"{results[0]['impls']['flashjit.auto']['ratio_best_peer']:.2f}"),
                  ("skip", "skip", f"{0.8 / 1.0:.2f}"),
                  (f"{results[2]['impls']['fa4']['tflops']:.1f}",
                   f"{results[2]['impls']['flash']['tflops']:.1f}", f"{2.2 / 2.0:.2f}")]
    if shown != want_shown:
        problems.append(f"table FA4, FA2, x best: {shown}, wanted {want_shown}")
    for needed in ("FA4 skipped: refused: AssertionError: synthetic",
                   "SDPA flash (FA2) skipped: synthetic: flash refuses this",
                   "flashjit [bwd_mma] FAILED: dq 8.0e-03, dk 3.2e-02",
                   "FA4 itself is outside our bounds",
                   "BACKWARD SUMMARY 3 cases: failed checks 1 of 6 checked",
                   f"x best {geomean([0.9 / 1.0, 0.8 / 1.0, 2.2 / 2.0]):.3f} (3 of 3 cases, "
                   ">= 1.0x in 1)"):
        if not any(needed in ln for ln in lines):
            problems.append(f"report lacks {needed!r}")
    rows = [ln for r in results for ln in backward_case_rows(r) if "note:" not in ln]
    if [column(ln, "flashjit", COLUMNS) for ln in rows] != list(CONFIGS) * len(TIMINGS):
        problems.append(f"the flashjit column: {[column(ln, 'flashjit', COLUMNS) for ln in rows]}")
    path = out_dir / "backward-bookkeeping.csv"
    write_backward_csv(path, results)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 3 * 5 or {r["impl"] for r in rows} != {
            "flashjit [auto]", "flashjit [bwd_mma]", "SDPA cuDNN", "SDPA flash (FA2)", "FA4"}:
        problems.append(f"backward.csv: {len(rows)} rows")
    off = bookkeeping_results(fa4_on=False)
    s_off = backward_summarize(off, "off (--no-fa4)")
    off_lines = sum((backward_case_rows(r) for r in off), []) + backward_summary_lines(s_off)
    if any(r["impls"]["flashjit.auto"].get("ratio_fa4") for r in off) or \
            s_off["configs"]["flashjit.auto"]["cases_fa4"] or \
            not any("cuDNN only: FA4 off" in ln for ln in off_lines) or \
            any(column(ln, "FA4", COLUMNS) != "off"
                for ln in off_lines if ln[:3].strip().isdigit()):
        problems.append("FA4 off: ratios made, or the table and summary do not say off")
    if problems:
        return False, "backward bookkeeping FAILED: " + "; ".join(problems)
    return True, ("backward bookkeeping: grids, bwd: spelling, 2.5x FLOPs, --bwd-family x "
                  "--deterministic, check plan, ratios, best of cuDNN and FA4, skip rows, "
                  "geomeans and counts, failed gradients, backward.csv, FA4 off: ok")


def synthetic_backward_results(cases, configs):
    """Made-up cells for the report path: flashjit ~0.9x the best peer, FA4 refuses d256
    non-causal, SDPA flash d256 causal; case 1's last configuration fails dk."""
    results = []
    for index, case in enumerate(cases):
        r = case_entry(index, case, flops_exact=case.flops_exact(),
                       forward_flops=case.forward_flops(), impls={}, notes=[],
                       check={"checked": "all heads, all rows"})
        base = case.flops() / 500e12 * 1e3  # ms at 500 TFLOPS
        for i, config in enumerate(configs):
            r["impls"][impl_name(config)] = _timed(
                case, base * (1.1 + 0.2 * i), variant=f"bwd_wgmma.sm90a.{case.dtype}."
                f"d{case.head_dim}.m64n128s2" + (".causal" if case.causal else ""),
                first_call_ms=1200.0, check=_grads(9e-3, case.dtype,
                                                   index == 1 and i == len(configs) - 1))
        r["impls"]["cudnn"] = _timed(case, base, check=_grads(7e-3, case.dtype))
        r["impls"]["flash"] = impl_cell("n/a", reason="synthetic: flash refuses d256 causal") \
            if case.head_dim == 256 and case.causal else _timed(case, base * 1.8,
                                                               check=_grads(7e-3, case.dtype))
        r["impls"]["fa4"] = impl_cell("n/a", reason="refused: AssertionError: synthetic d256") \
            if case.head_dim == 256 and not case.causal else _timed(
                case, base * 0.8, check=_grads(5e-3, case.dtype))
        add_ratios(r)
        results.append(r)
    return results
