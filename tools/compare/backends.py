"""The sides of a comparison on one case: inputs, the flashjit runner, the SDPA runner (FA4's is
fa4.Fa4Runner)."""

import warnings

import flashjit_ctypes as fj

from . import gpu
from .family_spec import family_and_tiles

SDPA_BACKENDS = ("cudnn", "flash")
SDPA_LABELS = {"cudnn": "SDPA cuDNN", "flash": "SDPA flash"}
# The peers of a dense case's best-peer ratio: the faster of SDPA cuDNN and FA4 (fa4.Fa4Runner;
# SDPA flash is FlashAttention-2, which FA4 supersedes).
BEST_PEERS = ("cudnn", "fa4")


def torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def alloc_bshd(case, seqlen, heads, dtype, layout):
    """An uninitialized [b, s, h, d] view: contiguous (BSHD) or a transposed [b, h, s, d]."""
    import torch
    if layout == "bshd":
        return torch.empty(case.batch, seqlen, heads, case.head_dim, dtype=dtype,
                           device=gpu.DEVICE)
    return torch.empty(case.batch, heads, seqlen, case.head_dim, dtype=dtype,
                       device=gpu.DEVICE).transpose(1, 2)


def make_inputs(case, seed):
    """Fresh N(0, 1) q, k, v (seeded per case, so a run can be repeated) as [b, s, h, d] views."""
    import torch
    gen = torch.Generator(device=gpu.DEVICE)
    gen.manual_seed(seed)
    dtype = torch_dtype(case.dtype)
    tensors = []
    for seqlen, heads in ((case.seqlen_q, case.heads_q), (case.seqlen_k, case.heads_kv),
                          (case.seqlen_k, case.heads_kv)):
        t = alloc_bshd(case, seqlen, heads, dtype, case.layout)
        t.normal_(generator=gen)
        tensors.append(t)
    return tensors


def fake_view(case, seqlen, heads):
    """A FlashjitTensor with a made-up aligned pointer: select_variant never dereferences it."""
    b, d = case.batch, case.head_dim
    if case.layout == "bshd":
        stride = (seqlen * heads * d, heads * d, d, 1)
    else:
        stride = (heads * seqlen * d, d, seqlen * d, 1)
    return fj.make_tensor(1 << 20, case.dtype, (b, seqlen, heads, d), stride)


def select_variant(engine, case, family):
    """(variant name, None) or (None, FlashjitError) for one case and family ('auto': None)."""
    q = fake_view(case, case.seqlen_q, case.heads_q)
    k = fake_view(case, case.seqlen_k, case.heads_kv)
    try:
        family, tiles = family_and_tiles(family)
        name = engine.select_variant(q, k, k, q, causal=case.causal, family=family, tiles=tiles)
        return name, None
    except fj.FlashjitError as e:
        return None, e


class FlashjitRunner:
    """flashjit forward for one case and family, structs built once so calls stay cheap."""

    def __init__(self, engine, case, q, k, v, family, scale):
        import torch
        self.engine = engine
        self.out = alloc_bshd(case, case.seqlen_q, case.heads_q, q.dtype, case.layout)
        self.lse = torch.empty(case.batch, case.heads_q, case.seqlen_q, dtype=torch.float32,
                               device=gpu.DEVICE)
        self.views = [fj.tensor_from_torch(t) for t in (q, k, v, self.out)]
        self.options = engine.options(case.causal, scale, self.lse.data_ptr(),
                                      *family_and_tiles(family))
        # torch's current stream (the legacy default stream unless the caller set one), so
        # flashjit's launches and the CUDA events that time them share one stream.
        self.stream = torch.cuda.current_stream().cuda_stream if gpu.DEVICE == "cuda" else None

    def poison(self):
        """NaN everywhere: a row the kernel forgets to write fails the check."""
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))

    def __call__(self):
        self.engine.forward_raw(*self.views, self.options, self.stream)



# --------------------------------------------------------------------------------------------
# The SDPA side
# --------------------------------------------------------------------------------------------

def _warning_reasons(caught, limit=400):
    seen = []
    for w in caught:
        text = " ".join(str(w.message).split())
        if text and text not in seen:
            seen.append(text)
    return "; ".join(seen)[:limit]


