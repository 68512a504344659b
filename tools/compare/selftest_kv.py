"""No-GPU tests of the KV cases, run by --selftest-report: the binding's struct layouts against
flashjit.h (a C compiler prints offsetof/sizeof), synthetic KV results through the report, and,
where torch is installed, a CPU rehearsal of run_kv_case with a torch stand-in for the engine
(paged and dense inputs, poisoning, the reference check, bursts, ratios, results.json)."""

import contextlib
import ctypes
import importlib.util
import random
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import flashjit_ctypes as fj

from . import gpu
from .decode_cases import KvCase
from .run_case import case_entry, impl_cell
from .run_decode import add_ratios

STRUCTS = {"flashjit_tensor": fj.FlashjitTensor,
           "flashjit_forward_options": fj.FlashjitForwardOptions,
           "flashjit_kv_cache": fj.FlashjitKvCache,
           "flashjit_varlen": fj.FlashjitVarlen,
           "flashjit_backward_options": fj.FlashjitBackwardOptions}


@contextlib.contextmanager
def on_cpu(fa4_module=None):
    """Inside: gpu.DEVICE and gpu.sync set for a CPU run and, when given, fa4_module standing in
    for flash_attn.cute; all restored on the way out."""
    names = ("flash_attn", "flash_attn.cute")
    saved = gpu.DEVICE, gpu.sync, {name: sys.modules.get(name) for name in names}
    gpu.DEVICE, gpu.sync = "cpu", lambda: None
    if fa4_module is not None:
        package = types.ModuleType("flash_attn")
        package.cute = sys.modules["flash_attn.cute"] = fa4_module
        sys.modules["flash_attn"] = package
    try:
        yield
    finally:
        gpu.DEVICE, gpu.sync = saved[:2]
        for name, module in saved[2].items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def check_binding_layout(include_dir):
    """(ok or None when no C compiler, message): every ctypes field's offset and size, and each
    struct's size, against what the C compiler makes of include/flashjit/flashjit.h."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None, "binding layout: skipped (no C compiler)"
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "flashjit/flashjit.h"',
             "int main(void) {"]
    expected = []
    for c_name, struct in STRUCTS.items():
        lines.append(f'  printf("%zu\\n", sizeof({c_name}));')
        expected.append((f"sizeof({c_name})", ctypes.sizeof(struct)))
        for field, _ in struct._fields_:
            lines.append(f'  printf("%zu %zu\\n", offsetof({c_name}, {field}), '
                         f"sizeof((({c_name}*)0)->{field}));")
            f = getattr(struct, field)
            expected.append((f"{c_name}.{field}", f"{f.offset} {f.size}"))
    lines.append("  return 0;\n}")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "layout.c", Path(tmp) / "layout"
        src.write_text("\n".join(lines) + "\n")
        build = subprocess.run([cc, "-I", str(include_dir), str(src), "-o", str(exe)],
                               capture_output=True, text=True)
        if build.returncode:
            return False, f"binding layout: {cc} failed: {build.stderr.strip()[:400]}"
        got = subprocess.run([str(exe)], capture_output=True, text=True).stdout.split("\n")
    wrong = [f"{what}: C {c!r}, ctypes {str(py)!r}" for (what, py), c in zip(expected, got)
             if c.strip() != str(py)]
    if wrong:
        return False, "binding layout MISMATCH: " + "; ".join(wrong)
    return True, (f"binding layout: {len(expected)} sizes and offsets of "
                  f"{', '.join(STRUCTS)} match flashjit.h ({Path(cc).name})")


def synthetic_kv_results(cases, seed=0):
    """Made-up cells for the report path; case 1 fails flashjit's check, SDPA flash refuses
    the causal cases, FA4 refuses HND pages."""
    rng = random.Random(seed)
    results = []
    for index, case in enumerate(cases):
        r = case_entry(index, case, impls={}, notes=[], hbm_tbs=4.8,
                       hbm_floor_us=case.hbm_floor_us(4.8),
                       check={"checked": "all heads, all rows"})
        floor = case.hbm_floor_us(4.8)
        names = ["flashjit"] + (["flashjit_dense", "flashjit_seqused", "fa4"] if case.paged
                                else ["sdpa_cudnn", "sdpa_flash", "fa4"])
        compute_us = case.flops() / 600e12 * 1e6  # chunked prefill is compute-bound
        for name in names:
            refused = (name == "sdpa_flash" and case.causal) or (
                name == "fa4" and case.paged and case.kv_layout == "hnd")
            if refused:
                r["impls"][name] = impl_cell("n/a", reason="synthetic refusal")
                continue
            us = max(floor, compute_us) / rng.uniform(0.6 if name.startswith("sdpa") else 0.8,
                                                      0.97)
            fail = index == 1 and name == "flashjit"
            ours = name.startswith("flashjit")
            paged = ".paged" if case.paged and name != "flashjit_dense" else ""
            r["impls"][name] = impl_cell(
                "ok", median_us=us, reps=20, calls_per_rep=10, tbs=case.kv_bytes() / us / 1e6,
                hbm_fraction=floor / us, tflops=case.flops() / us / 1e6,
                check={"rel_err": 0.05 if fail else 3e-3, "max_abs_err": 1e-2, "nonfinite": 0,
                       "pass": not fail, "lse_max_abs_err": 1e-6 if ours else None},
                **({"variant": f"decode.sm90a.bf16.d128.m16n64s3{paged}", "num_splits": 4}
                   if ours else {"how": "synthetic"}))
        add_ratios(r, case)
        results.append(r)
    return results


# --- CPU rehearsal: the real KV path with torch standing in for the GPU and the engine -------

class _FakeKv:
    def __init__(self, k, v, page_table, seqused_k, lse):
        self.k, self.v, self.page_table, self.seqused_k, self.lse = k, v, page_table, seqused_k, lse


class TorchEngine:
    """flashjit's engine as FlashjitKvRunner and kv_variant_picks use it, computed with torch
    on the CPU. Family 'broken' leaves batch 0 unwritten (the check must catch it)."""

    def options(self, causal=False, softmax_scale=0.0, lse=None, family=None, tiles=None,
                num_splits=0, workspace=None, workspace_bytes=0):
        o = fj.FlashjitForwardOptions()
        o.causal, o.softmax_scale, o.num_splits = int(causal), softmax_scale, num_splits
        o.family = family.encode() if family else None
        return o

    def kv_args(self, q, k, v, out, page_table=None, seqused_k=None, causal=False,
                softmax_scale=0.0, lse=None, family=None, tiles=None, num_splits=0):
        return q, _FakeKv(k, v, page_table, seqused_k, lse), out, self.options(
            causal, softmax_scale, None, family, num_splits=num_splits)

    def workspace_bytes_raw(self, q, kv, out, options):
        return 4096, 2

    def select_variant_kv_raw(self, q, kv, out, options):
        family = (options.family or b"torch").decode()
        return f"{family}.cpu" + (".paged" if kv.page_table is not None else "")

    def forward_kv_raw(self, q, kv, out, options, stream=None):
        import torch
        k, v = kv.k, kv.v
        if kv.page_table is not None:  # sequence b, key j: page page_table[b, j // page]
            b, pages = kv.page_table.shape
            k, v = (t[kv.page_table.long()].reshape(b, pages * t.shape[1], *t.shape[2:])
                    for t in (k, v))
        group = q.shape[2] // k.shape[2]
        qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
        kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
        s = qf @ kf.transpose(-1, -2) * options.softmax_scale
        if options.causal:
            sq, sk = s.shape[-2:]
            i, j = torch.arange(sq).unsqueeze(1), torch.arange(sk).unsqueeze(0)
            s = s.masked_fill(j > i + sk - sq, float("-inf"))
        first = 1 if options.family == b"broken" else 0
        out[first:] = (torch.softmax(s, -1) @ vf).transpose(1, 2)[first:].to(out.dtype)
        kv.lse[first:] = torch.logsumexp(s, -1)[first:]


class CpuTimer:
    """The rehearsals' timer: wall time of the call on the CPU, no spin."""

    spin_cycles = 0

    def cycles_for(self, ms):
        return 0

    def launch(self, fn, spin_cycles=None):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        return t0, t1, (t1 - t0) * 1e3

    @staticmethod
    def elapsed_ms(handle):
        return (handle[1] - handle[0]) * 1e3


