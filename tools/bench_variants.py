#!/usr/bin/env python3
"""Attention variants side by side: flashjit, FlashAttention-4 and FlexAttention (torch.compile)
on one long sequence, each variant against the same kernel without it (issue 14's speed targets).

    python3 tools/bench_variants.py --lib .devpack/s8/libflashjit.so.0 --fa4 --flex \
        --seqlen 32768 --heads 32 --head-dim 128 --window 4096 --softcap 30 --out $OUT/variants

--lib PATH, or NAME=PATH repeated: flashjit builds to compare in the same run (backend
"flashjit" or "flashjit NAME"); --tiles NAME=MxNxS runs that entry with a forced tile shape
(ForwardOptions::tiles) on every variant, so one library can be compared with itself at two
shapes. Variants (all causal, bottom-right, bf16, BSHD): plain; a
sliding window of --window keys back (window_left = --window, so a row sees window + 1 keys);
soft-capping at --softcap; learnable sinks (one logit per head); ALiBi (FlashAttention's slopes
2^(-8(h+1)/H)); StreamingLLM (the window plus its first --sink-tokens keys). cuDNN (SDPA) runs the plain
variant as the usual yardstick. User functions (CUDA C score_mod / mask_mod, flashjit.UserFunctions)
against FlexAttention's Python ones: a causal mask over --documents documents of random lengths
(document ids from a tensor; flashjit with a block mask, FlexAttention with its BlockMask); a
prefix-LM mask (bidirectional over the first --prefix keys, causal after; the prefix length per
sequence from a tensor); a relative-position bias from a table [heads, 2 --max-distance + 1]
(score + bias[h][clamp(q - kv) + max_distance]), causal. Every output is checked before it is
timed against a float32 reference on a sample of query rows (the first --check-rows, as many past
the window's first rows, and the last ones), with the variant's mask, cap, sinks and user
functions applied, as an error relative to the reference's largest value; the user-function
cases also against FlexAttention's output (--flex). Timing as in the grids: one call (or a burst of back-to-back calls
covering 2 ms) between two CUDA events after a spin that covers its enqueue, repetitions
interleaved round-robin over every backend and variant, medians compared. TFLOPS count only the
(query, key) pairs a variant lets through; for the window the report also gives its time against
the ideal: the plain kernel's time times the fraction of pairs the window keeps.
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import flashjit_ctypes as fj  # noqa: E402
from compare import gpu  # noqa: E402
from compare.fa4 import load_fa4, refusal  # noqa: E402
from compare.family_spec import tile_shape  # noqa: E402
from compare.timing import DEFAULT_SPIN_MS, CudaTimer, burst, enqueue_spins, round_robin  # noqa: E402


def visible_pairs(seqlen, window, sink_tokens=0):
    """(query, key) pairs a causal row set of `seqlen` sees, with window_left `window` (-1: none)
    and the first `sink_tokens` keys kept left of each row's window."""
    if window < 0 or window + 1 >= seqlen:
        return seqlen * (seqlen + 1) // 2
    w = window + 1  # keys a row sees once past the first window rows
    band = w * (w + 1) // 2 + (seqlen - w) * w
    # Row i's window starts at key i - window: sink keys below that are extra.
    return band + sum(min(sink_tokens, i - window) for i in range(window + 1, seqlen))


def reference_rows(q, k, v, rows, scale, variant):
    """float32 attention of query rows `rows` (a 1-D index tensor) over all keys, masked causal
    (and by the window, but for its sink tokens; the prefix-LM's prefix seen by every row; other
    documents' keys hidden), scores capped first, then ALiBi's bias or the relative-position
    table's, a sink logit per head (sinks [h]) in each row's denominator: [len(rows), h, d]."""
    import torch
    qs = q[0, rows].float().transpose(0, 1)                 # [h, r, d]
    ks, vs = k[0].float().transpose(0, 1), v[0].float().transpose(0, 1)  # [h, s, d]
    scores = torch.matmul(qs, ks.transpose(1, 2)) * scale   # [h, r, s]
    if variant.softcap > 0:
        scores = variant.softcap * torch.tanh(scores / variant.softcap)
    keys = torch.arange(k.shape[1], device=q.device)
    if variant.alibi is not None:  # causal: |i - j| = i - j for every visible key
        distance = (rows[:, None] - keys[None, :]).abs().float()
        scores = scores - variant.alibi.float()[:, None, None] * distance[None]
    if variant.bias_table is not None:
        m = variant.max_distance
        scores = scores + variant.bias_table[:, (rows[:, None] - keys[None, :]).clamp(-m, m) + m]
    visible = keys[None, :] <= rows[:, None]
    if variant.prefix is not None:
        visible |= keys[None, :] < variant.prefix[0]
    if variant.documents is not None:
        visible &= variant.documents[keys][None, :] == variant.documents[rows][:, None]
    if variant.window >= 0:
        visible &= (keys[None, :] >= rows[:, None] - variant.window) | \
            (keys[None, :] < variant.sink_tokens)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    if variant.sinks is not None:  # one more column per row, with no value
        column = variant.sinks.float()[:, None, None].expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vs).transpose(0, 1)


