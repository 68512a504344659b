"""Case: one attention problem of a dense grid (shape, mask, dtype, layout), its --case spelling,
label, FLOP counts and JSON fields; the backward's cases extend it (backward_cases)."""

from dataclasses import dataclass, field

from .checks import TOLERANCES
from .masks import CAUSAL_WORDS, visible_pairs


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


def parse_shape(parts, usage, causal_words=CAUSAL_WORDS):
    """(b, hq, hkv, sq, sk, d, causal, dtype) from the first 7 or 8 of a --case spelling's fields
    (dtype bf16 unless given), or ValueError(usage + why)."""
    try:
        b, hq, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise ValueError(usage) from None
    if parts[6].lower() not in causal_words:
        raise ValueError(f"{usage}; causal is 0/1/true/false, got {parts[6]!r}")
    dtype = parts[7].lower() if len(parts) > 7 else "bf16"
    if dtype not in TOLERANCES:
        raise ValueError(f"{usage}; dtype is bf16 or fp16, got {dtype!r}")
    if min(b, hq, hkv, sq, sk, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    return b, hq, hkv, sq, sk, d, causal_words[parts[6].lower()], dtype
