"""No-GPU tests of the varlen cases, run by --selftest-report: synthetic varlen results through
the report, and, where torch is installed, a CPU rehearsal of run_varlen_case. Its engine is
flashjit_ctypes' Engine with the C calls replaced by torch, reading the very structs the binding
builds (pointers, strides, cu_seqlens, LSE and workspace pointers); FA4 is a torch stand-in with
flash-attn-4 4.0.0b36's signatures."""

import ctypes
import importlib.util
import random
import time
import types
from pathlib import Path

import flashjit_ctypes as fj

from .run_case import case_entry, impl_cell
from .run_varlen import add_ratios
from .selftest_kv import CpuTimer, on_cpu
from .varlen_backends import SDPA_REASON, impl_names
from .varlen_cases import VarlenCase


def synthetic_varlen_results(cases, families, seed=0):
    """Made-up cells for the report path: flashjit varlen at ~5 % of its dense rate (today's
    decode kernels), FA4 varlen near its dense rate; case 1 fails flashjit's varlen check and
    FA4 varlen refuses it."""
    rng = random.Random(seed)
    results = []
    for index, case in enumerate(cases):
        r = case_entry(index, case, impls={}, notes=[],
                       check={"checked": "per sequence: 21 of 32 heads, all rows (16 of 16)",
                              "dense_checked": "349 of 512 (batch, head) pairs, all rows"})
        rates = {"flashjit": 0.05, "flashjit_dense": 0.8, "fa4": 0.97, "fa4_dense": 1.0}
        for name in impl_names(case, families) + ["fa4", "fa4_dense"]:
            if name == "fa4" and index == 1:
                r["impls"][name] = impl_cell("n/a", reason="synthetic refusal")
                continue
            flops = case.dense_flops() if name.endswith("_dense") else case.flops()
            tflops = 600.0 * rates.get(name, 0.04) * rng.uniform(0.95, 1.05)
            us = flops / (tflops * 1e12) * 1e6
            fail = index == 1 and name == "flashjit"
            ours = name.startswith("flashjit")
            cell = impl_cell("ok", median_us=us, reps=20, calls_per_rep=1, tflops=tflops,
                             check={"rel_err": 0.05 if fail else 3e-3, "max_abs_err": 1e-2,
                                    "nonfinite": 0, "pass": not fail,
                                    "lse_max_abs_err": 1e-6 if ours else None})
            if name.endswith("_dense") and ours:
                cell["variant"] = f"wgmma.sm90a.{case.dtype}.d{case.head_dim}.m128n128s2.causal"
            elif ours:
                cell["variant"] = f"decode.sm90a.{case.dtype}.d{case.head_dim}.m16n64s3"
            else:
                cell["how"] = ("flash_attn_func on the dense twin, pack_gqa auto, causal"
                               if name == "fa4_dense" else "flash_attn_varlen_func("
                               "cu_seqlens_q/k, max_seqlen_q/k), pack_gqa auto, causal")
            r["impls"][name] = cell
        r["impls"]["sdpa"] = impl_cell("n/a", reason=SDPA_REASON)
        add_ratios(r)
        results.append(r)
    return results


# --- CPU rehearsal ------------------------------------------------------------------------

def _attend(q, k, v, scale, causal):
    """fp32 attention of one sequence: q [s_q, h_q, d], k, v [s_k, h_kv, d] -> (out [s_q,
    h_q, d], lse [h_q, s_q]), bottom-right causal."""
    import torch
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k, v))
    kf, vf = kf.repeat_interleave(group, 0), vf.repeat_interleave(group, 0)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        i, j = torch.arange(sq).unsqueeze(1), torch.arange(sk).unsqueeze(0)
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return (torch.softmax(s, -1) @ vf).transpose(0, 1), torch.logsumexp(s, -1)


def _at(address, shape, stride, dtype):
    """A CPU torch tensor over memory at `address` (what a device kernel would see)."""
    import torch
    size = torch.empty(0, dtype=dtype).element_size()
    n = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
    flat = torch.frombuffer((ctypes.c_uint8 * (n * size)).from_address(address), dtype=dtype)
    return flat.as_strided(tuple(shape), tuple(stride))


def _tensor(view):
    import torch
    dtype = {fj.BF16: torch.bfloat16, fj.FP16: torch.float16}[view.dtype]
    return _at(view.data, list(view.shape), list(view.stride), dtype)


def _address(pointer):
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


class _Owner:
    path = "(torch stand-in)"

    def __init__(self, has_varlen):
        self.has_varlen = has_varlen

    def check_family(self, family):
        pass

    def has_function(self, name):
        return self.has_varlen


