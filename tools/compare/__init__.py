"""flashjit vs PyTorch SDPA: the comparison harness behind tools/compare_sdpa.py.

One concern a module, in the order data flows through a run:

    cases        Case, --case parsing, the grids, --family parsing
    gpu          where tensors live and how to wait for them (hooks a CPU-only test replaces)
    backends     inputs, the flashjit runner, the SDPA runner
    checks       the float32 reference check and its tolerances
    timing       CUDA-event timer, round-robin repetitions, repetition plan
    run_case     one case: run, check, time, ratios (its results.json entry)
    report       table rows, summary, results.json
    plots        tflops_vs_seqlen.png and ratios.png
    environment  versions and GPU recorded in results.json
    selftest     synthetic numbers through the report path (--selftest-report, no GPU)
    cli          the command line and main()

The modules import flashjit_ctypes, which lives beside this package in tools/ (the entry
scripts put tools/ on sys.path). docs/compare.md explains what the harness measures.
"""
