"""The implementations a KV case compares: its inputs (dense K/V and the same keys in shuffled
pages) and flashjit's forward_kv. FlashAttention-4 is fa4's Fa4Runner; SDPA is backends'
SdpaRunner, asked for the bottom-right mask only."""

import flashjit_ctypes as fj

from . import gpu
from .family_spec import family_and_tiles
from .backends import alloc_bshd, make_inputs


def attach_workspace(options, size):
    """A device buffer of `size` bytes for a forward's split partials, set in its options (the
    caller's workspace, so the timed calls never touch the engine's); None when it needs none."""
    if not size:
        return None
    import torch
    workspace = torch.empty(size, dtype=torch.uint8, device=gpu.DEVICE)
    options.workspace, options.workspace_bytes = workspace.data_ptr(), size
    return workspace


def poison_outputs(out, lse, workspace):
    """NaN in the output, the LSE and (0xff bytes: fp32 NaN) the split partials."""
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    if workspace is not None:
        workspace.fill_(255)

class KvInputs:
    """q [b, s_q, h_q, d]; dense k, v [b, s_k, h_kv, d]; for a paged case the same keys in
    pages [n, page, h_kv, d] (HND: memory [n, h_kv, page, d] viewed so), page_table
    [b, pages_per_seq] int32 a random permutation of all pages, seqused_k [b] int32 = s_k."""

    def __init__(self, case, seed):
        import torch
        self.q, self.k, self.v = make_inputs(case, seed)
        self.k_pages = self.v_pages = self.page_table = self.seqused_k = None
        if not case.paged:
            return
        gen = torch.Generator(device=gpu.DEVICE)
        gen.manual_seed(seed + 7919)
        order = torch.randperm(case.num_pages(), generator=gen, device=gpu.DEVICE)
        self.page_table = order.view(case.batch, case.pages_per_seq()).to(torch.int32)
        self.k_pages = scatter_pages(case, self.k, order)
        self.v_pages = scatter_pages(case, self.v, order)
        self.seqused_k = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32,
                                    device=gpu.DEVICE)


def scatter_pages(case, dense, order):
    """Sequence b's keys [j*page, (j+1)*page) into page order[b*pages_per_seq + j]."""
    import torch
    n, p, h, d = case.num_pages(), case.page_size, case.heads_kv, case.head_dim
    blocks = dense.reshape(n, p, h, d)
    if case.kv_layout == "nhd":
        pages = torch.empty(n, p, h, d, dtype=dense.dtype, device=gpu.DEVICE)
        pages[order] = blocks
        return pages
    memory = torch.empty(n, h, p, d, dtype=dense.dtype, device=gpu.DEVICE)
    memory[order] = blocks.transpose(1, 2)
    return memory.transpose(1, 2)  # logical [n, page, h_kv, d], bhsd strides


def gather_pages(case, pages, page_table):
    """The inverse of scatter_pages: dense [b, s_k, h_kv, d] (the self-test checks the pair)."""
    blocks = pages[page_table.long().reshape(-1)]
    return blocks.reshape(case.batch, case.seqlen_k, case.heads_kv, case.head_dim)


def impl_names(case, families):
    """flashjit's implementations for a case: one per --family ('flashjit' for auto), and for
    a paged case flashjit's dense call on the same keys and the paged call with seqused_k."""
    names = ["flashjit" if f == "auto" else f"flashjit.{f}" for f in families]
    if case.paged:
        names += ["flashjit_dense", "flashjit_seqused"]
    return names


def impl_setup(name, case):
    """(family or None, tiles or None, paged?, pass seqused_k?) of a flashjit implementation."""
    family, tiles = family_and_tiles(name.split(".", 1)[1] if name.startswith("flashjit.") else "auto")
    return family, tiles, case.paged and name != "flashjit_dense", name == "flashjit_seqused"


def _fake_kv(case, paged, seqused):
    """Views with made-up aligned pointers: selecting a variant dereferences none of them."""
    base, (b, d) = 1 << 20, (case.batch, case.head_dim)
    q = fj.make_tensor(base, case.dtype, (b, case.seqlen_q, case.heads_q, d),
                       (case.seqlen_q * case.heads_q * d, case.heads_q * d, d, 1))
    if paged:
        n, p, h = case.num_pages(), case.page_size, case.heads_kv
        stride = (p * h * d, h * d, d, 1) if case.kv_layout == "nhd" else (h * p * d, d, p * d, 1)
        k = fj.make_tensor(base, case.dtype, (n, p, h, d), stride)
        kv = fj.make_kv_cache(k, k, base, case.pages_per_seq(), 0, base if seqused else 0)
    else:
        h, s = case.heads_kv, case.seqlen_k
        k = fj.make_tensor(base, case.dtype, (b, s, h, d), (s * h * d, h * d, d, 1))
        kv = fj.make_kv_cache(k, k, seqused_k=base if seqused else 0)
    return q, kv


def kv_variant_picks(engine, case, families, num_splits=0):
    """{implementation: (variant, None) or (None, error)} for every flashjit implementation.
    error: a FlashjitError, or a FlashjitLoadError for a build without the KV-cache API."""
    picks = {}
    for name in impl_names(case, families):
        family, tiles, paged, seqused = impl_setup(name, case)
        q, kv = _fake_kv(case, paged, seqused)
        try:
            options = engine.options(case.causal, 0.0, None, family, tiles, num_splits=num_splits)
            picks[name] = (engine.select_variant_kv_raw(q, kv, q, options), None)
        except (fj.FlashjitError, fj.FlashjitLoadError) as e:
            picks[name] = (None, e)
    return picks


class FlashjitKvRunner:
    """flashjit_forward_kv for one implementation of a case, structs built once. Its split-KV
    workspace is the harness's own buffer (flashjit_workspace_bytes of it), so it can be
    poisoned with the output."""

    def __init__(self, engine, case, inputs, name, scale, num_splits):
        import torch
        family, tiles, paged, seqused = impl_setup(name, case)
        self.engine = engine
        self.out = alloc_bshd(case, case.seqlen_q, case.heads_q, inputs.q.dtype, case.layout)
        self.lse = torch.empty(case.batch, case.heads_q, case.seqlen_q, dtype=torch.float32,
                               device=gpu.DEVICE)
        k, v = (inputs.k_pages, inputs.v_pages) if paged else (inputs.k, inputs.v)
        self.q, self.kv, self.out_view, self.options = engine.kv_args(
            inputs.q, k, v, self.out, inputs.page_table if paged else None,
            inputs.seqused_k if seqused else None, case.causal, scale, self.lse, family, tiles,
            num_splits=num_splits)
        size, self.num_splits = engine.workspace_bytes_raw(self.q, self.kv, self.out_view,
                                                           self.options)
        self.workspace = attach_workspace(self.options, size)
        self.variant = engine.select_variant_kv_raw(self.q, self.kv, self.out_view, self.options)
        self.stream = torch.cuda.current_stream().cuda_stream if gpu.DEVICE == "cuda" else None

    def poison(self):
        poison_outputs(self.out, self.lse, self.workspace)

    def __call__(self):
        self.engine.forward_kv_raw(self.q, self.kv, self.out_view, self.options, self.stream)
