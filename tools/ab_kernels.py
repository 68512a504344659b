#!/usr/bin/env python3
"""A/B of kernel sources: one libflashjit, each build's kernels_src read through
FLASHJIT_KERNELS_DIR, one compare_sdpa.py process per build and round, each timing SDPA cuDNN
beside flashjit, so x cuDNN in the same process is the number the builds are compared by (the
card's speed moves 5-10 % between processes; the ratio moved 0.3 % in session 20).

    # here: export each git ref's kernels (the GPU machine has no repository)
    git archive main kernels_src | tar -x -C .ab/main
    git archive my-branch kernels_src | tar -x -C .ab/new
    # there:
    python3 tools/ab_kernels.py --build main=.ab/main/kernels_src --build new=.ab/new/kernels_src \
        --out $OUT/ab -- --lib .devpack/libflashjit.so.0 --no-fa4 \
        --case bwd:2,16,16,8192,8192,128,0 --case bwd:1,16,16,16384,16384,128,1

A build may bring its own library, NAME=KERNELS_DIR@LIB (host changes: a launch plan, a grid),
which replaces the --lib given after --.

Rounds alternate the builds' order (round 2 runs them backwards); the first round checks
correctness (a timing-only build that computes wrong results: --timing-only NAME), later rounds
only time. Every build gets its own kernel cache under --out. Prints and writes summary.txt
(rewritten after every process, so a run cut short keeps the rounds it finished):
per build, x cuDNN per cell (median over rounds; paged cells, which cuDNN cannot run: x the same
process's dense-cache row) and the geomean per round. Exit status 1 when a check failed or a
process did not finish.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare.report import geomean  # noqa: E402

HARNESS = Path(__file__).resolve().parent / "compare_sdpa.py"
CASE_LISTS = ("cases", "kv_cases", "varlen_cases", "backward_cases")


def parse_builds(texts):
    """{name: (kernels dir, library or None)}."""
    builds = {}
    for text in texts:
        name, _, spec = text.partition("=")
        directory, _, library = spec.partition("@")
        if not name or not directory:
            raise SystemExit(f"--build {text!r}: expected NAME=KERNELS_DIR[@LIB]")
        if library and not Path(library).is_file():
            raise SystemExit(f"--build {text!r}: no library at {library}")
        if not (Path(directory) / "common").is_dir():
            raise SystemExit(f"--build {text!r}: {directory} is not a kernels_src tree "
                             "(no common/ in it)")
        if name in builds:
            raise SystemExit(f"--build {name!r} given twice")
        builds[name] = (str(Path(directory).resolve()),
                        str(Path(library).resolve()) if library else None)
    if len(builds) < 2:
        raise SystemExit("--build: at least two builds to compare")
    return builds


def flashjit_ratios(results_path):
    """{cell: ratio} of the flashjit rows of one results.json ({} when absent): x cuDNN, or for
    paged cases (cuDNN has no paged cache) x our own dense-cache row of the same process, which
    the builds being compared may share or not ("(x dense)" in the cell's name)."""
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        return {}, False
    ratios, failed = {}, False
    for key in CASE_LISTS:
        for case in results.get(key, []):
            # Dense cases keep flashjit's rows as {family: cell} under "flashjit", the others
            # every implementation's under "impls".
            impls = case.get("impls") or {
                "flashjit" if family == "auto" else f"flashjit {family}": cell
                for family, cell in (case.get("flashjit") or {}).items()}
            for impl, cell in impls.items():
                if not impl.startswith("flashjit"):
                    continue
                check = cell.get("check")
                if isinstance(check, dict) and not check.get("pass", True):
                    failed = True
                # Dense and backward cases: ratio_cudnn; KV cases: ratio_peers' sdpa_cudnn.
                cudnn = cell.get("ratio_cudnn", cell.get("ratio_peers", {}).get("sdpa_cudnn"))
                if cudnn is not None:
                    ratios[f"{case['label']} [{impl}]"] = cudnn
                elif impl != "flashjit_dense" and cell.get("median_us"):
                    dense = case["impls"].get("flashjit_dense", {}).get("median_us")
                    if dense:
                        ratios[f"{case['label']} [{impl}] (x dense)"] = dense / cell["median_us"]
    return ratios, failed


def geomean_text(values, width=0):
    value = geomean(values)
    return f"{'-' if value is None else f'{value:.3f}':>{width}}"


def write_summary(builds, per_round, rounds, out_dir):
    """summary.txt from the processes run so far (per build, the median over its rounds of
    each cell, then each round's geomean; '-' where a round did not run); returns its text."""
    cells = sorted({c for runs in per_round.values() for ratios in runs for c in ratios})
    width = max([len(c) for c in cells] + [16])
    lines = ["x cuDNN (paged cells: x our dense cache) per cell (median over rounds), then the "
             "geomean of each round:",
             f"{'cell':<{width}}  " + "  ".join(f"{n:>10}" for n in builds)]
    for cell in cells:
        medians = []
        for name in builds:
            values = [ratios[cell] for ratios in per_round[name] if cell in ratios]
            medians.append(f"{statistics.median(values):10.3f}" if values else f"{'-':>10}")
        lines.append(f"{cell:<{width}}  " + "  ".join(medians))
    for r in range(rounds):
        lines.append(f"{'geomean round ' + str(r + 1):<{width}}  " + "  ".join(
            geomean_text(per_round[n][r].values() if r < len(per_round[n]) else (), 10)
            for n in builds))
    summary = "\n".join(lines)
    (out_dir / "summary.txt").write_text(summary + "\n")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", required=True, help="NAME=KERNELS_DIR[@LIB]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timing-only", action="append", default=[],
                    help="a build whose results are knowingly wrong: never checked")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per process")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("harness_args", nargs=argparse.REMAINDER,
                    help="after --: compare_sdpa.py's arguments (cases, --lib, --no-fa4, ...)")
    args = ap.parse_args()
    builds = parse_builds(args.build)
    unknown = set(args.timing_only) - set(builds)
    if unknown:
        raise SystemExit(f"--timing-only {sorted(unknown)}: not among the builds {sorted(builds)}")
    passthrough = [a for a in args.harness_args if a != "--"]
    for reserved in ("--out", "--cache-dir"):
        if reserved in passthrough:
            raise SystemExit(f"{reserved} is this tool's to set (per build and round)")
    args.out.mkdir(parents=True, exist_ok=True)

    per_round = {name: [] for name in builds}  # [{cell: ratio}] a round
    ok = True
    for r in range(1, args.rounds + 1):
        order = list(builds) if r % 2 else list(reversed(builds))
        for name in order:
            run_dir = args.out / f"r{r}-{name}"
            kernels, library = builds[name]
            harness_args = list(passthrough)
            if library:
                if "--lib" in harness_args:
                    harness_args[harness_args.index("--lib") + 1] = library
                else:
                    harness_args += ["--lib", library]
            command = [sys.executable, str(HARNESS), *harness_args, "--out", str(run_dir),
                       "--cache-dir", str(args.out / f"cache-{name}")]
            if r > 1 or name in args.timing_only:
                command.append("--no-check")
            env = dict(os.environ, FLASHJIT_KERNELS_DIR=kernels)
            if library:
                env["FLASHJIT_LIBRARY"] = library
            log = args.out / f"r{r}-{name}.log"
            with log.open("w") as out:
                try:
                    rc = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            ratios, failed = flashjit_ratios(run_dir / "results.json")
            per_round[name].append(ratios)
            status = "FAILED CHECK" if failed else f"rc {rc}"
            ok &= not failed and rc in (0, 1) and bool(ratios)
            print(f"round {r} {name}: x yardstick {geomean_text(ratios.values())} over "
                  f"{len(ratios)} cells ({status}; {log.name})", flush=True)
            # After every process: a call cut short by its time limit keeps what did run.
            write_summary(builds, per_round, args.rounds, args.out)

    print(write_summary(builds, per_round, args.rounds, args.out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
