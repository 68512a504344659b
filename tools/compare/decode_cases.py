"""The KV-cache cases (decode, speculative decode, chunked prefill, paged decode): KvCase, its
--case kv:... spelling and the grids. A KvCase runs through run_decode, not run_case: its peers
are SDPA (cuDNN, flash), FlashAttention-4 and, for paged cases, flashjit's own dense call."""

from dataclasses import dataclass, field

from .checks import TOLERANCES
from .masks import CAUSAL_WORDS, visible_pairs

HBM_TBS = 4.8  # H200 HBM3e peak, TB/s: the floor every KV case is held against (--hbm-tbs)


@dataclass(frozen=True)
class KvCase:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool  # bottom-right aligned (FlashAttention's), as in every flashjit call
    dtype: str = "bf16"
    page_size: int = 0     # 0: dense K/V [b, s_k, h_kv, d]; else pages of this many keys
    kv_layout: str = "nhd"  # pages as [n, page, h_kv, d] (nhd) or [n, h_kv, page, d] (hnd)
    group: str = field(default="decode", compare=False)
    layout = "bshd"  # q and out: contiguous [b, s, h, d] (not a field: KV cases fix it)

    @property
    def paged(self):
        return self.page_size > 0

    def paging(self):
        return f"{self.kv_layout}{self.page_size}" if self.paged else "dense"

    def key(self):
        """The --case spelling: kv:b,hq,hkv,sq,sk,d,causal,dtype,paging."""
        return (f"kv:{self.batch},{self.heads_q},{self.heads_kv},{self.seqlen_q},{self.seqlen_k},"
                f"{self.head_dim},{int(self.causal)},{self.dtype},{self.paging()}")

    def label(self):
        heads = f"h{self.heads_q}" + (f":{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        return (f"{self.group} b{self.batch} {heads} q{self.seqlen_q} k{self.seqlen_k} "
                f"d{self.head_dim} {self.dtype}" + (f" {self.paging()}" if self.paged else "")
                + (" causal" if self.causal else ""))

    def pages_per_seq(self):
        return self.seqlen_k // self.page_size if self.paged else 0

    def num_pages(self):
        return self.batch * self.pages_per_seq()

    def kv_bytes(self):
        """Bytes of K and V one call must read (what the HBM floor is computed from)."""
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim * 2

    def hbm_floor_us(self, tbs=HBM_TBS):
        return self.kv_bytes() / (tbs * 1e12) * 1e6

    def visible_pairs(self):
        return visible_pairs(self.seqlen_q, self.seqlen_k, self.causal)

    def flops(self):
        """Exact FLOPs (4*d per visible pair): halving for causal is wrong when s_q << s_k."""
        return 4 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim

    def flops_exact(self):
        return self.flops()

    def causal_aligned_same(self):
        return not self.causal or self.seqlen_q == self.seqlen_k

    def fields(self):
        return {"kind": "kv", "batch": self.batch, "heads_q": self.heads_q,
                "heads_kv": self.heads_kv, "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k,
                "head_dim": self.head_dim, "causal": self.causal, "dtype": self.dtype,
                "layout": self.layout, "page_size": self.page_size,
                "kv_layout": self.kv_layout if self.paged else None, "group": self.group,
                "kv_bytes": self.kv_bytes()}


def is_kv_case(case):
    return isinstance(case, KvCase)


def parse_kv_case(text):
    """'kv:b,hq,hkv,sq,sk,d,causal[,dtype[,paging]]'; paging: dense (default), nhdN or hndN
    (pages of N keys; N a multiple of 8 dividing sk)."""
    usage = (f"--case {text!r}: expected kv:b,hq,hkv,sq,sk,d,causal[,dtype[,paging]] with paging "
             "dense, nhdN or hndN, e.g. kv:64,32,8,1,8192,128,0,bf16,nhd64")
    parts = [p.strip().lower() for p in text[len("kv:"):].split(",")]
    if not 7 <= len(parts) <= 9:
        raise ValueError(usage)
    try:
        b, hq, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise ValueError(usage) from None
    causal = CAUSAL_WORDS.get(parts[6])
    dtype = parts[7] if len(parts) > 7 else "bf16"
    paging = parts[8] if len(parts) > 8 else "dense"
    if causal is None or dtype not in TOLERANCES:
        raise ValueError(f"{usage}; causal is 0/1, dtype bf16 or fp16")
    if min(b, hq, hkv, sq, sk, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    page_size, kv_layout = 0, "nhd"
    if paging != "dense":
        kv_layout, digits = paging[:3], paging[3:]
        if kv_layout not in ("nhd", "hnd") or not digits.isdigit():
            raise ValueError(f"{usage}; paging {paging!r}")
        page_size = int(digits)
        if page_size <= 0 or page_size % 8 or sk % page_size:
            raise ValueError(f"{usage}; page size {page_size} must be a multiple of 8 that "
                             f"divides sk = {sk}")
    group = "paged" if page_size else ("decode" if sq == 1 else "kv")
    return KvCase(b, hq, hkv, sq, sk, d, causal, dtype, page_size, kv_layout, group)


def decode_dense_grid():
    """Decoding shapes against a long cache, bf16 d128, 32 query heads on 8 KV heads (GQA 4)."""
    def case(group, b, sq, sk):
        # seqlen_q > 1 is causal, bottom-right: query i sees the cache and the first i+1 new keys
        return KvCase(b, 32, 8, sq, sk, 128, sq > 1, "bf16", 0, "nhd", group)
    return [case("decode", 64, 1, 8192), case("decode", 8, 1, 32768),
            case("decode", 1, 1, 131072), case("decode", 64, 4, 8192),
            case("specdec", 64, 2, 8192), case("specdec", 64, 8, 8192),
            case("chunked", 8, 512, 8192)]


def paged_grid():
    """Batch 64 decode over an 8k paged cache, pages in a shuffled order, NHD."""
    return [KvCase(64, 32, 8, 1, 8192, 128, False, "bf16", p, "nhd", "paged")
            for p in (16, 64, 128, 256)]


KV_GRIDS = {"decode": lambda: decode_dense_grid() + paged_grid(),
            "decode-dense": decode_dense_grid, "paged": paged_grid}
