"""flashjit.UserFunctions: FlexAttention's score_mod and mask_mod for flashjit, written in CUDA C
and compiled by NVRTC into the attention kernel (docs/variants.md, "User functions").

Stdlib only: making one and reading its hash needs the library, not torch or a GPU.

    doc_mask = flashjit.UserFunctions(mask_mod='''
        __device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {
          const int* doc = static_cast<const int*>(a.ptr[0]);
          return doc[q] == doc[k];
        }''')
    out = flashjit.attention(q, k, v, causal=True, user_functions=doc_mask, user_args=[doc_ids])
"""

import os
import threading

from . import _capi

# Every UserFunctions made in this process by hash (the library keeps them the same way): the
# torch ops' schema carries the hash, and the op finds the handle here.
_registry = {}
_lock = threading.Lock()


class UserFunctions(_capi.UserFunctions):
    """score_mod and / or mask_mod CUDA C source (None or "" for an absent one, not both), and
    for the backward of a score_mod its derivative score_mod_grad:

        __device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,
                                   const flashjit::UserArgs& args);
        __device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,
                                 const flashjit::UserArgs& args);
        __device__ float score_mod_grad(float score, int batch, int head, int q_idx, int kv_idx,
                                        const flashjit::UserArgs& args);  // d score_mod / d score

    score is softmax_scale * q.k (natural-log units) after softcap and ALiBi; mask_mod returns
    false to hide a key, on top of causal / window masks. args.ptr[i] is the i-th entry of the
    forward's user_args (read-only device memory). No #include in the sources. Nothing is
    compiled here: a source NVRTC rejects fails the first forward that uses it with
    flashjit.CompileError, whose log names the lines "score_mod(LINE)" / "mask_mod(LINE)" /
    "score_mod_grad(LINE)". Autograd through a forward with a score_mod needs score_mod_grad
    (`differentiable`); a mask_mod needs nothing more. No gradient flows into user_args.
    `hash`: 32 hex digits, what variant names carry as ".user<hash>"."""

    def __init__(self, score_mod=None, mask_mod=None, score_mod_grad=None):
        from . import library
        lib = library()
        super().__init__(lib, lib.user_functions_pointer(score_mod or None, mask_mod or None,
                                                         score_mod_grad or None),
                         differentiable=not score_mod or bool(score_mod_grad))
        _register(self)

    @classmethod
    def from_files(cls, score_mod_file=None, mask_mod_file=None, score_mod_grad_file=None):
        """UserFunctions from source files (None for an absent one); a file that cannot be read
        raises flashjit.InvalidArgumentError naming it."""
        from . import library
        lib = library()
        functions = cls.__new__(cls)
        files = [None if f is None else os.fspath(f)
                 for f in (score_mod_file, mask_mod_file, score_mod_grad_file)]
        _capi.UserFunctions.__init__(functions, lib,
                                     lib.user_functions_pointer(*files, files=True),
                                     differentiable=not files[0] or bool(files[2]))
        _register(functions)
        return functions


def _register(functions):
    with _lock:
        _registry.setdefault(functions.hash, functions)


def registered(hash_):
    """The UserFunctions of this hash made in this process; ValueError when there is none."""
    functions = _registry.get(hash_)
    if functions is None:
        raise ValueError(f"user_functions {hash_!r}: no flashjit.UserFunctions of that hash was "
                         "made in this process")
    return functions