class TorchVarlenEngine(fj.Engine):
    """fj.Engine whose C calls are torch on the CPU; varlen_args, options and the structs are
    the binding's own. Family 'broken' leaves sequence 0 unwritten, 'packed' ignores cu_seqlens
    (one causal sequence over the whole batch): both must fail the per-sequence check."""

    def __init__(self, has_varlen=True):
        self.owner, self.lib, self.handle = _Owner(has_varlen), None, None
        self.record_path, self.recorded, self.problems = None, set(), []

    def close(self):
        pass

    def select_variant(self, q, k, v, out, causal=False, softmax_scale=0.0, lse=None,
                       family=None, tiles=None):
        return "torch.cpu.dense" + (".causal" if causal else "")

    def record_variants(self, manifest_path):
        self.record_path, self.recorded = Path(manifest_path), set()

    def _record(self, name):
        if self.record_path and name not in self.recorded:
            self.recorded.add(name)
            new = not self.record_path.exists()
            with self.record_path.open("a") as f:
                f.write(("# flashjit variant manifest\n" if new else "") + name + "\n")

    def forward_raw(self, q, k, v, out, options, stream=None):
        import torch
        self._record("torch.cpu.dense")
        qt, kt, vt, ot = (_tensor(t) for t in (q, k, v, out))
        b, s, h = qt.shape[:3]
        lse = _at(_address(options.lse), (b, h, s), (h * s, s, 1), torch.float32)
        for i in range(b):
            o, l = _attend(qt[i], kt[i], vt[i], options.softmax_scale, bool(options.causal))
            ot[i], lse[i] = o.to(ot.dtype), l

    def workspace_bytes_varlen_raw(self, q, kv, out, varlen, options):
        return 4096

    def forward_varlen_raw(self, q, kv, out, varlen, options, stream=None):
        import torch
        family = (options.family or b"").decode()
        self._record(f"{family or 'torch'}.cpu.varlen")
        n = varlen.batch
        cu_q = [varlen.cu_seqlens_q[i] for i in range(n + 1)]
        cu_k = [varlen.cu_seqlens_k[i] for i in range(n + 1)]
        lengths = [b - a for a, b in zip(cu_q, cu_q[1:])]
        qt, kt, vt, ot = (_tensor(t) for t in (q, kv.k, kv.v, out))
        if cu_q != cu_k or max(lengths) > varlen.max_seqlen_q or kv.page_table \
                or cu_q[-1] != qt.shape[1] or options.workspace_bytes < 4096 \
                or not options.workspace:
            self.problems.append(f"forward_varlen got cu_seqlens {cu_q} / {cu_k}, max "
                                 f"{varlen.max_seqlen_q}, total {qt.shape[1]}, workspace "
                                 f"{options.workspace_bytes} bytes")
        h, total = qt.shape[2], qt.shape[1]
        lse = _at(_address(options.lse), (h, total), (total, 1), torch.float32)
        spans = [(0, total)] if family == "packed" else list(zip(cu_q, cu_q[1:]))
        for i, (a, b) in enumerate(spans):
            if family == "broken" and i == 0:
                continue
            o, l = _attend(qt[0, a:b], kt[0, a:b], vt[0, a:b], options.softmax_scale,
                           bool(options.causal))
            ot[0, a:b], lse[:, a:b] = o.to(ot.dtype), l


def fake_fa4(old_varlen=False):
    """A torch stand-in for flash_attn.cute with flash-attn-4 4.0.0b36's parameters (old_varlen:
    a varlen function without cu_seqlens_k / max_seqlen_k, whose runner must say n/a)."""
    import torch
    mod = types.ModuleType("flash_attn.cute")

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None),
                        learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                        score_mod=None, mask_mod=None, return_lse=False):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
        for i in range(q.shape[0]):
            o, lse[i] = _attend(q[i], k[i], v[i], softmax_scale, causal)
            out[i] = o.to(q.dtype)
        return out, lse

    def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                               max_seqlen_q=None, max_seqlen_k=None, min_seqlen_k=None,
                               seqused_q=None, seqused_k=None, page_table=None,
                               softmax_scale=None, causal=False, window_size=(None, None),
                               return_lse=False):
        out, cu = torch.empty_like(q), cu_seqlens_q.tolist()
        assert cu == cu_seqlens_k.tolist() and q.dim() == 3
        for a, b in zip(cu, cu[1:]):
            out[a:b] = _attend(q[a:b], k[a:b], v[a:b], softmax_scale, causal)[0].to(q.dtype)
        return out, None

    def old_varlen_func(q, k, v, cu_seqlens_q=None, max_seqlen_q=None, softmax_scale=None,
                        causal=False):
        raise AssertionError("the signature check should have stopped this call")
    mod.flash_attn_func = flash_attn_func
    mod.flash_attn_varlen_func = old_varlen_func if old_varlen else flash_attn_varlen_func
    mod.flash_attn_varlen_func.__name__ = "flash_attn_varlen_func"
    return mod


def rehearsal_cases():
    """GQA causal bf16 (checked whole), MHA non-causal fp16 (--check-budget 100k: sampled)."""
    return [VarlenCase((5, 17, 33, 64), 4, 2, 32, True, "bf16"),
            VarlenCase((100, 300, 200), 4, 4, 64, False, "fp16")]


