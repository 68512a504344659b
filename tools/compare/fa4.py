"""FlashAttention-4 (flash_attn.cute) as a peer: loading it, checking its signatures, and
Fa4Runner, its dense call (flash_attn_func: the dense prefill grids, the KV grids' dense cases,
tools/ab_compare.py) and its paged call (flash_attn_varlen_func over a page table). The varlen
grid's packed call is varlen_backends.Fa4VarlenRunner, on the same loading and checks."""

import inspect

from . import gpu

FA4_HELP = ("FA4 (flash_attn.cute) runs from the bundle of shared/device/fa4/README.md: carry "
            ".fa4, unpack it to /tmp/site and export PYTHONPATH=/tmp/site:"
            "/tmp/site/nvidia_cutlass_dsl/dsl_packages")


def load_fa4(module=None):
    """(flash_attn.cute, None), or (None, why not: the exception, then FA4_HELP). module: a
    stand-in to use instead (the self-tests')."""
    if module is None:
        try:
            import flash_attn.cute as module
        except Exception as e:  # ImportError, or the CuTe DSL failing to initialise
            return None, f"not importable ({type(e).__name__}: {e}); {FA4_HELP}"
    missing = [n for n in ("flash_attn_func", "flash_attn_varlen_func") if not hasattr(module, n)]
    if missing:
        return None, f"not importable (flash_attn.cute has no {', '.join(missing)}); {FA4_HELP}"
    return module, None


def refusal(e):
    """FA4's refusal of a call, on one line (it refuses with assertions, TypeErrors, DSL
    errors)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


class Fa4Runner:
    """FlashAttention-4 on a case: flash_attn_func on the dense K/V, or flash_attn_varlen_func
    on the pages (page_table, seqused_k, q batched [b, s_q, h, d] without cu_seqlens), in the
    same memory as flashjit's. Dense cases (KV cases without pages, and the prefill grids'
    Case, which has no `paged` field) take the dense call on inputs.q, .k, .v as they are:
    [b, s, h, d] views, contiguous for BSHD, a BHSD case's memory seen through .transpose(1, 2)
    (FA4 takes any strides whose last is 1: it copies only a tensor whose last stride is not);
    GQA: K/V with their h_kv heads (FA4 packs the query heads of a group itself). Should it
    refuse the views, contiguous [b, s, h, d] copies are made here, before timing, and .how
    says so (.layout 'copy'; else 'same').

    .error says why not (import, signature, refusal); .out is the trial call's output, the
    first call (which compiles the kernel, ~2 s). module: a stand-in for flash_attn.cute."""

    PAGED_KEYWORDS = ("page_table", "seqused_k", "max_seqlen_k", "softmax_scale", "causal")

    def __init__(self, case, inputs, scale, module=None):
        self.error, self.out, self.fn, self.how, self.layout = None, None, None, "", None
        module, self.error = load_fa4(module)
        if module is None:
            return
        x = inputs
        if getattr(case, "paged", False):
            fn = module.flash_attn_varlen_func
            kwargs = dict(page_table=x.page_table, seqused_k=x.seqused_k,
                          max_seqlen_k=case.seqlen_k, softmax_scale=scale, causal=case.causal)
            attempts = [(None, (x.q, x.k_pages, x.v_pages))]
            missing = _missing_keywords(fn, self.PAGED_KEYWORDS)
        else:
            fn = module.flash_attn_func
            kwargs = dict(softmax_scale=scale, causal=case.causal)
            attempts = [("same", (x.q, x.k, x.v))]
            if not all(t.is_contiguous() for t in attempts[0][1]):
                attempts.append(("copy", None))  # the copies are made only if needed
            missing = _missing_keywords(fn, tuple(kwargs))
        if missing:
            self.error = (f"{fn.__name__}{_signature(fn)} lacks {', '.join(missing)}: its API "
                          "differs from flash-attn-4 4.0.0b36's; update Fa4Runner")
            return
        refusals = []
        for layout, args in attempts:
            if layout == "copy":
                args = tuple(t.contiguous() for t in attempts[0][1])
            call = _caller(fn, args, kwargs)
            try:
                self.out = call()
                gpu.sync()
            except Exception as e:  # FA4 refuses with assertions, TypeErrors and DSL errors
                refusals.append(refusal(e))
                continue
            self.fn, self.layout = call, layout
            self.how = self._how(case, refusals)
            return
        self.error = "refused: " + (refusals[0] if len(refusals) == 1 else
                                    f"the views: {refusals[0]} | contiguous copies: "
                                    f"{refusals[1]}")

    def _how(self, case, refusals):
        if self.layout is None:
            return "flash_attn_varlen_func(page_table, seqused_k), pack_gqa auto"
        how = "flash_attn_func, pack_gqa auto" + (", causal (bottom-right)" if case.causal
                                                  else "")
        if self.layout == "copy":
            return how + (", contiguous [b,s,h,d] copies (made before timing, not timed; the "
                          f"views were refused: {refusals[0][:160]})")
        if getattr(case, "layout", "bshd") == "bhsd":
            return how + ", same memory: the bhsd tensors through .transpose(1,2) views"
        return how + ", same memory"

    def __call__(self):
        self.fn()


def _caller(fn, args, kwargs):
    def call():
        result = fn(*args, **kwargs)
        return result[0] if isinstance(result, (tuple, list)) else result
    return call


def _signature(fn):
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _missing_keywords(fn, names):
    """The keyword parameters fn lacks ([] when its signature cannot be read: then the call
    itself says)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return []
    return [n for n in names if n not in params]