class Variant:
    """One row of the report. User-function cases: documents (int32 [s] document ids), prefix
    (int32 [batch] prefix lengths) or bias_table (fp32 [h, 2 max_distance + 1]), each held by
    flashjit's user_args and by FlexAttention's closures; `pairs` the (query, key) pairs it
    lets through when the window's formula does not count them."""

    def __init__(self, name, window=-1, softcap=0.0, sinks=None, alibi=None, sink_tokens=0,
                 documents=None, prefix=None, bias_table=None, max_distance=0, pairs=None):
        self.name, self.window, self.softcap, self.sinks = name, window, softcap, sinks
        self.alibi, self.sink_tokens = alibi, sink_tokens
        self.documents, self.prefix, self.bias_table = documents, prefix, bias_table
        self.max_distance, self.pairs = max_distance, pairs
        self.causal = prefix is None  # the prefix-LM's mask_mod is causal past the prefix

    def user_functions(self):
        """(score_mod, mask_mod, user_args) of flashjit's CUDA C, or None."""
        if self.documents is not None:
            return None, DOCUMENT_MASK, [self.documents]
        if self.prefix is not None:
            return None, PREFIX_LM_MASK, [self.prefix]
        if self.bias_table is not None:
            return RELATIVE_BIAS.format(m=self.max_distance, width=2 * self.max_distance + 1), \
                None, [self.bias_table]
        return None


DOCUMENT_MASK = """
__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {
  const int* doc = static_cast<const int*>(a.ptr[0]);
  return doc[q] == doc[k];
}"""
PREFIX_LM_MASK = """
__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {
  return k <= q || k < static_cast<const int*>(a.ptr[0])[b];
}"""
RELATIVE_BIAS = """
__device__ float score_mod(float score, int b, int h, int q, int k, const flashjit::UserArgs& a) {{
  const int d = min(max(q - k, -{m}), {m});
  return score + static_cast<const float*>(a.ptr[0])[h * {width} + d + {m}];
}}"""


def document_ids(seqlen, count, seed):
    """int32 [seqlen] ids of `count` documents of random lengths (each at least one token)."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(seqlen - 1, generator=generator)[:count - 1].sort().values + 1
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([seqlen])]))
    return torch.repeat_interleave(torch.arange(count), lengths).to(torch.int32).cuda(), lengths


def backend_name(lib_name):
    """The report's backend for a --lib entry NAME=PATH (NAME may be empty)."""
    return "flashjit" + (f" {lib_name}" if lib_name else "")


def flashjit_runner(engine, q, k, v, scale, variant, tiles=None):
    import torch
    out = torch.empty_like(q)
    views = [fj.tensor_from_torch(t) for t in (q, k, v, out)]
    user, keep = variant.user_functions(), []
    if user is not None:
        score_mod, mask_mod, user_args = user
        keep.append(engine.owner.user_functions(score_mod, mask_mod))
        user = dict(user_functions=keep[0], user_args=user_args)
    options = engine.options(variant.causal, scale, None, None, tiles, softcap=variant.softcap,
                             window=(variant.window, 0) if variant.window >= 0 else (-1, -1),
                             sink=variant.sinks, alibi=variant.alibi,
                             sink_tokens=variant.sink_tokens, **(user or {}))
    stream = torch.cuda.current_stream().cuda_stream
    if user is not None and mask_mod is not None:  # the tiles the mask hides are not visited
        keep.append(engine.create_block_mask_raw(*views, options, stream=stream))
        options.block_mask = keep[-1].pointer

    def call():
        engine.forward_raw(*views, options, stream)
    # The views and options hold raw pointers: what they point to lives as long as the call.
    call.keep = keep + [out]
    call()
    gpu.sync()
    return call, out


