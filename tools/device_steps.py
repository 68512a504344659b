#!/usr/bin/env python3
"""Runs named steps of a GPU-machine call against one time budget, then packs what they wrote.

    python3 tools/device_steps.py --budget 560 --out "$OUT" \\
        --step 'softcap:100:.devpack/flashjit_gpu_tests -sf=*test_softcap*' \\
        --step 'alibi:40:python3 tools/bench_variants.py --lib .devpack/libflashjit.so.0 --only causal alibi --out {dir}'

Each step is NAME:SECONDS:COMMAND (a shell command; {dir} becomes a folder of its own under
--out). A step runs for at most SECONDS or what is left of the budget, whichever is less; a
step with less than --min-seconds left is skipped and says so. Its output goes to NAME.txt; the
step's line here gives its exit status, its time, doctest's summary and failure lines, and the
lines matching --show. At the end every file under --out is packed into one all.tgz (a call
brings back at most 8 files), unless --no-pack.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

DOCTEST_LINES = re.compile(r"^\[doctest\] (test cases|assertions|Status)|ERROR:|FATAL|serialized")


def parse_step(text):
    name, sep1, rest = text.partition(":")
    seconds, sep2, command = rest.partition(":")
    if not (sep1 and sep2 and name and command and re.fullmatch(r"[A-Za-z0-9_.-]+", name)):
        raise SystemExit(f"--step {text!r}: expected NAME:SECONDS:COMMAND (NAME in letters, "
                         "digits, '.', '_', '-')")
    try:
        limit = float(seconds)
    except ValueError:
        raise SystemExit(f"--step {text!r}: SECONDS {seconds!r} is not a number") from None
    return name, limit, command


def summary_lines(log_text, show):
    lines = []
    for line in log_text.splitlines():
        if DOCTEST_LINES.search(line) or (show and show.search(line)):
            lines.append(line[:300])
    return lines[:12]


def pack(out):
    files = [p for p in sorted(out.rglob("*")) if p.is_file()]
    archive = out / "all.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(out)))
    for path in files:
        path.unlink()
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        folder.rmdir()
    return len(files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, required=True, help="seconds for all the steps")
    ap.add_argument("--out", type=Path, required=True, help="where the steps write ($OUT)")
    ap.add_argument("--step", action="append", default=[], help="NAME:SECONDS:COMMAND")
    ap.add_argument("--show", help="a regular expression: the step output lines to print")
    ap.add_argument("--min-seconds", type=float, default=20)
    ap.add_argument("--no-pack", action="store_true")
    args = ap.parse_args()
    steps = [parse_step(text) for text in args.step]
    if not steps:
        raise SystemExit("--step: give at least one")
    show = re.compile(args.show) if args.show else None
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    failed = False
    for name, limit, command in steps:
        left = deadline - time.monotonic()
        if left < args.min_seconds:
            print(f"== {name}: skipped ({left:.0f} s left)", flush=True)
            continue
        step_dir = args.out / name
        command = command.replace("{dir}", shlex.quote(str(step_dir)))
        log = args.out / f"{name}.txt"
        start = time.monotonic()
        with log.open("w") as stream:
            # A session of its own: a step past its time goes with everything it started.
            process = subprocess.Popen(command, shell=True, stdout=stream,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = process.wait(timeout=min(limit, left))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = "timeout"
        failed |= status != 0
        print(f"== {name}: {status if status == 'timeout' else f'rc {status}'}, "
              f"{time.monotonic() - start:.0f} s", flush=True)
        for line in summary_lines(log.read_text(errors="replace"), show):
            print(f"   {line}")
    if not args.no_pack:
        print(f"packed {pack(args.out)} files into {args.out / 'all.tgz'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
