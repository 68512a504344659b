"""Whether several runs of one problem (forced tiles, block masks on and off, families) agree: each
output against the first, as max |diff| / max |first| (bf16 rounding: under 2e-2), NaN failing."""


def against_first(outputs, tolerance=2e-2):
    """[(name, relative max difference, ok)] for {name: output tensor}, the first as the yardstick."""
    base = next(iter(outputs.values())).float()
    scale = base.abs().max().item() or 1.0
    rows = []
    for name, out in outputs.items():
        err = (out.float() - base).abs().max().item() / scale
        rows.append((name, err, err < tolerance and not out.isnan().any().item()))
    return rows


def print_agreement(outputs, label=str):
    """Prints each run's difference to the first ("check LABEL max rel diff ... ok/FAIL"); True
    when every run agrees."""
    rows = against_first(outputs)
    for name, err, ok in rows:
        print(f"check {label(name)} max rel diff {err:.2e} {'ok' if ok else 'FAIL'}")
    return all(ok for _, _, ok in rows)
