"""The backward cases (the backward pass alone, every backend timed alike): BackwardCase, its
--case bwd:... spelling, the backward grids, and which flashjit backward configurations
(--bwd-family x --deterministic) a run compares."""

from dataclasses import dataclass, field

from .case import Case, parse_shape
from .family_spec import tile_shape

# A backward costs 2.5 forwards (FlashAttention's convention: 5 GEMMs of the forward's 2).
BACKWARD_FLOP_FACTOR = 2.5


@dataclass(frozen=True)
class BackwardCase(Case):
    """A dense case's problem, differentiated: contiguous BSHD q, k, v, out, dout and gradients."""
    group: str = field(default="backward", compare=False)

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
        """The forward grids' count (Case.flops)."""
        return super().flops()

    def flops(self):
        """What TFLOPS uses: 2.5x the forward's FLOPs (causal halves them)."""
        return int(BACKWARD_FLOP_FACTOR * self.forward_flops())

    def flops_exact(self):
        return int(BACKWARD_FLOP_FACTOR * super().flops_exact())

    def fields(self):
        return {**super().fields(), "kind": "backward"}


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
    b, hq, hkv, sq, sk, d, causal, dtype = parse_shape(parts, usage)
    return BackwardCase(b, hq, hkv, sq, sk, d, causal, dtype, group="case")


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
                                          group=group))
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
        if shape and tile_shape(shape) is None:
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
    tiles = tile_shape(shape) if shape else None
    return (None if family == "auto" else family), tiles, bool(det)
