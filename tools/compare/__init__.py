"""flashjit vs PyTorch SDPA and FlashAttention-4: the comparison harness behind
tools/compare_sdpa.py.

One concern a module, in the order data flows through a run:

    case         Case (one dense problem), parse_shape (the fields every spelling starts with)
    cases        --case parsing, the grids, --family parsing
    decode_cases KvCase (decode, speculative decode, chunked prefill, paged), kv:... spelling,
                 the KV grids
    varlen_cases VarlenCase (a packed prefill batch of many lengths), varlen:... spelling, the
                 varlen grid
    backward_cases  BackwardCase (the backward pass alone), bwd:... spelling, the backward
                 grids, the --bwd-family x --deterministic configurations
    gpu          where tensors live and how to wait for them (hooks a CPU-only test replaces)
    backends     inputs, the flashjit runner, the SDPA runner
    fa4          FlashAttention-4: loading it, its signature checks, its dense and paged calls
    decode_backends  KV inputs (dense and shuffled pages), flashjit forward_kv, FlashAttention-4
    varlen_backends  packed inputs and their dense twin, flashjit forward_varlen, FA4 varlen
    backward_backends  inputs with dout, flashjit backward (binding), SDPA and FA4 backward
                 through autograd
    checks       the float32 reference check and its tolerances
    backward_checks  dq, dk, dv against fp32 autograd gradients of the math attention, bounds
    same_output  several runs of one problem against the first (the tools' tile / mask sweeps)
    timing       CUDA-event timer, bursts, round-robin repetitions, repetition plan, per-call
                 times of a sweep (the tools' tile / mask sweeps)
    run_case     one case: run, check, time, ratios to SDPA, FA4 and the best peer (its
                 results.json entry)
    run_decode   one KV case: run, check, time in bursts, TB/s, ratios to the best peer
    run_varlen   one varlen case: run, check per sequence, time in bursts, varlen vs dense
    run_backward one backward case: forwards once, backwards checked, timed in bursts, ratios
    run_all      every case in turn, guarded; the final report
    report       table rows, summary, results.json
    decode_report  the KV cases' tables and summary
    varlen_report  the varlen cases' tables and summary
    backward_report  the backward cases' table, summary and backward.csv
    plots        tflops_vs_seqlen.png and ratios.png
    environment  versions and GPU recorded in results.json
    selftest     synthetic numbers through the report path (--selftest-report, no GPU)
    selftest_dense  FA4's dense bookkeeping on made-up timings, a CPU rehearsal of run_case
    selftest_kv  the binding's struct layouts, synthetic KV results, a CPU rehearsal of a KV run
    selftest_varlen  synthetic varlen results, a CPU rehearsal of a varlen run
    selftest_support  reading a table's columns; the self-tests' own geomean and tolerance
    selftest_backward  the backward grids, spellings and configurations, synthetic backward
                 results, their bookkeeping on made-up timings
    cli          the command line and main()

The modules import flashjit_ctypes, which lives beside this package in tools/ (the entry
scripts put tools/ on sys.path). docs/compare.md explains what the harness measures.
"""
