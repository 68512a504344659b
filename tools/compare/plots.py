"""The plots: tflops_vs_seqlen.png and ratios.png (matplotlib; skipped without it)."""

import sys

from .backends import SDPA_BACKENDS, SDPA_LABELS
from .report import headline_family

# (line style, marker, colour) by rung, counted from the fastest family, which 'auto' draws as;
# a family below these rungs draws solid with matplotlib's next colour.
RUNG_STYLES = [("-", "o", "tab:red"), ("-.", "^", "tab:orange"), (":", "s", "tab:gray")]
SDPA_COLORS = {"cudnn": "tab:blue", "flash": "tab:green"}
FA4_COLOR = "tab:purple"


def family_style(family, ladder):
    """(line style, marker, colour) of a flashjit family; ladder: the families, slowest first."""
    if family == "auto":
        return RUNG_STYLES[0]
    ladder = list(ladder)
    rung = len(ladder) - 1 - ladder.index(family) if family in ladder else len(RUNG_STYLES)
    return RUNG_STYLES[rung] if rung < len(RUNG_STYLES) else ("-", "o", None)


def seqlen_tick(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def plot_results(results, families, ladder, out_dir, subtitle=""):
    """tflops_vs_seqlen.png (one panel per head dim x causal for every series of cases that
    differ only in seqlen) and ratios.png (headline ratios, every case). Returns file names."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plots skipped: matplotlib unavailable ({e})", file=sys.stderr)
        return []
    written = []
    groups = seqlen_series(results)
    if groups:
        plot_tflops_vs_seqlen(plt, groups, families, ladder, subtitle,
                              out_dir / "tflops_vs_seqlen.png")
        written.append("tflops_vs_seqlen.png")
    rows = ratio_rows(results, families)
    if rows:
        plot_ratios(plt, rows, subtitle, out_dir / "ratios.png")
        written.append("ratios.png")
    return written


def seqlen_series(results):
    """Series of cases alike but for seqlen (s_q == s_k), at least two seqlens, keyed by
    (dtype, layout, GQA ratio, causal, head dim); each sorted by seqlen."""
    groups = {}
    for r in results:
        if r.get("skipped") or r["seqlen_q"] != r["seqlen_k"]:
            continue
        key = (r["dtype"], r["layout"], r["heads_q"] // r["heads_kv"], r["causal"], r["head_dim"])
        groups.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda r: r["seqlen_q"]) for k, v in groups.items()
            if len({r["seqlen_q"] for r in v}) >= 2}


def plot_tflops_vs_seqlen(plt, groups, families, ladder, subtitle, path):
    """A row of panels per (dtype, layout, GQA ratio, causal), a column per head dim."""
    keys = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], k[4]))
    head_dims = sorted({k[4] for k in keys})
    rows_keys = sorted({k[:4] for k in keys})
    ncols, nrows = len(head_dims), len(rows_keys)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, 4.6 * ncols), 3.6 * nrows + 0.4),
                             squeeze=False)
    for (row_key), row_axes in zip(rows_keys, axes):
        for d, ax in zip(head_dims, row_axes):
            key = row_key + (d,)
            if key not in groups:
                ax.set_visible(False)
                continue
            draw_seqlen_panel(ax, groups[key], row_key, d, families, ladder)
    fig.suptitle("flashjit vs PyTorch SDPA and FA4: forward TFLOPS (4·b·h·s²·d, halved for causal)"
                 + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_seqlen_panel(ax, series, row_key, d, families, ladder):
    """TFLOPS against seqlen of every flashjit family, SDPA backend and FA4 over one series."""
    xs = [r["seqlen_q"] for r in series]
    for family in families:
        ys = [r["flashjit"].get(family, {}).get("tflops") for r in series]
        if any(y is not None for y in ys):
            ls, marker, color = family_style(family, ladder)
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], ls,
                    marker=marker, color=color, label=f"flashjit {family}")
    for backend in SDPA_BACKENDS:
        ys = [r["sdpa"].get(backend, {}).get("tflops") for r in series]
        if any(y is not None for y in ys):
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], "--",
                    marker="x", color=SDPA_COLORS[backend], label=SDPA_LABELS[backend])
    ys = [(r.get("fa4") or {}).get("tflops") for r in series]
    if any(y is not None for y in ys):
        ax.plot(xs, [y if y is not None else float("nan") for y in ys], "--", marker="+",
                color=FA4_COLOR, label="FA4")
    dtype, layout, ratio, causal = row_key
    gqa = f", GQA {ratio}:1" if ratio > 1 else ""
    ax.set_title(f"d={d}, {'causal' if causal else 'non-causal'}, {dtype} "
                 f"{layout}{gqa}", fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([seqlen_tick(x) for x in xs])
    tokens = {r["batch"] * r["seqlen_q"] for r in series}
    ax.set_xlabel(f"seqlen (batch x seqlen = {seqlen_tick(tokens.pop())})"
                  if len(tokens) == 1 else "seqlen")
    ax.set_ylabel("TFLOPS")
    plotted = [y for line in ax.get_lines() for y in line.get_ydata()
               if y == y and y > 0]
    if plotted and max(plotted) / min(plotted) > 20:
        ax.set_yscale("log")  # a ladder from the first kernel to the fastest spans decades
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def ratio_rows(results, families):
    """(label, ratio to cuDNN, ratio to flash, ratio to FA4) of the headline family, every
    case run."""
    rows = []
    for r in results:
        if r.get("skipped"):
            continue
        family = headline_family(r, families)
        cell = r["flashjit"].get(family, {})
        # a ratio against a top-left causal SDPA compares different work: not drawn
        ratios = [cell.get(f"ratio_{b}") if cell.get(f"ratio_{b}_comparable", True) else None
                  for b in SDPA_BACKENDS] + [cell.get("ratio_fa4")]
        shown = family if family != "auto" else (cell.get("variant") or "auto").split(".")[0]
        rows.append((f"{r['label']}  [{shown}]", *ratios))
    return rows


def plot_ratios(plt, rows, subtitle, path):
    """Horizontal bars: flashjit TFLOPS / peer TFLOPS per case, against each SDPA backend and
    (where any case has it) FA4."""
    series = [(1, SDPA_COLORS["cudnn"], "vs SDPA cuDNN"), (2, SDPA_COLORS["flash"],
                                                          "vs SDPA flash")]
    if any(row[3] for row in rows):
        series.append((3, FA4_COLOR, "vs FA4"))
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) * len(series) / 2 + 1.5))
    ys = list(range(len(rows)))
    nan = float("nan")
    for k, (column, color, label) in enumerate(series):
        dy = (k - (len(series) - 1) / 2) * height
        values = [row[column] for row in rows]
        ax.barh([y + dy for y in ys], [v if v else nan for v in values], height=height,
                color=color, label=label)
        for y, value in zip(ys, values):
            if value:
                ax.text(value, y + dy, f" {value:.2f}", va="center", fontsize=6)
    ax.axvline(1.0, color="black", linewidth=0.8)
    values = [row[column] for row in rows for column, _, _ in series if row[column]]
    if values and max(values) / min(values) > 8:  # the ladder spans decades: log scale
        ax.set_xscale("log")
    ax.set_yticks(ys)
    ax.set_yticklabels([row[0] for row in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("flashjit TFLOPS / peer TFLOPS (> 1: flashjit faster)")
    if subtitle:
        ax.set_title(subtitle, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