def fa4_runner(module, q, k, v, scale, variant):
    if variant.alibi is not None or variant.sink_tokens or variant.user_functions():
        raise ValueError("no ALiBi, sink tokens or user functions in FA4's interface here (a "
                         "CuTe-DSL score_mod / mask_mod could)")
    kwargs = dict(softmax_scale=scale, causal=True)
    if variant.window >= 0:
        kwargs["window_size"] = (variant.window, 0)
    if variant.softcap:
        kwargs["softcap"] = variant.softcap
    if variant.sinks is not None:
        kwargs["learnable_sink"] = variant.sinks
    result = {}

    def call():
        result["out"] = module.flash_attn_func(q, k, v, **kwargs)[0]
    call()
    gpu.sync()
    return call, result["out"]


def flex_runner(q, k, v, scale, variant):
    """FlexAttention compiled (torch.compile), on contiguous [b, h, s, d] copies made here."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    window, sink_tokens = variant.window, variant.sink_tokens
    documents, prefix = variant.documents, variant.prefix

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= q_idx
        if prefix is not None:
            keep = keep | (kv_idx < prefix[b])
        if documents is not None:
            keep = keep & (documents[q_idx] == documents[kv_idx])
        if window >= 0:
            keep = keep & ((q_idx - kv_idx <= window) | (kv_idx < sink_tokens))
        return keep
    block_mask = create_block_mask(mask_mod, None, None, q.shape[1], k.shape[1], device="cuda")
    cap, slopes, table, m = variant.softcap, variant.alibi, variant.bias_table, variant.max_distance

    def capped(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    # The table by distance, gathered once for every q - kv in (-seqlen, seqlen): PyTorch 2.11's
    # Inductor fails to lower a clamp inside score_mod ('ShapeAsConstantBuffer' has no dtype).
    span = q.shape[1]
    by_distance = None if table is None else table[:, (torch.arange(
        -span, span, device=table.device).clamp(-m, m) + m)].contiguous()

    def relative(score, b, h, q_idx, kv_idx):
        return score + by_distance[h, q_idx - kv_idx + span]
    score_mod = capped if cap else (alibi if slopes is not None else
                                    relative if table is not None else None)
    compiled = torch.compile(flex_attention, fullgraph=True)
    result = {}

    def call():
        result["out"] = compiled(qt, kt, vt, score_mod=score_mod, block_mask=block_mask,
                                 scale=scale)
    call()
    gpu.sync()
    return call, result


def sdpa_cudnn_runner(q, k, v, scale):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    result = {}

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            result["out"] = torch.nn.functional.scaled_dot_product_attention(
                qt, kt, vt, is_causal=True, scale=scale)
    call()
    gpu.sync()
    return call, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", action="append", required=True, help="PATH or NAME=PATH")
    parser.add_argument("--tiles", action="append", default=[], metavar="NAME=MxNxS",
                        help="force the tile shape of the --lib entry NAME")
    parser.add_argument("--fa4", action="store_true")
    parser.add_argument("--flex", action="store_true")
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--softcap", type=float, default=30.0)
    parser.add_argument("--sink-tokens", type=int, default=4,
                        help="StreamingLLM's first keys kept with the window")
    parser.add_argument("--documents", type=int, default=16,
                        help="documents in the sequence of the document-mask case")
    parser.add_argument("--prefix", type=int, default=8192,
                        help="keys every row sees in the prefix-LM case")
    parser.add_argument("--max-distance", type=int, default=128,
                        help="the relative-position bias table's reach")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--check-rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--only", nargs="+", metavar="WORD",
                        help="run only the variants whose name starts with one of these words "
                             "(causal, window, softcap, sinks, alibi, streaming, documents, "
                             "prefix-LM, rel-bias)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tiles = {}  # backend -> (tile_m, tile_n, stages), checked before any GPU work
    names = {text.rpartition("=")[0] for text in args.lib}
    for text in args.tiles:
        name, _, shape = text.partition("=")
        forced = tile_shape(shape)
        if name not in names or forced is None:
            parser.error(f"--tiles {text!r}: expected NAME=MxNxS, NAME a --lib entry's, e.g. "
                         "t128=128x128x2")
        tiles[backend_name(name)] = forced

    import torch
    torch.manual_seed(args.seed)
    s, h, d = args.seqlen, args.heads, args.head_dim
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    # gpt-oss-like sinks: around the scores' scale, one per head.
    sinks = torch.randn(h, device="cuda", dtype=torch.float32)
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")
    variants = [Variant("causal"), Variant(f"window {args.window}", window=args.window),
                Variant(f"softcap {args.softcap:g}", softcap=args.softcap),
                Variant("sinks", sinks=sinks), Variant("alibi", alibi=slopes),
                Variant(f"streaming {args.sink_tokens}+{args.window}", window=args.window,
                        sink_tokens=args.sink_tokens)]
    # User functions: flashjit's CUDA C against FlexAttention's Python, on the same tensors.
    documents, lengths = document_ids(s, args.documents, args.seed)
    prefix = min(args.prefix, s)
    variants += [
        Variant(f"documents {args.documents}", documents=documents,
                pairs=int((lengths * (lengths + 1) // 2).sum())),
        Variant(f"prefix-LM {prefix}", prefix=torch.tensor([prefix], dtype=torch.int32,
                                                           device="cuda"),
                pairs=prefix * prefix + (s * (s + 1) - prefix * (prefix + 1)) // 2),
        Variant(f"rel-bias {args.max_distance}", max_distance=args.max_distance,
                bias_table=torch.randn(h, 2 * args.max_distance + 1, device="cuda"))]
    variants += [
                # The plain kernel again, last: sessions 8-9 saw plain causal run 7-12 % above
                # the sinks run for every backend; a second plain measurement shows whether the
                # plain number or the others are off.
                Variant("causal again")]
    if args.only:
        variants = [v for v in variants if v.name.split()[0] in args.only]
    libs = {}
    for text in args.lib:
        name, _, path = text.rpartition("=")
        libs[backend_name(name)] = fj.Flashjit(path).create_engine(0)
    ours = list(libs)
    fa4 = load_fa4()[0] if args.fa4 else None
    # The first rows (few keys: where a sink shows), rows past the window's first (their windows
    # cut the keys) and the last ones: every variant gives some of them a different output, which
    # an error relative to the reference's largest value (bf16: ~4e-3) tells apart.
    first = min(args.window + args.check_rows, s - args.check_rows)
    rows = torch.cat([torch.arange(args.check_rows), torch.arange(first, first + args.check_rows),
                      torch.arange(s - args.check_rows, s)]).cuda()

    runners, notes, checks, outputs, checks_flex = {}, {}, {}, {}, {}
    for variant in variants:
        ref = reference_rows(q, k, v, rows, scale, variant)

        def check(key, out, ref=ref):
            # Relative to the largest reference value: bf16 rounding gives ~2e-3 here; a variant
            # left out differs by more (4 sink tokens ignored: 7e-3; a window or cap: tens of %).
            err = ((out[0, rows].float() - ref).abs().max() / ref.abs().max()).item()
            checks[key] = err
            if not err < 5e-3:
                notes[key] = f"failed check: max relative error {err:.3g}"
                return False
            return True
        def check_against_flex(variant, flex_out):
            # Whole outputs, flashjit's against FlexAttention's: two bf16 roundings of the same
            # attention, within 1e-2 of FlexAttention's largest value.
            for backend in ours:
                key = (backend, variant.name)
                if key not in outputs:
                    continue
                err = ((outputs.pop(key).float() - flex_out.float()).abs().max() /
                       flex_out.float().abs().max()).item()
                checks_flex[key] = err
                if not err < 1e-2:
                    notes[key] = f"failed check: max error {err:.3g} against FlexAttention"
                    runners.pop(key, None)

        for backend, engine in libs.items():
            key = (backend, variant.name)
            try:
                call, out = flashjit_runner(engine, q, k, v, scale, variant, tiles.get(backend))
                if check(key, out):
                    runners[key] = call
                    if variant.user_functions():  # for check_against_flex
                        outputs[key] = out
            except fj.FlashjitError as e:
                notes[key] = f"error: {e.message}"
            except fj.FlashjitLoadError as e:  # a build without user functions
                notes[key] = f"error: {e}"
        if fa4 is not None:
            key = ("FA4", variant.name)
            try:
                call, out = fa4_runner(fa4, q, k, v, scale, variant)
                if check(key, out):
                    runners[key] = call
            except Exception as e:  # FA4 refuses with assertions and DSL errors
                notes[key] = "refused: " + refusal(e)
        if args.flex and variant.sinks is None:  # a sink is no score_mod or mask_mod
            key = ("FlexAttention", variant.name)
            try:
                call, result = flex_runner(q, k, v, scale, variant)
                if check(key, result["out"].transpose(1, 2)):
                    runners[key] = call
                    if variant.user_functions():
                        check_against_flex(variant, result["out"].transpose(1, 2))
            except Exception as e:
                notes[key] = f"error: {type(e).__name__}: {str(e)[:300]}"
        if variant.name == "causal":
            key = ("SDPA cuDNN", variant.name)
            try:
                call, result = sdpa_cudnn_runner(q, k, v, scale)
                if check(key, result["out"].transpose(1, 2)):
                    runners[key] = call
            except Exception as e:
                notes[key] = f"error: {type(e).__name__}: {str(e)[:300]}"

    timer = CudaTimer()
    single = {}
    for key, fn in runners.items():  # warm-up, and the size of a burst
        for _ in range(2):
            fn()
        handle = timer.launch(fn)
        gpu.sync()
        single[key] = timer.elapsed_ms(handle)
    bursts = {key: burst(fn, max(1, math.ceil(2.0 / max(single[key], 1e-3))))
              for key, fn in runners.items()}
    calls = {key: max(1, math.ceil(2.0 / max(single[key], 1e-3))) for key in runners}
    spins, spin_ms = enqueue_spins(bursts, timer, DEFAULT_SPIN_MS)
    enqueue = {}
    # Whole rotations of the round-robin order, so every implementation runs at every position of
    # a round as often as the others.
    reps = math.ceil(args.reps / len(bursts)) * len(bursts) if bursts else 0
    samples = round_robin(bursts, {key: reps for key in bursts}, timer, spins, enqueue)
    ms = {key: statistics.median(t) / calls[key] for key, t in samples.items()}

    result = {"seqlen": s, "heads": h, "head_dim": d, "window": args.window,
              "softcap": args.softcap, "cells": []}
    plain_pairs = visible_pairs(s, -1)
    user_cases = [variant.name for variant in variants if variant.user_functions()]
    print(f"one causal sequence of {s} tokens, {h} heads, d{d}, bf16; ms (TFLOPS over the pairs "
          f"each variant sees), median of {reps} interleaved samples; check: max |error| "
          f"against float32 on {3 * args.check_rows} query rows, over the reference's max |value|")
    for variant in variants:
        pairs = variant.pairs or visible_pairs(s, variant.window, variant.sink_tokens)
        flops = 4.0 * d * h * pairs
        for backend in ours + ["FA4", "FlexAttention", "SDPA cuDNN"]:
            key = (backend, variant.name)
            if key not in ms and key not in notes:
                continue
            cell = {"backend": backend, "variant": variant.name, "check": checks.get(key),
                    "pairs": pairs}
            if key in checks_flex:
                cell["check_vs_flex"] = checks_flex[key]
            line = f"{backend:<16} {variant.name:<14}"
            if key in ms:
                t = ms[key]
                cell.update(ms=t, samples_ms=[x / calls[key] for x in samples[key]], tflops=flops / (t * 1e-3) / 1e12,
                            enqueue_over_spin=sum(e > spin_ms[key] for e in enqueue[key]))
                line += f" {t:9.3f} ms {cell['tflops']:7.1f} TFLOPS  check {checks[key]:.2e}"
                plain = ms.get((backend, "causal"))
                if plain and key[1] != "causal":
                    cell["vs_plain"] = t / plain
                    line += f"  x{t / plain:.3f} of plain"
                    if pairs != plain_pairs:  # a window or a user mask
                        ideal = plain * pairs / plain_pairs
                        cell["vs_ideal"] = t / ideal
                        line += f" ({t / ideal:.3f} of the ideal {ideal:.3f} ms)"
                if backend in ours:
                    for peer in ("FA4", "FlexAttention"):
                        if (peer, variant.name) in ms:
                            cell[f"speedup_{peer}"] = ms[(peer, variant.name)] / t
                            line += f"  {ms[(peer, variant.name)] / t:.3f}x {peer}"
            else:
                line += f" {notes[key]}"
            result["cells"].append(cell)
            print(line)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "variants.json").write_text(json.dumps(result, indent=1))
    for name in user_cases:  # a user-function case never checked against FlexAttention says so
        for backend in ours:
            if (backend, name) in ms and (backend, name) not in checks_flex:
                print(f"{backend} {name}: not compared with FlexAttention (--flex to do so)")
    failed = any(n.startswith("failed") for k, n in notes.items() if k[0] in ours)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
