"""Imports torch for the torch entry points, or says clearly why they are not available."""


def load(error_class):
    """The flashjit.ops module (torch custom ops); raises error_class without torch >= 2.4."""
    try:
        import torch
    except ImportError as e:
        raise error_class(
            f"flashjit's torch entry points need PyTorch >= 2.4, which cannot be imported ({e}); "
            "flashjit.library(), flashjit.info() and flashjit.cache work without it") from e
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        raise error_class(f"flashjit's torch entry points need torch >= 2.4 "
                          f"(torch.library.custom_op); this is torch {torch.__version__}")
    from . import ops
    return ops