def rehearsal_cases():
    return [KvCase(2, 8, 2, 1, 256, 64, False, "bf16", 16, "nhd", "paged"),
            KvCase(2, 8, 2, 3, 256, 64, True, "bf16", 32, "hnd", "paged"),
            KvCase(2, 8, 2, 4, 512, 64, True, "bf16", 0, "nhd", "decode"),
            KvCase(3, 8, 2, 1, 384, 64, False, "bf16", 0, "nhd", "decode")]


def cpu_rehearsal(args):
    """run_cases over rehearsal_cases on the CPU; (ok, kv entries, message). ok means: the
    torch engine passes, 'broken' fails with non-finite outputs, pages match the dense keys,
    SDPA and FA4 are n/a here, and every timed cell has a median."""
    if importlib.util.find_spec("torch") is None:
        return None, [], "CPU rehearsal: skipped (torch not installed)"
    from .decode_backends import kv_variant_picks
    from .run_all import run_cases
    with on_cpu():
        engine, cases = TorchEngine(), rehearsal_cases()
        families = ["auto", "broken"]
        run_args = _RehearsalArgs(args, cases)
        ctx = {"args": run_args, "engine": engine, "families": families, "timer": CpuTimer(),
               "deadline": time.monotonic() + 120,
               "variants": {c.key(): kv_variant_picks(engine, c, families) for c in cases}}
        _, kv, _, _ = run_cases(ctx, args.rehearsal_out, None, {"cases": []})
    problems = []
    for r in kv:
        cells = r["impls"]
        if r.get("error"):
            problems.append(f"case {r['index']} crashed: {r['error']}")
            continue
        for name, cell in cells.items():
            want_pass = name != "flashjit.broken"
            if name.startswith("flashjit") and cell["check"]["pass"] != want_pass:
                chk = cell["check"]
                problems.append(f"case {r['index']} {name}: check pass={chk['pass']} (rel "
                                f"{chk['rel_err']:.1e}, {chk['nonfinite']} non-finite)")
            if name.startswith("flashjit") and cell.get("median_us") is None:
                problems.append(f"case {r['index']} {name}: not timed")
        if cells["flashjit.broken"]["check"]["nonfinite"] == 0:
            problems.append(f"case {r['index']}: the poisoned row was not seen as non-finite")
        if r["check"].get("pages_match_dense") is False:
            problems.append(f"case {r['index']}: pages differ from the dense keys")
        gpu_only = ("fa4",) if r["page_size"] else ("fa4", "sdpa_cudnn")
        if any(cells[p]["status"] != "n/a" for p in gpu_only):
            problems.append(f"case {r['index']}: a GPU peer ran on the CPU")
    if problems:
        return False, kv, "CPU rehearsal FAILED: " + "; ".join(problems)
    return True, kv, (f"CPU rehearsal: {len(kv)} KV cases (paged NHD and HND, dense) "
                      "through run_kv_case with a torch engine: checks, poisoning, bursts ok")


class _RehearsalArgs:
    def __init__(self, args, cases):
        self.__dict__.update(vars(args))
        self.cases = cases
        self.reps, self.min_reps, self.warmup, self.min_calls = 3, 1, 1, 2
        self.no_check = self.no_time = False
