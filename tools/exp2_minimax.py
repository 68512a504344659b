#!/usr/bin/env python3
"""The coefficients of kernels_src/common/exp2_poly.cuh: the polynomial p of degree 4 with the
smallest max |p(f) / 2^f - 1| on [-1/2, 1/2] (Remez exchange, in 40-digit mpmath), printed monic
(p / c4) with 1 / c4 = kExp2PolyScale, each rounded to float. Needs mpmath (pip install mpmath)."""
import struct
import sys

import mpmath as mp

mp.mp.dps = 40


def to_float(x):
    """x rounded to the nearest float, as the shortest decimal that round-trips."""
    f = struct.unpack("f", struct.pack("f", float(x)))[0]
    for digits in range(6, 10):
        text = f"{f:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == f:
            return text
    return repr(f)


def remez(degree, lo=mp.mpf(-0.5), hi=mp.mpf(0.5), rounds=25):
    """Coefficients c0..c_degree and the equioscillating relative error of the minimax for 2^f."""
    points = degree + 2
    # Chebyshev extrema to start; each round solves p(x_i) - 2^x_i = (-1)^i E 2^x_i on the
    # reference, then moves the reference to the extrema of the new error.
    ref = [(lo + hi) / 2 - (hi - lo) / 2 * mp.cos(mp.pi * i / (points - 1)) for i in range(points)]
    for _ in range(rounds):
        system = mp.matrix([[x**j for j in range(degree + 1)] + [(-1) ** i * 2**x]
                            for i, x in enumerate(ref)])
        sol = mp.lu_solve(system, mp.matrix([2**x for x in ref]))
        c, level = [sol[j] for j in range(degree + 1)], sol[degree + 1]
        err = lambda x: mp.polyval(c[::-1], x) / 2**x - 1
        grid = [lo + (hi - lo) * k / 2000 for k in range(2001)]
        # The extremum of each run of one sign.
        runs, best = [], (grid[0], err(grid[0]))
        for x in grid[1:]:
            e = err(x)
            if mp.sign(e) == mp.sign(best[1]):
                best = max(best, (x, e), key=lambda t: abs(t[1]))
            else:
                runs.append(best)
                best = (x, e)
        runs.append(best)
        ref, step = [], (hi - lo) / 2000
        for x, _ in runs:  # each extremum to full precision by ternary search on |err|
            left, right = max(lo, x - step), min(hi, x + step)
            for _ in range(100):
                m1, m2 = left + (right - left) / 3, right - (right - left) / 3
                if abs(err(m1)) < abs(err(m2)):
                    left = m1
                else:
                    right = m2
            ref.append((left + right) / 2)
        if len(ref) != points:
            sys.exit(f"Remez lost the alternation ({len(ref)} extrema for {points})")
    return c, abs(level)


def main():
    c, level = remez(4)
    print(f"max relative error (before rounding to float): {mp.nstr(level, 4)}")
    for i in (3, 2, 1, 0):
        print(f"a{i} = c{i} / c4 = {to_float(c[i] / c[4])}f")
    print(f"kExp2PolyScale = 1 / c4 = {to_float(1 / c[4])}f")


if __name__ == "__main__":
    main()