def varlen_rehearsal(args, out):
    """run_cases over rehearsal_cases on the CPU: (ok, varlen entries, message). ok means: the
    torch engine and FA4 stand-in pass, dense and varlen; 'broken' fails with non-finite rows,
    'packed' fails without; the varlen variant comes from the engine's record; every ok cell
    is timed with its ratios; an old build is n/a ('no varlen API'); an FA4 without
    cu_seqlens_k is n/a naming what it lacks."""
    if importlib.util.find_spec("torch") is None:
        return None, [], "varlen CPU rehearsal: skipped (torch not installed)"
    from .run_all import run_cases
    from .run_varlen import run_varlen_case
    from .varlen_backends import Fa4VarlenRunner, VarlenInputs, varlen_variant_picks
    problems = []
    with on_cpu(fake_fa4()):
        engine, cases, families = TorchVarlenEngine(), rehearsal_cases(), ["auto", "broken",
                                                                           "packed"]
        run_args = _RehearsalArgs(args, cases)
        ctx = {"args": run_args, "engine": engine, "families": families, "timer": CpuTimer(),
               "deadline": time.monotonic() + 120,
               "variants": {c.key(): varlen_variant_picks(engine, c, families) for c in cases}}
        _, _, entries, _ = run_cases(ctx, out, None, {"cases": []})
        problems += engine.problems
        old = TorchVarlenEngine(has_varlen=False)
        ctx_old = dict(ctx, engine=old, families=["auto"],
                       variants={cases[0].key(): varlen_variant_picks(old, cases[0], ["auto"])})
        ctx_old["args"] = _RehearsalArgs(args, cases[:1], no_time=True)
        old_entry = run_varlen_case(0, cases[0], ctx_old)
        stale = Fa4VarlenRunner(cases[0], VarlenInputs(cases[0], 0), 0.1, module=fake_fa4(True))
    problems += _verify(entries)
    old_cell = old_entry["impls"].get("flashjit", {})
    if old_cell.get("status_name") != "no varlen API" or \
            old_entry["impls"]["flashjit_dense"]["check"]["pass"] is not True:
        problems.append(f"old build: flashjit cell {old_cell}")
    if not stale.error or "lacks cu_seqlens_k, max_seqlen_k" not in stale.error:
        problems.append(f"FA4 without cu_seqlens_k: error {stale.error!r}")
    if problems:
        return False, entries, "varlen CPU rehearsal FAILED: " + "; ".join(problems)
    return True, entries, (f"varlen CPU rehearsal: {len(entries)} varlen cases through "
                           "run_varlen_case with a torch engine on the binding's structs and a "
                           "torch FA4: per-sequence checks, poisoning, cross-sequence leak "
                           "caught, variant record, bursts, ratios, old-build and old-FA4 n/a ok")


def _verify(entries):
    problems = []
    for r in entries:
        cells, i = r["impls"], r["index"]
        if r.get("error"):
            problems.append(f"case {i} crashed: {r['error']}")
            continue
        for name, cell in cells.items():
            if name == "sdpa":
                continue
            chk = cell.get("check") or {}
            want = name not in ("flashjit.broken", "flashjit.packed")
            if cell["status"] != "ok" or chk.get("pass") != want:
                problems.append(f"case {i} {name}: {cell['status']}, check pass="
                                f"{chk.get('pass')} (rel {chk.get('rel_err')})")
            if cell.get("median_us") is None:
                problems.append(f"case {i} {name}: not timed")
        if cells["flashjit.broken"]["check"]["nonfinite"] == 0:
            problems.append(f"case {i}: the poisoned sequence was not seen as non-finite")
        if cells["flashjit.packed"]["check"]["nonfinite"] != 0:
            problems.append(f"case {i}: the cross-sequence leak left non-finite rows")
        if cells["flashjit"].get("variant") != "torch.cpu.varlen":
            problems.append(f"case {i}: varlen variant {cells['flashjit'].get('variant')!r}")
        for name in ("flashjit", "fa4"):
            if not cells[name].get("rate_vs_dense"):
                problems.append(f"case {i} {name}: no rate against its dense call")
        if not cells["flashjit"].get("ratio_peer") or \
                not cells["flashjit_dense"].get("ratio_peer"):
            problems.append(f"case {i}: no flashjit/FA4 ratios")
        sampled = r["check"]["checked"].startswith("per sequence:")
        if sampled != (i == 1):
            problems.append(f"case {i}: checked {r['check']['checked']!r}")
    return problems


class _RehearsalArgs:
    def __init__(self, args, cases, no_time=False):
        self.__dict__.update(vars(args))
        self.cases = cases
        self.reps, self.min_reps, self.warmup, self.min_calls = 3, 1, 1, 2
        self.no_check, self.no_time, self.check_budget = False, no_time, 100_000
        self.num_splits = 0
