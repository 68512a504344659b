"""The cases a run measures: Case, its --case spelling, the grids, and --family parsing."""

from dataclasses import dataclass, field

from .backward_cases import BACKWARD_GRIDS, backward_grid, parse_backward_case
from .checks import TOLERANCES
from .masks import CAUSAL_WORDS, visible_pairs
from .decode_cases import KV_GRIDS, parse_kv_case
from .varlen_cases import VARLEN_GRIDS, parse_varlen_case


@dataclass(frozen=True)

class Case:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"
    layout: str = "bshd"
    group: str = field(default="case", compare=False)  # which part of a grid it belongs to

    def key(self):
        """The --case spelling: b,hq,hkv,sq,sk,d,causal,dtype,layout."""
        return (f"{self.batch},{self.heads_q},{self.heads_kv},{self.seqlen_q},{self.seqlen_k},"
                f"{self.head_dim},{int(self.causal)},{self.dtype},{self.layout}")

    def label(self):
        heads = f"h{self.heads_q}" + (f":{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        seq = f"s{self.seqlen_q}" + (f":{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else "")
        return (f"b{self.batch} {heads} {seq} d{self.head_dim} {self.dtype} {self.layout}"
                + (" causal" if self.causal else ""))

    def flops(self):
        """The FlashAttention convention: 4*b*h*s_q*s_k*d, halved for causal (what TFLOPS uses)."""
        f = 4 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return f // 2 if self.causal else f

    def visible_pairs(self):
        return visible_pairs(self.seqlen_q, self.seqlen_k, self.causal)

    def flops_exact(self):
        return 4 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim

    def causal_aligned_same(self):
        """Whether top-left (PyTorch is_causal) and bottom-right (ours) masks coincide."""
        return not self.causal or self.seqlen_q == self.seqlen_k

    def fields(self):
        return {"batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
                "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "head_dim": self.head_dim,
                "causal": self.causal, "dtype": self.dtype, "layout": self.layout,
                "group": self.group}


def parse_case(text):
    """'b,hq,hkv,sq,sk,d,causal,dtype,layout' (dtype and layout optional: bf16, bshd)."""
    parts = [p.strip() for p in text.split(",")]
    usage = (f"--case {text!r}: expected b,hq,hkv,sq,sk,d,causal[,dtype[,layout]] e.g. "
             "2,32,8,4096,4096,128,1,bf16,bshd")
    if not 7 <= len(parts) <= 9:
        raise ValueError(usage)
    try:
        b, hq, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise ValueError(usage) from None
    causal_words = {**CAUSAL_WORDS, "yes": True, "no": False, "nc": False}
    if parts[6].lower() not in causal_words:
        raise ValueError(f"{usage}; causal is 0/1/true/false, got {parts[6]!r}")
    dtype = parts[7].lower() if len(parts) > 7 else "bf16"
    layout = parts[8].lower() if len(parts) > 8 else "bshd"
    if dtype not in TOLERANCES:
        raise ValueError(f"{usage}; dtype is bf16 or fp16, got {dtype!r}")
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"{usage}; layout is bshd or bhsd, got {layout!r}")
    if min(b, hq, hkv, sq, sk, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    return Case(b, hq, hkv, sq, sk, d, causal_words[parts[6].lower()], dtype, layout, "case")


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
        dims = shape.split("x")
        if shape and family in ladder and len(dims) == 3 and all(d.isdigit() for d in dims):
            shaped.append(token)
        elif token == "all":
            names.extend(ladder)
        elif token == "auto" or token in ladder:
            names.append(token)
        else:
            raise ValueError(f"--family {text!r}: expected auto, all, or any of "
                             f"{', '.join(ladder)}, each optionally @MxNxS (comma-separated)")
    return [n for n in ("auto",) + ladder if n in names] + shaped
