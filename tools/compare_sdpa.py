#!/usr/bin/env python3
"""flashjit vs PyTorch SDPA (cuDNN and flash backends) and FlashAttention-4, side by side on
one GPU.

For each case: fresh random inputs; flashjit's output (and LSE) checked against a float32
reference computed with torch on the same inputs; then flashjit, SDPA-cuDNN, SDPA-flash and,
when flash_attn.cute imports (--no-fa4: not), FA4 timed with CUDA events, repetitions
interleaved round-robin, medians compared (x FA4, and x best: the faster of cuDNN and FA4).
The KV-cache grids (--grid decode, decode-dense, paged) add paged caches, timed in bursts of
back-to-back calls, against the HBM floor. --grid backward (backward-quick) times the backward
pass alone (flashjit_backward vs SDPA cuDNN, SDPA flash and FA4 through autograd, in bursts),
gradients checked against fp32 autograd; --bwd-family and --deterministic A/B flashjit's.

    LD_LIBRARY_PATH=.devpack python3 tools/compare_sdpa.py --lib .devpack/libflashjit.so.0 \
        --grid standard --out $OUT/compare

docs/compare.md explains the columns, the tolerances and the timing method; the harness itself
is the package tools/compare/ (its __init__ says which module holds what).
Needs torch (CUDA) and numpy/matplotlib (plots only); --list-cases and --dry-run need neither a GPU
nor torch. Exit status: 0 all checks passed, 1 some check failed, 2 the run could not start.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package and the binding live here
from compare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