class SdpaRunner:
    """torch SDPA on one backend, or .error when the backend refuses the case.

    Tries, in order, what a user would: the same memory as flashjit seen as [b, h, s, d]
    (.transpose(1, 2) views), then contiguous [b, h, s, d] copies (first with --sdpa-layout bhsd);
    GQA through enable_gqa=True, then K/V expanded with repeat_interleave. Copies and expansions
    are made here, never timed. For causal with s_q != s_k it prefers the bottom-right mask we use
    (flash: torch's causal_lower_right, which runs the flash kernel), else is_causal=True, which
    PyTorch documents as top-left: marked so, unless the check shows it computed bottom-right.
    bottom_right_only (the KV cases): never top-left; cuDNN gets an explicit boolean
    bottom-right mask, and a backend that refuses the bottom-right mask is n/a."""

    def __init__(self, backend, case, q, k, v, scale, layout_mode, bottom_right_only=False):
        from torch.nn.attention import SDPBackend
        self.backend = backend
        self.case = case
        self.scale = scale
        self.sdpa_backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                             "flash": SDPBackend.FLASH_ATTENTION}[backend]
        self.notes = []
        self.error = None
        self.mask = None            # 'is_causal', 'lower_right' or None
        self.mask_alignment = None  # 'bottom-right' / 'top-left' when causal
        self.gqa_mode = None        # 'enable_gqa' / 'repeat_interleave' for GQA cases
        self.layout = None          # 'same' / 'bhsd'
        self.out = None             # output of the trial call, [b, h, s_q, d]
        self.fn = None
        self.inputs = None          # (q, k, v) as passed to SDPA, [b, h, s, d]

        group = case.heads_q // case.heads_kv
        layouts = ["same", "bhsd"] if layout_mode == "same" else ["bhsd"]
        masks = ["none"]
        if case.causal:
            masks = ["is_causal"]
            if not case.causal_aligned_same() and bottom_right_only:
                masks = ["lower_right"] if backend == "flash" else ["bool_mask"]
            elif not case.causal_aligned_same():
                masks = (["lower_right"] if backend == "flash" else []) + ["is_causal"]
        kv_modes = ["enable_gqa", "repeat_interleave"] if group > 1 else ["none"]

        refusals = []
        for layout in layouts:
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
            if layout == "bhsd":
                qs, ks, vs = (t.contiguous() for t in (qs, ks, vs))
            for mask in masks:
                for kv_mode in kv_modes:
                    kx, vx = ks, vs
                    if kv_mode == "repeat_interleave":
                        kx = ks.repeat_interleave(group, dim=1)
                        vx = vs.repeat_interleave(group, dim=1)
                    attempt = f"{layout}/{mask}/{kv_mode}"
                    fn = self._make_fn(qs, kx, vx, mask, kv_mode == "enable_gqa")
                    if fn is None:
                        refusals.append(f"{attempt}: not available")
                        continue
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        try:
                            out = fn()
                            gpu.sync()
                        except (RuntimeError, TypeError, ValueError) as e:
                            reason = _warning_reasons(caught) or " ".join(str(e).split())[:400]
                            refusals.append(f"{attempt}: {reason}")
                            continue
                    self.inputs = (qs, kx, vx)  # what SDPA was called on (the backward's)
                    self._accept(fn, out, layout, mask, kv_mode, layout_mode, refusals)
                    return
        self.error = " | ".join(refusals) or "refused"

    def _accept(self, fn, out, layout, mask, kv_mode, layout_mode, refusals):
        case = self.case
        self.fn, self.out, self.layout = fn, out, layout
        self.gqa_mode = kv_mode if case.heads_q != case.heads_kv else None
        self.mask = mask if case.causal else None
        if case.causal:
            top_left = mask == "is_causal" and not case.causal_aligned_same()
            self.mask_alignment = "top-left" if top_left else "bottom-right"
        if kv_mode == "repeat_interleave":
            self.notes.append("K/V expanded with repeat_interleave (not timed)")
        if mask == "bool_mask":
            self.notes.append("explicit bottom-right boolean attn_mask [s_q, s_k] (built before "
                              "timing)")
        if self.mask_alignment == "top-left":
            self.notes.append("timed with is_causal=True: top-left mask, other work than ours, "
                              "ratio left out of the geomeans")
        if layout == "bhsd":
            self.notes.append("contiguous [b,h,s,d] copies (not timed)" +
                              ("" if layout_mode == "bhsd" else "; the same-memory views were "
                               "refused"))
        self.refusals = refusals

    def verified_bottom_right(self):
        """The check found the is_causal output equal to our bottom-right reference."""
        self.mask_alignment = "bottom-right"
        self.notes = [n for n in self.notes if not n.startswith("timed with is_causal")]
        self.notes.append("is_causal=True computed the bottom-right mask here (output checked)")

    def _make_fn(self, qs, ks, vs, mask_name, enable_gqa):
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel
        backend, scale = self.sdpa_backend, self.scale
        kwargs = {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        if mask_name == "is_causal":
            kwargs["is_causal"] = True
        elif mask_name == "lower_right":
            try:
                from torch.nn.attention.bias import causal_lower_right
            except ImportError:
                return None
            # causal_lower_right falls back to mem-efficient or a materialized mask when flash
            # cannot run; require that flash can, so this cell really times the flash kernel.
            if not _flash_can_run(qs, ks, vs, enable_gqa):
                return None
            kwargs["attn_mask"] = causal_lower_right(qs.shape[-2], ks.shape[-2])
        elif mask_name == "bool_mask":
            kwargs["attn_mask"] = bottom_right_mask(qs.shape[-2], ks.shape[-2])

        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qs, ks, vs, **kwargs)
        return call

    def __call__(self):
        self.fn()


def bottom_right_mask(seqlen_q, seqlen_k):
    """[s_q, s_k] bool, True where query i may see key j: j <= i + s_k - s_q (our causal)."""
    import torch
    i = torch.arange(seqlen_q, device=gpu.DEVICE).unsqueeze(1)
    j = torch.arange(seqlen_k, device=gpu.DEVICE).unsqueeze(0)
    return j <= i + (seqlen_k - seqlen_q)


def _flash_can_run(q, k, v, enable_gqa):
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention
        try:
            params = SDPAParams(q, k, v, None, 0.0, False, enable_gqa)
        except TypeError:  # torch before enable_gqa
            params = SDPAParams(q, k, v, None, 0.0, False)
        return bool(can_use_flash_attention(params, False))
    except (ImportError, RuntimeError, TypeError):
        return False
