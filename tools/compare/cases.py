"""The cases a run measures: the --case spellings, the grids, and --family parsing (Case itself
is case.py's)."""

from .case import Case, parse_shape
from .family_spec import tile_shape
from .backward_cases import BACKWARD_GRIDS, backward_grid, parse_backward_case
from .masks import CAUSAL_WORDS
from .decode_cases import KV_GRIDS, parse_kv_case
from .varlen_cases import VARLEN_GRIDS, parse_varlen_case


def parse_case(text):
    """'b,hq,hkv,sq,sk,d,causal,dtype,layout' (dtype and layout optional: bf16, bshd)."""
    parts = [p.strip() for p in text.split(",")]
    usage = (f"--case {text!r}: expected b,hq,hkv,sq,sk,d,causal[,dtype[,layout]] e.g. "
             "2,32,8,4096,4096,128,1,bf16,bshd")
    if not 7 <= len(parts) <= 9:
        raise ValueError(usage)
    causal_words = {**CAUSAL_WORDS, "yes": True, "no": False, "nc": False}
    b, hq, hkv, sq, sk, d, causal, dtype = parse_shape(parts, usage, causal_words)
    layout = parts[8].lower() if len(parts) > 8 else "bshd"
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"{usage}; layout is bshd or bhsd, got {layout!r}")
    return Case(b, hq, hkv, sq, sk, d, causal, dtype, layout, "case")


def standard_grid():
    """FlashAttention's benchmark grid: batch*seqlen = 16k tokens, hidden 2048, bf16, BSHD."""
    cases = []
    for causal in (False, True):
        for d in (64, 128, 256):
            heads = 2048 // d
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                cases.append(Case(16384 // s, heads, heads, s, s, d, causal, "bf16", "bshd",
                                  "standard"))
    return cases


def features_grid():
    """What the standard grid leaves out: GQA, s_q != s_k, ragged seqlens, BHSD, fp16, 64k."""
    cases = []

    def add(group, b, hq, hkv, sq, sk, d, causals=(False, True), dtype="bf16", layout="bshd"):
        for c in causals:
            cases.append(Case(b, hq, hkv, sq, sk, d, c, dtype, layout, group))

    add("gqa", 4, 32, 8, 4096, 4096, 128)
    add("gqa", 4, 64, 8, 4096, 4096, 128)
    add("gqa", 2, 64, 8, 8192, 8192, 64, causals=(True,))
    # s_q < s_k: chunked prefill against a cache; s_q > s_k: causal rows that see no key;
    # s_q = 1: decode.
    add("sq!=sk", 8, 16, 16, 512, 4096, 128)
    add("sq!=sk", 2, 16, 16, 4096, 1024, 128)
    add("sq!=sk", 64, 32, 8, 1, 8192, 128, causals=(False,))
    # seqlens that are not multiples of any tile size
    add("ragged", 4, 16, 16, 1000, 1000, 128)
    add("ragged", 2, 32, 32, 4097, 4097, 64)
    add("ragged", 2, 8, 8, 3001, 3001, 256)
    add("ragged", 3, 16, 16, 777, 1531, 128, causals=(True,))
    # the same problem in both layouts
    add("layout", 4, 16, 16, 4096, 4096, 128, layout="bshd")
    add("layout", 4, 16, 16, 4096, 4096, 128, layout="bhsd")
    add("layout", 2, 32, 8, 4096, 4096, 128, causals=(True,), layout="bhsd")
    # fp16 (including GQA, which some cuDNN versions refuse in fp16)
    add("fp16", 4, 32, 32, 4096, 4096, 64, dtype="fp16")
    add("fp16", 4, 16, 16, 4096, 4096, 128, dtype="fp16")
    add("fp16", 4, 8, 8, 4096, 4096, 256, causals=(True,), dtype="fp16")
    add("fp16", 4, 32, 8, 4096, 4096, 128, causals=(True,), dtype="fp16")
    # long context last: the slowest cases, so a deadline cuts them first
    add("long", 1, 16, 16, 65536, 65536, 128, causals=(True, False))
    return cases


GRIDS = {"standard": standard_grid, "features": features_grid}


def build_cases(grids, case_texts, limit=None, kv=False, backward=None):
    """The cases of the named grids, then the --case ones. kv: also the KV-cache, varlen and
    backward grids and the kv:..., varlen:... and bwd:... spellings (decode_cases,
    varlen_cases, backward_cases; compare_sdpa runs them, ab_compare does not). backward:
    {'dtypes': [...], 'gqa_groups': [...]} for the backward grids (default bf16, MHA)."""
    cases = []
    for name in grids:
        if kv and name in BACKWARD_GRIDS:
            cases.extend(backward_grid(name, **(backward or {})))
            continue
        cases.extend(GRIDS[name]() if name in GRIDS or not kv
                     else {**KV_GRIDS, **VARLEN_GRIDS}[name]())
    for text in case_texts:
        prefix = text.strip().lower().split(":", 1)[0] if kv else ""
        parse = {"kv": parse_kv_case, "varlen": parse_varlen_case,
                 "bwd": parse_backward_case}.get(prefix)
        cases.append(parse(text.strip()) if parse else parse_case(text))
    if not cases:
        cases = standard_grid()
    if limit:
        cases = cases[:limit]
    return cases


def parse_families(text, ladder):
    """'auto' (the dispatcher's pick), 'all' (every family, ladder order) or a comma list, whose
    entries may force a tile shape: '<family>@MxNxS'.

    ladder: the library's families, slowest first (the optimization ladder, first kernel
    first); the answer keeps that order, after 'auto', then the forced shapes as given."""
    ladder = tuple(ladder)
    names, shaped = [], []
    for token in (t.strip().lower() for t in text.split(",")):
        family, _, shape = token.partition("@")
        if shape and family in ladder and tile_shape(shape) is not None:
            shaped.append(token)
        elif token == "all":
            names.extend(ladder)
        elif token == "auto" or token in ladder:
            names.append(token)
        else:
            raise ValueError(f"--family {text!r}: expected auto, all, or any of "
                             f"{', '.join(ladder)}, each optionally @MxNxS (comma-separated)")
    return [n for n in ("auto",) + ladder if n in names] + shaped
