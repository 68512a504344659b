"""The backward cases (the backward pass alone, every backend timed alike): BackwardCase, its
--case bwd:... spelling, the backward grids, and which flashjit backward configurations
(--bwd-family x --deterministic) a run compares."""

from dataclasses import dataclass, field

from .checks import TOLERANCES
from .masks import CAUSAL_WORDS, visible_pairs

# A backward costs 2.5 forwards (FlashAttention's convention: 5 GEMMs of the forward's 2).
BACKWARD_FLOP_FACTOR = 2.5


@dataclass(frozen=True)
class BackwardCase:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool  # bottom-right aligned (FlashAttention's), as in every flashjit call
    dtype: str = "bf16"
    group: str = field(default="backward", compare=False)
    layout = "bshd"  # q, k, v, out, dout and the gradients: contiguous [b, s, h, d]

    def key(self):
        """The --case spelling: bwd:b,hq,hkv,sq,sk,d,causal,dtype."""
        return (f"bwd:{self.batch},{self.heads_q},{self.heads_kv},{self.seqlen_q},"
                f"{self.seqlen_k},{self.head_dim},{int(self.causal)},{self.dtype}")

    def label(self):
        heads = f"h{self.heads_q}" + (f":{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        seq = f"s{self.seqlen_q}" + (f":{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else "")
        return (f"bwd b{self.batch} {heads} {seq} d{self.head_dim} {self.dtype}"
                + (" causal" if self.causal else ""))

    def forward_flops(self):
        """4*b*h*s_q*s_k*d, halved for causal: the forward grids' count."""
        f = 4 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return f // 2 if self.causal else f

    def flops(self):
        """What TFLOPS uses: 2.5x the forward's FLOPs (causal halves them)."""
        return int(BACKWARD_FLOP_FACTOR * self.forward_flops())

    def visible_pairs(self):
        return visible_pairs(self.seqlen_q, self.seqlen_k, self.causal)

    def flops_exact(self):
        return int(BACKWARD_FLOP_FACTOR * 4 * self.batch * self.heads_q * self.visible_pairs()
                   * self.head_dim)

    def causal_aligned_same(self):
        """Whether top-left (PyTorch is_causal) and bottom-right (ours) masks coincide."""
        return not self.causal or self.seqlen_q == self.seqlen_k

    def fields(self):
        return {"batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
                "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "head_dim": self.head_dim,
                "causal": self.causal, "dtype": self.dtype, "layout": self.layout,
                "group": self.group, "kind": "backward"}


def is_backward_case(case):
    return isinstance(case, BackwardCase)


def parse_backward_case(text):
    """'bwd:b,hq,hkv,sq,sk,d,causal[,dtype]' (dtype bf16 unless given)."""
    usage = (f"--case {text!r}: expected bwd:b,hq,hkv,sq,sk,d,causal[,dtype] e.g. "
             "bwd:4,32,8,4096,4096,128,1,bf16")
    body = text.split(":", 1)[1] if ":" in text else ""
    parts = [p.strip() for p in body.split(",")]
    if not 7 <= len(parts) <= 8:
        raise ValueError(usage)
    try:
        b, hq, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise ValueError(usage) from None
    if parts[6].lower() not in CAUSAL_WORDS:
        raise ValueError(f"{usage}; causal is 0/1/true/false, got {parts[6]!r}")
    dtype = parts[7].lower() if len(parts) > 7 else "bf16"
    if dtype not in TOLERANCES:
        raise ValueError(f"{usage}; dtype is bf16 or fp16, got {dtype!r}")
    if min(b, hq, hkv, sq, sk, d) <= 0 or hq % hkv:
        raise ValueError(f"{usage}; sizes must be positive and hq a multiple of hkv")
    return BackwardCase(b, hq, hkv, sq, sk, d, CAUSAL_WORDS[parts[6].lower()], dtype, "case")


# (head_dim, causal, seqlen) of each grid, in run order: long sequences last in each head dim,
# so a deadline cuts the slowest first. Batch x seqlen = 16k tokens, 2048 / d heads (hidden
# 2048), as the forward's standard grid and docs/perf-log.md's "FA4's backward beside ours".
SHAPES = {
    "backward": [(d, c, s) for c in (False, True) for d in (64, 128, 256)
                 for s in (512, 2048, 8192, 16384)],
    "backward-quick": [(64, False, 8192), (128, False, 2048), (128, True, 2048),
                       (128, False, 16384), (128, True, 16384), (256, True, 8192)],
}


def backward_grid(name, dtypes=("bf16",), gqa_groups=(1,)):
    """The grid's shapes for every dtype and GQA group size (heads_kv = heads_q / group; a group
    that does not divide a shape's heads is left out of that shape)."""
    cases = []
    for dtype in dtypes:
        for g in gqa_groups:
            for d, causal, s in SHAPES[name]:
                heads = 2048 // d
                if heads % g:
                    continue
                group = "bwd" + (f"-g{g}" if g > 1 else "") + \
                    (f"-{dtype}" if dtype != "bf16" else "")
                cases.append(BackwardCase(16384 // s, heads, heads // g, s, s, d, causal, dtype,
                                          group))
    return cases


BACKWARD_GRIDS = {name: (lambda name=name: backward_grid(name)) for name in SHAPES}


def parse_list(text, what, allowed=None, cast=str):
    """'a,b,c' -> [a, b, c] (cast each; ValueError naming `what` on a bad entry)."""
    values = []
    for token in (t.strip().lower() for t in text.split(",") if t.strip()):
        try:
            value = cast(token)
        except ValueError:
            raise ValueError(f"{what} {text!r}: {token!r} is not a {cast.__name__}") from None
        if allowed is not None and value not in allowed:
            raise ValueError(f"{what} {text!r}: expected any of {', '.join(map(str, allowed))}")
        values.append(value)
    if not values:
        raise ValueError(f"{what} {text!r}: empty")
    return list(dict.fromkeys(values))


DETERMINISTIC_MODES = {"off": (False,), "on": (True,), "both": (False, True)}


def backward_configs(families_text, deterministic_mode, backward_families=None):
    """The flashjit backward configurations a run times, each a name 'FAMILY[@MxNxS][+det]'
    (FAMILY 'auto': the dispatcher's): every --bwd-family entry in every --deterministic mode.
    backward_families: the library's backward families (flashjit_family_is_backward) to check
    the names against, None to take them as given (--list-cases, no library)."""
    configs = []
    for token in parse_list(families_text, "--bwd-family"):
        family, _, shape = token.partition("@")
        dims = shape.split("x")
        if shape and not (len(dims) == 3 and all(d.isdigit() for d in dims)):
            raise ValueError(f"--bwd-family {families_text!r}: {token!r}: a tile shape is MxNxS, "
                             "e.g. bwd_mma@64x128x2")
        if family != "auto" and backward_families is not None \
                and family not in backward_families:
            raise ValueError(f"--bwd-family {families_text!r}: {family!r} is not a backward "
                             "family of this library (its backward families: "
                             f"{', '.join(backward_families) or 'none'}; or auto)")
        for det in DETERMINISTIC_MODES[deterministic_mode]:
            configs.append(token + ("+det" if det else ""))
    return configs


def parse_config(name):
    """(family or None for the dispatcher's, tiles (m, n, stages) or None, deterministic) of a
    backward_configs name."""
    base, det, _ = name.partition("+det")
    family, _, shape = base.partition("@")
    tiles = tuple(int(x) for x in shape.split("x")) if shape else None
    return (None if family == "auto" else family), tiles, bool(det)
