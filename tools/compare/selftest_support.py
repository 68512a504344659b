"""What the self-tests share to read a rendered table and to recompute expected numbers
independently of report.py (their own geomean is the oracle report.geomean is checked against)."""

import math


def column(line, title, columns):
    """The text of column `title` in a table line laid out by `columns` ((title, width, align))."""
    start = 0
    for t, width, _ in columns:
        if t == title:
            return line[start:start + width].strip()
        start += width + 2
    raise KeyError(title)


def close(a, b):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
