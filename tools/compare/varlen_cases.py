"""The varlen cases: a prefill batch of sequences of different lengths packed along the seqlen
dimension (FlashAttention's varlen convention: cu_seqlens, q/k/v [1, total, h, d]), its --case
varlen:... spelling and the grid. A VarlenCase runs through run_varlen: flashjit_forward_varlen
and FA4's flash_attn_varlen_func on the packed batch, and the dense forward of both on a "dense
twin", an equal-length batch of (nearly) the same causal work."""

import functools
import math
import random
from dataclasses import dataclass, field

from .checks import TOLERANCES
from .masks import CAUSAL_WORDS, visible_pairs

VARLEN_SEED = 6  # the first seed whose draw of 16 spans nearly all of 128..8192 (131..8037)

_pairs = functools.lru_cache(maxsize=None)(visible_pairs)


def draw_seqlens(batch, lo, hi, seed=VARLEN_SEED):
    """batch lengths, uniform integers in [lo, hi] (Python's Random: the same on every host)."""
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(batch))


@dataclass(frozen=True)
class VarlenCase:
    seqlens: tuple  # per sequence; queries and keys alike (self-attention prefill)
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool  # bottom-right aligned (= top-left: s_q = s_k in every sequence)
    dtype: str = "bf16"
    lengths: str = ""  # how seqlens were given: 'LO-HI@SEED' (drawn) or 'L1/L2/...'
    group: str = field(default="varlen", compare=False)
    layout = "bshd"  # packed q, k, v, out: contiguous [1, total, h, d]

    @property
    def batch(self):
        return len(self.seqlens)

    def total(self):
        return sum(self.seqlens)

    def max_seqlen(self):
        return max(self.seqlens)

    def cu_seqlens(self):
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return out

    def dense_seqlen(self):
        """The dense twin's length: round(sqrt(mean L^2)), so batch x that length does about
        the same causal (and non-causal) work as the packed batch."""
        return max(1, round(math.sqrt(sum(n * n for n in self.seqlens) / self.batch)))

    def visible_pairs(self):
        return sum(_pairs(n, n, self.causal) for n in self.seqlens)

    def flops(self):
        """Exact FLOPs: 4*d*h_q per (query, key) pair the mask lets through, over sequences."""
        return 4 * self.head_dim * self.heads_q * self.visible_pairs()

    def flops_exact(self):
        return self.flops()

    def dense_flops(self):
        n = self.dense_seqlen()
        return 4 * self.head_dim * self.heads_q * self.batch * _pairs(n, n, self.causal)

    def kv_bytes(self):
        return 2 * self.total() * self.heads_kv * self.head_dim * 2

    def key(self):
        """The --case spelling: varlen:b,hq,hkv,d,causal,dtype,lengths."""
        return (f"varlen:{self.batch},{self.heads_q},{self.heads_kv},{self.head_dim},"
                f"{int(self.causal)},{self.dtype},{self.lengths or self._list()}")

    def _list(self):
        return "/".join(str(n) for n in self.seqlens)

    def label(self):
        heads = f"h{self.heads_q}" + (f":{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        span = (f"s{min(self.seqlens)}-{self.max_seqlen()}" if self.batch > 1
                else f"s{self.seqlens[0]}")
        return (f"{self.group} b{self.batch} {heads} {span} d{self.head_dim} {self.dtype}"
                + (" causal" if self.causal else ""))

    def fields(self):
        return {"kind": "varlen", "batch": self.batch, "heads_q": self.heads_q,
                "heads_kv": self.heads_kv, "head_dim": self.head_dim, "causal": self.causal,
                "dtype": self.dtype, "layout": self.layout, "group": self.group,
                "lengths": self.lengths or self._list(), "seqlens": list(self.seqlens),
                "total_tokens": self.total(), "max_seqlen": self.max_seqlen(),
                "dense_seqlen": self.dense_seqlen(), "dense_flops": self.dense_flops(),
                "kv_bytes": self.kv_bytes()}


def is_varlen_case(case):
    return isinstance(case, VarlenCase)


def parse_varlen_case(text):
    """'varlen:b,hq,hkv,d,causal[,dtype[,lengths]]'; lengths LO-HI (b lengths drawn uniformly,
    seed VARLEN_SEED), LO-HI@SEED, or L1/L2/... (b of them); default 128-8192."""
    usage = (f"--case {text!r}: expected varlen:b,hq,hkv,d,causal[,dtype[,lengths]] with "
             "lengths LO-HI[@SEED] or L1/L2/..., e.g. varlen:16,32,8,128,1,bf16,128-8192@6")
    parts = [p.strip().lower() for p in text[len("varlen:"):].split(",")]
    if not 5 <= len(parts) <= 7:
        raise ValueError(usage)
    try:
        b, hq, hkv, d = (int(p) for p in parts[:4])
    except ValueError:
        raise ValueError(usage) from None
    causal = CAUSAL_WORDS.get(parts[4])
    dtype = parts[5] if len(parts) > 5 else "bf16"
    spec = parts[6] if len(parts) > 6 else "128-8192"
    if causal is None or dtype not in TOLERANCES:
        raise ValueError(f"{usage}; causal is 0/1, dtype bf16 or fp16")
    if min(b, hq, hkv, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    try:
        if "/" in spec or spec.isdigit():
            seqlens = tuple(int(n) for n in spec.split("/"))
            spec = ""
        else:
            span, _, seed = spec.partition("@")
            lo, hi = (int(n) for n in span.split("-"))
            seed = int(seed) if seed else VARLEN_SEED
            if lo <= 0:
                raise ValueError(spec)
            seqlens, spec = draw_seqlens(b, lo, hi, seed), f"{lo}-{hi}@{seed}"
    except ValueError:
        raise ValueError(f"{usage}; lengths {parts[6]!r}") from None
    if len(seqlens) != b or min(seqlens) <= 0:
        raise ValueError(f"{usage}; {b} positive lengths needed")
    return VarlenCase(seqlens, hq, hkv, d, causal, dtype, spec)


def varlen_grid():
    """16 causal prefill sequences, lengths drawn from 128..8192 (seed VARLEN_SEED), bf16 d128:
    GQA 32:8, then MHA 16:16, on the same lengths."""
    seqlens = draw_seqlens(16, 128, 8192)
    spec = f"128-8192@{VARLEN_SEED}"
    return [VarlenCase(seqlens, 32, 8, 128, True, "bf16", spec),
            VarlenCase(seqlens, 16, 16, 128, True, "bf16", spec)]


VARLEN_GRIDS = {"varlen": varlen_grid}
