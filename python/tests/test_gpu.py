"""GPU tests of the torch entry points: numerics against float32 references (SDPA with explicit
masks), torch.compile(fullgraph=True), CUDA-graph capture, GQA, causal, windows, softcap, sinks,
varlen, decode over dense and paged caches, merge_attention_states, user functions (a document
mask, a relative-position bias: against float64 references) and block masks, errors; and the
backward: gradients against float32 SDPA's, deterministic mode, torch.compile and CUDA graphs of
a training step; the varlen backward (VarlenBackward: ragged lengths against float64 per-sequence
gradients); examples/ring_attention simulated on one GPU (RingSimulation). Without torch or a GPU
every test skips, saying why.

On a GPU machine with torch (no install needed):
    PYTHONPATH=python FLASHJIT_LIBRARY=/path/libflashjit.so.0 \
        python3 python/tests/run.py python/tests/test_gpu.py
"""

import importlib.util
import itertools
import math
import unittest

import flashjit

HAVE_TORCH = importlib.util.find_spec("torch") is not None
if HAVE_TORCH:
    import torch
    import torch.nn.functional as F
    HAVE_GPU = torch.cuda.is_available()
else:
    HAVE_GPU = False
WHY = ("torch is not installed" if not HAVE_TORCH else
       "no CUDA GPU visible to torch" if not HAVE_GPU else "")


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, sink=None,
              alibi=None, sink_tokens=0):
    """float32 attention on [b, s, h, d] tensors with FlashAttention's bottom-right masks (the
    first sink_tokens keys kept beside a window), ALiBi's -slope * |i' - j|, and its LSE
    [b, h, s] (natural log, the sink included)."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scale = scale or 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    sq, sk = q.shape[2], k.shape[2]
    rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        scores = scores - alibi.float().view(1, -1, 1, 1) * (rows - cols).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        visible &= (cols >= rows - left) | (cols < sink_tokens)
    if right >= 0:
        visible &= cols <= rows + right
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        column = sink.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, sq, 1)
        full = torch.cat([scores, column], dim=-1)
        lse = torch.logsumexp(full, dim=-1)
        probs = torch.softmax(full, dim=-1)[..., :-1]
    else:
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v).transpose(1, 2), lse


def rand(*shape, dtype=None):
    return torch.randn(*shape, device="cuda", dtype=dtype or torch.bfloat16)


@unittest.skipUnless(HAVE_GPU, WHY)
class Dense(unittest.TestCase):
    def check(self, out, ref, tol=2e-2):
        self.assertFalse(out.isnan().any().item())
        err = (out.float() - ref).abs().max().item()
        self.assertLess(err, tol, f"max abs error {err}")

    def test_against_sdpa(self):
        torch.manual_seed(0)
        for d in (64, 128):
            for causal in (False, True):
                q, k, v = rand(2, 256, 4, d), rand(2, 256, 4, d), rand(2, 256, 4, d)
                out = flashjit.attention(q, k, v, causal=causal)
                sdpa = F.scaled_dot_product_attention(
                    *(t.float().transpose(1, 2) for t in (q, k, v)), is_causal=causal)
                self.check(out, sdpa.transpose(1, 2))

    def test_gqa_causal_uneven_lengths_lse_fp16(self):
        torch.manual_seed(1)
        for sq, sk in ((200, 333), (333, 200), (1, 517)):
            q, k, v = (rand(2, sq, 8, 128, dtype=torch.float16),
                       rand(2, sk, 2, 128, dtype=torch.float16),
                       rand(2, sk, 2, 128, dtype=torch.float16))
            out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
            ref, ref_lse = reference(q, k, v, causal=True)
            self.check(out, ref)
            finite = ref_lse.isfinite()
            self.assertLess((lse - ref_lse)[finite].abs().max().item(), 1e-3)
            self.assertTrue(torch.equal(lse.isinf(), ref_lse.isinf()))

    def test_bhsd_strides_and_scale(self):
        q, k, v = (rand(2, 4, 128, 64).transpose(1, 2) for _ in range(3))  # BHSD memory
        out = flashjit.attention(q, k, v, softmax_scale=0.2)
        self.check(out, reference(q, k, v, scale=0.2)[0])

    def test_variants(self):
        torch.manual_seed(2)
        q, k, v = rand(1, 300, 4, 128), rand(1, 300, 2, 128), rand(1, 300, 2, 128)
        sink = torch.randn(4, device="cuda")
        slopes = torch.tensor([0.5, 0.125, 0.03, 1.0], device="cuda")
        cases = [dict(window=(64, 0), causal=True), dict(window=(32, 16)), dict(softcap=5.0),
                 dict(sink=sink, causal=True), dict(alibi=slopes, causal=True), dict(alibi=slopes),
                 dict(window=(40, 0), causal=True, sink_tokens=5)]
        for case in cases:
            with self.subTest(**{k: str(v) for k, v in case.items()}):
                window = case.get("window", (-1, -1))
                out = flashjit.attention(q, k, v, causal=case.get("causal", False),
                                         window_left=window[0], window_right=window[1],
                                         softcap=case.get("softcap", 0.0),
                                         sink_logits=case.get("sink"),
                                         alibi_slopes=case.get("alibi"),
                                         sink_tokens=case.get("sink_tokens", 0))
                self.check(out, reference(q, k, v, **case)[0])

    def test_compile_fullgraph(self):
        def block(q, k, v):
            return flashjit.attention(q * 2, k, v, causal=True).float().sum(-1)

        q, k, v = rand(2, 128, 4, 64), rand(2, 128, 4, 64), rand(2, 128, 4, 64)
        compiled = torch.compile(block, fullgraph=True)
        # Inductor may sum in another order: close, not bitwise.
        torch.testing.assert_close(compiled(q, k, v), block(q, k, v), atol=1e-3, rtol=1e-3)

    def test_cuda_graph_capture_and_replay(self):
        q, k, v = rand(2, 128, 4, 64), rand(2, 128, 4, 64), rand(2, 128, 4, 64)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up compiles and loads the kernel outside capture
            flashjit.attention(q, k, v, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = flashjit.attention(q, k, v, causal=True)
        q.copy_(rand(2, 128, 4, 64))
        graph.replay()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(out, flashjit.attention(q, k, v, causal=True)))

    def test_opcheck(self):
        q, k, v = rand(1, 64, 2, 64), rand(1, 64, 2, 64), rand(1, 64, 2, 64)
        torch.library.opcheck(torch.ops.flashjit.attention.default,
                              (q, k, v, True, 0.0, True, -1, -1, 0.0, None, None, 0, None, None,
                               [], [], 0, False))

    def test_the_eager_path_matches_the_op(self):
        # flashjit.attention runs plain calls without torch's dispatcher (ops._attention_eager,
        # structs packed into per-thread buffers): same bits as the registered op, whatever the
        # strides, dtype, LSE or options, from several threads at once.
        torch.manual_seed(5)
        op = torch.ops.flashjit.attention
        cases = [
            (rand(2, 100, 4, 64), rand(2, 130, 2, 64), rand(2, 130, 2, 64), {}),
            (*(rand(2, 4, 96, 128).transpose(1, 2) for _ in range(3)), {"causal": True}),
            (*(rand(1, 77, 2, 64, dtype=torch.float16) for _ in range(3)),
             {"return_lse": True, "softmax_scale": 0.3, "window_left": 20, "window_right": 3}),
            (*(rand(1, 64, 2, 128) for _ in range(3)), {"causal": True, "softcap": 20.0,
                                                         "return_lse": True}),
        ]
        for q, k, v, kw in cases:
            with self.subTest(shape=tuple(q.shape), **kw):
                got = flashjit.attention(q, k, v, **kw)
                out, lse = op(q, k, v, kw.get("causal", False), kw.get("softmax_scale", 0.0),
                              kw.get("return_lse", False), kw.get("window_left", -1),
                              kw.get("window_right", -1), kw.get("softcap", 0.0), None, None, 0,
                              None, None, [], [], 0, False)
                if kw.get("return_lse"):
                    got, got_lse = got
                    self.assertTrue(torch.equal(got_lse, lse))
                self.assertTrue(got.is_contiguous())
                self.assertTrue(torch.equal(got, out))
        q, k, v, kw = cases[1]
        expected = flashjit.attention(q, k, v, **kw)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: flashjit.attention(q, k, v, **kw), range(16)))
        torch.cuda.synchronize()
        for result in results:
            self.assertTrue(torch.equal(result, expected))
        with self.assertRaises(flashjit.InvalidArgumentError) as caught:
            flashjit.attention(q, k.half(), v)  # the library's dtype check, through the eager path
        self.assertIn("dtype", caught.exception.message)

    def test_errors_carry_the_library_message(self):
        q = rand(1, 64, 3, 64)
        k = rand(1, 64, 2, 64)
        with self.assertRaises(flashjit.InvalidArgumentError) as caught:
            flashjit.attention(q, k, k)
        self.assertIn("heads", caught.exception.message)
        with self.assertRaisesRegex(ValueError, "on cpu"):
            flashjit.attention(q.cpu(), k, k)



def bottom_right_causal(sq, sk):
    """[sq, sk] bool, True where query row i sees key j (FlashAttention's causal alignment)."""
    rows = torch.arange(sq, device="cuda")[:, None] + (sk - sq)
    return torch.arange(sk, device="cuda")[None, :] <= rows


def sdpa_gradients(q, k, v, dout, causal=False, scale=None):
    """(dq, dk, dv) of float32 SDPA on [b, s, h, d] tensors: GQA by repeating k and v (their
    gradients summed back by autograd), a bottom-right causal mask given explicitly (SDPA's
    is_causal aligns top-left). Every query row must see a key (SDPA gives NaN otherwise)."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    mask = bottom_right_causal(q.shape[1], k.shape[1]) if causal else None
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(groups, 2).transpose(1, 2),
        v.repeat_interleave(groups, 2).transpose(1, 2), attn_mask=mask, scale=scale)
    out.transpose(1, 2).backward(dout.float())
    return q.grad, k.grad, v.grad


def plain_torch_gradients(q, k, v, dout, causal=False, scale=None):
    """(dq, dk, dv) of attention written in plain torch ops in the inputs' dtype (scores,
    probabilities and products rounded to it, as a kernel's bf16 operands are): what a
    low-precision implementation's error looks like, for tolerances. Every row must see a key."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    scale = scale or 1 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(groups, 2)) * scale
    if causal:
        scores = scores.masked_fill(~bottom_right_causal(q.shape[1], k.shape[1]), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v.repeat_interleave(groups, 2))
    out.backward(dout)
    return q.grad, k.grad, v.grad


def flashjit_gradients(q, k, v, dout, **kwargs):
    """(dq, dk, dv) of flashjit.attention(q, k, v, **kwargs) through autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    flashjit.attention(q, k, v, **kwargs).backward(dout)
    return q.grad, k.grad, v.grad


def replayed_training_step(step, inputs, new_first):
    """Runs step() (a forward and its .backward() over `inputs`, leaves that want gradients)
    once on a side stream, so its kernels are compiled and loaded outside the capture, captures
    it in a CUDA graph, overwrites inputs[0] with new_first and replays: the gradients the
    capture's tensors hold after the replay."""
    def fresh():
        for t in inputs:
            t.grad = None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled and loaded outside capture
        fresh()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    fresh()
    with torch.cuda.graph(graph):
        step()
    captured = [t.grad for t in inputs]
    with torch.no_grad():
        inputs[0].copy_(new_first)
    graph.replay()
    torch.cuda.synchronize()
    return captured


@unittest.skipUnless(HAVE_GPU, WHY)
class RingSimulation(unittest.TestCase):
    """examples/ring_attention on one GPU: N ranks' steps in lockstep (the code torchrun runs,
    without the transfers) against one flashjit call on the whole sequence."""

    def test_simulated_ring_matches_one_call(self):
        import sys
        from pathlib import Path
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" /
                               "ring_attention"))
        import ring_attention as ra
        # Batch 1: a rank's row slices keep the whole tensor's stride[0], which the merges must
        # take (session 20's first simulation on the H200 was refused there).
        for world, causal, dtype, batch in ((2, True, torch.bfloat16, 2),
                                            (4, True, torch.bfloat16, 1),
                                            (4, False, torch.float16, 2),
                                            (3, True, torch.bfloat16, 1)):
            seqlen = 2 * world * 320  # chunks not a multiple of any tile
            q, k, v, dout = (torch.randn(batch, seqlen, 4, 128, device="cuda", dtype=dtype)
                             for _ in range(4))
            out, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True)
            want = (out, lse) + flashjit.attention_backward(q, k, v, out, dout, lse,
                                                            causal=causal)
            got = ra.simulate(q, k, v, dout, world, causal=causal)
            for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
                error = ((g.float() - w.float()).norm() / w.float().norm()).item()
                self.assertLess(error, 1e-2, f"{name}, ring of {world}, causal {causal}")


@unittest.skipUnless(HAVE_GPU, WHY)
class Backward(unittest.TestCase):
    """Gradients of flashjit.attention (autograd through flashjit.attention_backward)."""

    def check_gradients(self, q, k, v, causal=False, scale=None):
        """flashjit's gradients against float32 SDPA's: within twice the error of plain torch
        ops in the inputs' dtype (FlashAttention's test rule), or 1 % of the gradient's largest
        entry."""
        dout = rand(*q.shape, dtype=q.dtype)
        got = flashjit_gradients(q, k, v, dout, causal=causal, softmax_scale=scale)
        ref = sdpa_gradients(q, k, v, dout, causal, scale)
        low = plain_torch_gradients(q, k, v, dout, causal, scale)
        for name, g, r, lo, t in zip(("dq", "dk", "dv"), got, ref, low, (q, k, v)):
            self.assertEqual((g.shape, g.dtype), (t.shape, t.dtype), name)
            self.assertFalse(g.isnan().any().item(), name)
            err = (g.float() - r).abs().max().item()
            bound = max(2 * (lo.float() - r).abs().max().item(), 0.01 * r.abs().max().item())
            self.assertLessEqual(err, bound, f"{name}: max abs error {err}, bound {bound}")

    def test_against_sdpa(self):
        torch.manual_seed(30)
        for d in (64, 128):
            for causal in (False, True):
                with self.subTest(d=d, causal=causal):
                    q, k, v = rand(2, 256, 4, d), rand(2, 256, 4, d), rand(2, 256, 4, d)
                    self.check_gradients(q, k, v, causal)

    def test_gqa_uneven_lengths_scale_fp16(self):
        torch.manual_seed(31)
        # Causal rows see keys bottom-right aligned; every row sees one when seqlen_k >= seqlen_q.
        for sq, sk, causal in ((200, 333, True), (333, 200, False), (1, 517, True),
                               (130, 130, True)):
            for dtype in (torch.bfloat16, torch.float16):
                with self.subTest(sq=sq, sk=sk, causal=causal, dtype=dtype):
                    q = rand(2, sq, 8, 128, dtype=dtype)
                    k, v = rand(2, sk, 2, 128, dtype=dtype), rand(2, sk, 2, 128, dtype=dtype)
                    self.check_gradients(q, k, v, causal, scale=0.1)

    def test_head_dims(self):
        torch.manual_seed(32)
        for d in (32, 96, 192, 256):
            with self.subTest(d=d):
                q, k, v = rand(1, 192, 2, d), rand(1, 192, 2, d), rand(1, 192, 2, d)
                self.check_gradients(q, k, v, causal=True)

    def test_rows_without_keys_get_zero_gradients(self):
        # Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key (their
        # output is 0 and so is their LSE's part), so their dq is zero, and the rest is SDPA's
        # over the rows that do see keys.
        torch.manual_seed(33)
        q, k, v = rand(1, 300, 4, 64), rand(1, 200, 4, 64), rand(1, 200, 4, 64)
        dout = rand(1, 300, 4, 64)
        dq, dk, dv = flashjit_gradients(q, k, v, dout, causal=True)
        self.assertTrue(torch.equal(dq[:, :100], torch.zeros_like(dq[:, :100])))
        ref = sdpa_gradients(q[:, 100:], k, v, dout[:, 100:], causal=True)
        for name, g, r in zip(("dq", "dk", "dv"), (dq[:, 100:], dk, dv), ref):
            err = (g.float() - r).abs().max().item()
            self.assertLess(err, 0.02 * r.abs().max().item() + 1e-3, f"{name}: {err}")

    def test_bhsd_strides_and_a_transposed_dout(self):
        torch.manual_seed(34)
        q, k, v = (rand(2, 4, 128, 64).transpose(1, 2) for _ in range(3))  # BHSD memory
        dout = rand(2, 4, 128, 64).transpose(1, 2)
        got = flashjit_gradients(q, k, v, dout, causal=True)
        ref = sdpa_gradients(q, k, v, dout, causal=True)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref):
            err = (g.float() - r).abs().max().item()
            self.assertLess(err, 0.02 * r.abs().max().item(), f"{name}: {err}")

    def test_deterministic_is_bitwise_repeatable(self):
        torch.manual_seed(35)
        q, k, v = rand(2, 512, 8, 128), rand(2, 512, 2, 128), rand(2, 512, 2, 128)
        dout = rand(2, 512, 8, 128)
        for causal in (False, True):
            with self.subTest(causal=causal):
                first = flashjit_gradients(q, k, v, dout, causal=causal, deterministic=True)
                second = flashjit_gradients(q, k, v, dout, causal=causal, deterministic=True)
                for name, a, b in zip(("dq", "dk", "dv"), first, second):
                    self.assertTrue(torch.equal(a, b), f"{name} differs between two runs")
                # The default (atomic dQ) sums in another order: close, not bitwise.
                atomic = flashjit_gradients(q, k, v, dout, causal=causal)
                for name, a, b in zip(("dq", "dk", "dv"), first, atomic):
                    torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2, msg=name)

    def test_attention_backward_matches_autograd(self):
        torch.manual_seed(36)
        q, k, v = rand(1, 256, 4, 64), rand(1, 256, 2, 64), rand(1, 256, 2, 64)
        dout = rand(1, 256, 4, 64)
        out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        direct = flashjit.attention_backward(q, k, v, out, dout, lse, causal=True,
                                             deterministic=True)
        via_autograd = flashjit_gradients(q, k, v, dout, causal=True, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), direct, via_autograd):
            self.assertTrue(torch.equal(a, b), name)

    def test_compile_fullgraph_with_backward(self):
        torch.manual_seed(37)
        weight = rand(2, 128, 4, 64).float()

        def loss(q, k, v):
            out = flashjit.attention(q * 2, k, v, causal=True, deterministic=True)
            return (out.float() * weight).sum()

        compiled = torch.compile(loss, fullgraph=True)
        inputs = [rand(2, 128, 4, 64).requires_grad_() for _ in range(3)]
        grads = torch.autograd.grad(compiled(*inputs), inputs)
        eager = torch.autograd.grad(loss(*inputs), inputs)
        for name, a, b in zip(("dq", "dk", "dv"), grads, eager):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2, msg=name)

    def test_cuda_graph_of_a_training_step(self):
        torch.manual_seed(38)
        q, k, v = (rand(2, 128, 4, 64).requires_grad_() for _ in range(3))
        dout = rand(2, 128, 4, 64)

        def step():
            flashjit.attention(q, k, v, causal=True, deterministic=True).backward(dout)

        captured = replayed_training_step(step, (q, k, v), rand(2, 128, 4, 64))
        expected = flashjit_gradients(q, k, v, dout, causal=True, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), captured, expected):
            self.assertTrue(torch.equal(a, b), name)

    def test_opcheck(self):
        q, k, v = rand(1, 64, 2, 64), rand(1, 64, 2, 64), rand(1, 64, 2, 64)
        out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        torch.library.opcheck(torch.ops.flashjit.attention_backward.default,
                              (q, k, v, out, rand(1, 64, 2, 64), lse, True, 0.0, True, 0.0, -1,
                               -1, 0, None, None, None, [], []))
        # The forward's autograd formula too (opcheck compares its gradients with AOTAutograd's).
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(torch.ops.flashjit.attention.default,
                              (*inputs, True, 0.0, False, -1, -1, 0.0, None, None, 0, None, None,
                               [], [], 0, True))

    def test_gradients_of_the_score_variants(self):
        # Soft-capping, windows (with sink tokens), ALiBi and learnable sinks (whose logits get
        # their gradient) against autograd through the float32 reference, GQA 2:1.
        torch.manual_seed(40)
        heads = 4
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)], device="cuda")
        cases = [dict(softcap=3.0), dict(window=(48, 0), causal=True, sink_tokens=4),
                 dict(window=(32, 16)), dict(alibi=slopes, causal=True), dict(sink=True),
                 dict(softcap=5.0, window=(40, 0), causal=True, alibi=slopes, sink=True)]
        for case in cases:
            with self.subTest(**{key: value for key, value in case.items() if key != "alibi"},
                              alibi="alibi" in case):
                q = rand(1, 160, heads, 64).requires_grad_()
                k, v = (rand(1, 190, 2, 64).requires_grad_() for _ in range(2))
                sink = (torch.randn(heads, device="cuda").requires_grad_()
                        if case.get("sink") else None)
                window = case.get("window", (-1, -1))
                out = flashjit.attention(q, k, v, causal=case.get("causal", False),
                                         window_left=window[0], window_right=window[1],
                                         softcap=case.get("softcap", 0.0), sink_logits=sink,
                                         alibi_slopes=case.get("alibi"),
                                         sink_tokens=case.get("sink_tokens", 0))
                dout = torch.randn_like(out)
                inputs = [q, k, v] + ([sink] if sink is not None else [])
                grads = torch.autograd.grad(out, inputs, dout)
                leaves = [t.detach().float().requires_grad_() for t in inputs]
                ref, _ = reference(*leaves[:3], causal=case.get("causal", False), window=window,
                                   softcap=case.get("softcap", 0.0),
                                   sink=leaves[3] if sink is not None else None,
                                   alibi=case.get("alibi"), sink_tokens=case.get("sink_tokens", 0))
                want = torch.autograd.grad(ref, leaves, dout.float())
                for name, got, expected in zip(("dq", "dk", "dv", "dsink"), grads, want):
                    self.assertFalse(got.isnan().any().item(), name)
                    err = (got.float() - expected).abs().max() / expected.abs().max().clamp(min=1)
                    self.assertLess(err.item(), 3e-2, name)

    def test_what_has_no_backward_yet_says_so(self):
        q = rand(1, 64, 2, 64).requires_grad_()
        out = flashjit.attention_with_kvcache(q, q, q)
        with self.assertRaisesRegex(NotImplementedError, "KV-cache .* not implemented"):
            out.float().sum().backward()

    def test_the_binding_runs_the_c_api(self):
        # flashjit_backward through the ctypes binding, as a C caller uses it.
        torch.manual_seed(39)
        q, k, v = rand(1, 128, 4, 64), rand(1, 128, 2, 64), rand(1, 128, 2, 64)
        out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True)
        dout = rand(1, 128, 4, 64)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        lib = flashjit.library()
        with lib.create_engine(torch.cuda.current_device()) as engine:
            name = engine.select_backward_variant(q, k, v, causal=True)
            self.assertIn(name.split(".")[0], lib.backward_families())
            self.assertIn(".causal", name)
            engine.backward(q, k, v, out, dout, lse, dq, dk, dv, causal=True, deterministic=True,
                            stream=torch.cuda.current_stream().cuda_stream)
            with self.assertRaises(flashjit.InvalidArgumentError) as caught:
                engine.backward(q, k, v, out, dout, lse, dq, dk[:, :, :1], dv, causal=True)
            self.assertIn("dk", caught.exception.message)
        torch.cuda.synchronize()
        expected = flashjit.attention_backward(q, k, v, out, dout, lse, causal=True,
                                               deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
            self.assertTrue(torch.equal(a, b), name)


def cu_seqlens(lengths):
    """int32 [batch + 1] offsets on the GPU of sequences of these lengths."""
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                        device="cuda")


def sequence_reference64(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0,
                         sink=None, alibi=None, sink_tokens=0):
    """float64 attention of one sequence: q [sq, hq, d], k/v [sk, hkv, d] (GQA by repetition),
    FlashAttention's bottom-right masks (the first sink_tokens keys kept beside a window),
    ALiBi's -slope * |i + sk - sq - j|, sink logits [hq] in each row's denominator. A row that
    sees no key gives 0, with zero gradients (no NaN, unlike SDPA), as flashjit does."""
    q, k, v = (t.double() for t in (q, k, v))
    heads, groups = q.shape[1], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scale = scale or 1 / math.sqrt(q.shape[-1])
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    sq, sk = q.shape[0], k.shape[0]
    rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        scores = scores - alibi.double().view(-1, 1, 1) * (rows - cols).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        visible &= (cols >= rows - left) | (cols < sink_tokens)
    if right >= 0:
        visible &= cols <= rows + right
    visible = visible.expand(heads, sq, sk)
    if sink is not None:
        scores = torch.cat([scores, sink.double().view(-1, 1, 1).expand(heads, sq, 1)], -1)
        visible = torch.cat([visible, visible.new_ones(heads, sq, 1)], -1)
    seen = visible.any(-1, keepdim=True)
    scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~seen, 0.0)
    probs = torch.softmax(scores, -1) * seen
    if sink is not None:
        probs = probs[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v)


def varlen_reference_gradients(q, k, v, dout, cu_q, cu_k, sink=None, **kwargs):
    """float64 gradients (dq, dk, dv[, dsink]) of the packed batch, each sequence its own
    sequence_reference64 problem: zero in rows past the last sequence."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    if sink is not None:
        leaves.append(sink.detach().double().requires_grad_())
    loss = leaves[0].sum() * 0
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(starts_q) - 1):
        rows, keys = slice(starts_q[i], starts_q[i + 1]), slice(starts_k[i], starts_k[i + 1])
        out = sequence_reference64(leaves[0][rows], leaves[1][keys], leaves[2][keys],
                                   sink=leaves[3] if sink is not None else None, **kwargs)
        loss = loss + (out * dout[rows].double()).sum()
    return torch.autograd.grad(loss, leaves)


@unittest.skipUnless(HAVE_GPU, WHY)
class VarlenBackward(unittest.TestCase):
    """Gradients of flashjit.attention_varlen over a dense packed k/v (autograd through
    flashjit.attention_varlen_backward) against float64 per-sequence references."""

    # Ragged lengths: an empty sequence, one row, either side of a 64-row tile, a long one.
    LENGTHS = [0, 1, 63, 65, 200]
    # Keys of their own: none for the one-row sequence, more and fewer keys than queries
    # (causal: the first 70 rows of the last sequence see no key).
    KEY_LENGTHS = [7, 0, 100, 65, 130]
    PAD_Q, PAD_K = 5, 3  # rows after the last sequence: no gradient, nothing written

    def inputs(self, lengths, key_lengths, hq=8, hkv=2, d=128, dtype=None, pad=True):
        # dtype None: bf16 (torch is not named at class creation: without it the class skips).
        dtype = dtype or torch.bfloat16
        cu_q, cu_k = cu_seqlens(lengths), cu_seqlens(key_lengths)
        pad_q, pad_k = (self.PAD_Q, self.PAD_K) if pad else (0, 0)
        q = rand(sum(lengths) + pad_q, hq, d, dtype=dtype)
        k = rand(sum(key_lengths) + pad_k, hkv, d, dtype=dtype)
        v = rand(sum(key_lengths) + pad_k, hkv, d, dtype=dtype)
        return q, k, v, cu_q, cu_k, max(lengths), max(key_lengths)

    def flashjit_gradients(self, q, k, v, dout, cu_q, cu_k, max_q, max_k, sink=None, **kwargs):
        """(dq, dk, dv[, dsink]) of flashjit.attention_varlen through autograd."""
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        if sink is not None:
            leaves.append(sink.detach().requires_grad_())
        out = flashjit.attention_varlen(*leaves[:3], cu_q, cu_k, max_q, max_k,
                                        sink_logits=leaves[3] if sink is not None else None,
                                        **kwargs)
        # Rows past the last sequence are not written by the forward: no gradient flows there.
        return torch.autograd.grad(out, leaves, dout)

    def check(self, got, want, names=("dq", "dk", "dv", "dsink"), tol=2e-2):
        """Each gradient within tol of the largest entry of the reference's (at least 1)."""
        for name, g, w in zip(names, got, want):
            self.assertEqual(g.shape, w.shape, name)
            self.assertFalse(g.isnan().any().item(), name)
            err = (g.double() - w).abs().max().item() if g.numel() else 0.0
            largest = max(w.abs().max().item() if w.numel() else 0.0, 1.0)
            self.assertLess(err / largest, tol, f"{name}: max abs error {err}, largest {largest}")

    def flashjit_args(self, case):
        window = case.get("window", (-1, -1))
        return dict(causal=case.get("causal", False), softmax_scale=case.get("scale"),
                    window_left=window[0], window_right=window[1],
                    softcap=case.get("softcap", 0.0), alibi_slopes=case.get("alibi"),
                    sink_tokens=case.get("sink_tokens", 0))

    def reference_args(self, case):
        return {key: value for key, value in case.items() if key != "dtype"}

    def test_against_per_sequence_reference(self):
        torch.manual_seed(50)
        for keys in ("same", "own"):
            key_lengths = self.LENGTHS if keys == "same" else self.KEY_LENGTHS
            for d, causal, dtype in ((64, False, torch.bfloat16), (64, True, torch.bfloat16),
                                     (128, False, torch.float16), (128, True, torch.bfloat16)):
                with self.subTest(keys=keys, d=d, causal=causal, dtype=dtype):
                    q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, key_lengths,
                                                                    d=d, dtype=dtype)
                    dout = rand(*q.shape, dtype=dtype)
                    got = self.flashjit_gradients(q, k, v, dout, cu_q, cu_k, max_q, max_k,
                                                  causal=causal)
                    want = varlen_reference_gradients(q, k, v, dout, cu_q, cu_k, causal=causal)
                    self.check(got, want)
                    for name, g in zip(("dq", "dk", "dv"), got):
                        self.assertEqual(g.dtype, dtype, name)
                    # Past the last sequence, and the empty first sequence (no rows, no keys
                    # when keys == "same"): exactly zero.
                    dq, dk, dv = got
                    self.assertEqual(dq[-self.PAD_Q:].abs().max().item(), 0.0)
                    self.assertEqual(dk[-self.PAD_K:].abs().max().item(), 0.0)
                    self.assertEqual(dv[-self.PAD_K:].abs().max().item(), 0.0)
                    if keys == "own":  # the one-row sequence has no key: its dq is zero
                        row = int(cu_q[1])
                        self.assertEqual(dq[row].abs().max().item(), 0.0)

    def test_score_variants(self):
        # A window with soft-capping (causal), a two-sided window with sink tokens, ALiBi with
        # learnable sinks (whose logits get their gradient), and a scale: GQA 4:1.
        torch.manual_seed(51)
        heads = 8
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)], device="cuda")
        cases = [dict(window=(32, 0), causal=True, softcap=5.0),
                 dict(window=(24, 8), sink_tokens=3, scale=0.1),
                 dict(alibi=slopes, causal=True, sink=True),
                 dict(softcap=3.0, window=(40, -1), sink=True)]
        for case in cases:
            with self.subTest(**{key: value for key, value in case.items() if key != "alibi"},
                              alibi="alibi" in case):
                q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, self.LENGTHS,
                                                                hq=heads)
                dout = rand(*q.shape)
                sink = torch.randn(heads, device="cuda") if case.get("sink") else None
                args = self.flashjit_args(case)
                got = self.flashjit_gradients(q, k, v, dout, cu_q, cu_k, max_q, max_k,
                                              sink=sink, **args)
                reference = {key: value for key, value in case.items() if key != "sink"}
                want = varlen_reference_gradients(q, k, v, dout, cu_q, cu_k, sink=sink,
                                                  **reference)
                self.assertEqual(len(got), 4 if sink is not None else 3)
                self.check(got, want)

    def test_deterministic_is_bitwise_repeatable(self):
        torch.manual_seed(52)
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs([300, 0, 513, 64, 129],
                                                        [300, 0, 513, 64, 129])
        dout = rand(*q.shape)
        for causal in (False, True):
            with self.subTest(causal=causal):
                args = (q, k, v, dout, cu_q, cu_k, max_q, max_k)
                first = self.flashjit_gradients(*args, causal=causal, deterministic=True)
                second = self.flashjit_gradients(*args, causal=causal, deterministic=True)
                for name, a, b in zip(("dq", "dk", "dv"), first, second):
                    self.assertTrue(torch.equal(a, b), f"{name} differs between two runs")
                # The default (atomic dQ) sums in another order: close, not bitwise.
                atomic = self.flashjit_gradients(*args, causal=causal)
                for name, a, b in zip(("dq", "dk", "dv"), first, atomic):
                    torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2, msg=name)

    def test_autograd_matches_attention_varlen_backward(self):
        torch.manual_seed(53)
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, self.KEY_LENGTHS)
        sink = torch.randn(q.shape[1], device="cuda")
        dout = rand(*q.shape)
        args = dict(causal=True, window_left=48, window_right=0, deterministic=True)
        out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True,
                                             sink_logits=sink, **args)
        direct = flashjit.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, max_q,
                                                    max_k, sink_logits=sink, **args)
        # loss.backward() through flashjit.attention_varlen: the same gradients, bit for bit.
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
        out = flashjit.attention_varlen(*leaves[:3], cu_q, cu_k, max_q, max_k,
                                        sink_logits=leaves[3], **args)
        (out.float() * dout.float()).sum().backward()
        for name, a, leaf in zip(("dq", "dk", "dv", "dsink"), direct, leaves):
            self.assertTrue(torch.equal(a, leaf.grad), name)
        # Without sinks the result is three gradients.
        self.assertEqual(len(flashjit.attention_varlen_backward(
            q, k, v, out.detach(), dout, lse, cu_q, cu_k, max_q, max_k)), 3)

    def test_compile_fullgraph_with_backward(self):
        torch.manual_seed(54)
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, self.KEY_LENGTHS, d=64)
        weight = rand(*q.shape).float()
        # Rows past the last sequence are not written by the forward: leave them out of the loss.
        valid = int(cu_q[-1])

        def loss(q, k, v):
            out = flashjit.attention_varlen(q * 2, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                            deterministic=True)
            return (out[:valid].float() * weight[:valid]).sum()

        compiled = torch.compile(loss, fullgraph=True)
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        grads = torch.autograd.grad(compiled(*inputs), inputs)
        eager = torch.autograd.grad(loss(*inputs), inputs)
        for name, a, b in zip(("dq", "dk", "dv"), grads, eager):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2, msg=name)

    def test_cuda_graph_of_a_training_step(self):
        torch.manual_seed(55)
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, self.LENGTHS, d=64)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        dout = rand(*q.shape)

        def step():
            flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                      deterministic=True).backward(dout)

        captured = replayed_training_step(step, (q, k, v), rand(*q.shape))
        expected = self.flashjit_gradients(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=True,
                                           deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), captured, expected):
            self.assertTrue(torch.equal(a, b), name)

    def test_opcheck(self):
        # No rows past the last sequence: the forward leaves those of out and the LSE unwritten,
        # and opcheck compares whole outputs.
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs([40, 0, 24], [40, 0, 30], hq=4, d=64,
                                                        pad=False)
        out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                             return_lse=True)
        torch.library.opcheck(torch.ops.flashjit.attention_varlen_backward.default,
                              (q, k, v, out, rand(*q.shape), lse, cu_q, cu_k, max_q, max_k, True,
                               0.0, True, 0.0, -1, -1, 0, None, None, None, [], []))
        # The forward's autograd formula too (opcheck compares its gradients with AOTAutograd's).
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(torch.ops.flashjit.attention_varlen.default,
                              (*inputs, cu_q, cu_k, max_q, max_k, None, None, True, 0.0, True,
                               -1, -1, 0.0, None, None, 0, 0, None, None, [], [], 0, True))

    def test_the_binding_runs_the_c_api(self):
        # flashjit_backward_varlen through the ctypes binding, as a C caller uses it.
        from flashjit import _capi
        torch.manual_seed(56)
        q, k, v, cu_q, cu_k, max_q, max_k = self.inputs(self.LENGTHS, self.KEY_LENGTHS, hq=4,
                                                        d=64)
        out, lse = flashjit.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                             return_lse=True)
        dout = rand(*q.shape)
        dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
        views = [_capi.tensor_from_torch(t.unsqueeze(0)) for t in (q, k, v, out, dout, dq, dk, dv)]
        varlen = _capi.make_varlen(cu_q.data_ptr(), cu_k.data_ptr(), cu_q.numel() - 1, max_q,
                                   max_k)
        lib = flashjit.library()
        with lib.create_engine(torch.cuda.current_device()) as engine:
            options = engine.backward_options(causal=True, deterministic=True)
            name = engine.select_backward_variant_varlen_raw(*views[:3], varlen, options)
            self.assertIn(name.split(".")[0], lib.backward_families())
            self.assertIn(".causal", name)
            self.assertGreater(engine.backward_workspace_bytes_varlen_raw(*views[:3], varlen,
                                                                          options), 0)
            engine.backward_varlen_raw(*views[:5], lse.data_ptr(), *views[5:], varlen, options,
                                       torch.cuda.current_stream().cuda_stream)
            short = _capi.tensor_from_torch(dk[:, :1].unsqueeze(0))
            with self.assertRaises(flashjit.InvalidArgumentError) as caught:
                engine.backward_varlen_raw(*views[:5], lse.data_ptr(), views[5], short,
                                           views[7], varlen, options)
            self.assertIn("dk", caught.exception.message)
        torch.cuda.synchronize()
        expected = flashjit.attention_varlen_backward(q, k, v, out, dout, lse, cu_q, cu_k, max_q,
                                                      max_k, causal=True, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
            self.assertTrue(torch.equal(a, b), name)


@unittest.skipUnless(HAVE_GPU, WHY)
class Serving(unittest.TestCase):
    def test_varlen_against_each_sequence(self):
        torch.manual_seed(3)
        lengths = [37, 300, 1, 129]
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                          device="cuda")
        total = sum(lengths)
        q, k, v = rand(total, 8, 128), rand(total, 2, 128), rand(total, 2, 128)
        out, lse = flashjit.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths),
                                             causal=True, return_lse=True)
        self.assertEqual(lse.shape, (8, total))
        for i, n in enumerate(lengths):
            s = slice(int(cu[i]), int(cu[i]) + n)
            ref, ref_lse = reference(q[None, s], k[None, s], v[None, s], causal=True)
            self.assertLess((out[s].float() - ref[0]).abs().max().item(), 2e-2)
            self.assertLess((lse[:, s] - ref_lse[0]).abs().max().item(), 1e-3)

    def test_decode_dense_and_paged(self):
        torch.manual_seed(4)
        batch, heads, kv_heads, d, page = 3, 16, 2, 128, 64
        used = torch.tensor([700, 64, 1000], dtype=torch.int32, device="cuda")
        pages_per_seq = 16
        k_dense, v_dense = rand(batch, 1024, kv_heads, d), rand(batch, 1024, kv_heads, d)
        q = rand(batch, 1, heads, d)
        # The same keys as shuffled pages.
        order = torch.randperm(batch * pages_per_seq, device="cuda")
        table = order.view(batch, pages_per_seq).to(torch.int32)
        k_pages = torch.empty(batch * pages_per_seq, page, kv_heads, d, device="cuda",
                              dtype=torch.bfloat16)
        v_pages = torch.empty_like(k_pages)
        k_pages[table.flatten().long()] = k_dense.reshape(-1, page, kv_heads, d)
        v_pages[table.flatten().long()] = v_dense.reshape(-1, page, kv_heads, d)
        dense = flashjit.attention_with_kvcache(q, k_dense, v_dense, seqused_k=used, causal=True)
        paged = flashjit.attention_with_kvcache(q, k_pages, v_pages, page_table=table,
                                                seqused_k=used, causal=True)
        split = flashjit.attention_with_kvcache(q, k_pages, v_pages, page_table=table,
                                                seqused_k=used, causal=True, num_splits=4)
        for b in range(batch):
            n = int(used[b])
            ref = reference(q[b:b + 1], k_dense[b:b + 1, :n], v_dense[b:b + 1, :n],
                            causal=True)[0]
            for name, out in (("dense", dense), ("paged", paged), ("split", split)):
                err = (out[b:b + 1].float() - ref).abs().max().item()
                self.assertLess(err, 2e-2, f"{name} batch {b}: {err}")

    def test_decode_under_graph_capture(self):
        q, k = rand(4, 1, 8, 128), rand(4, 2048, 2, 128)
        args = dict(num_splits=8)
        flashjit.attention_with_kvcache(q, k, k, **args)  # warm
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = flashjit.attention_with_kvcache(q, k, k, **args)
        graph.replay()
        torch.cuda.synchronize()
        self.assertLess((out.float() - reference(q, k, k)[0]).abs().max().item(), 2e-2)

    def test_merge_attention_states(self):
        torch.manual_seed(5)
        q, k, v = rand(2, 64, 4, 128), rand(2, 512, 4, 128), rand(2, 512, 4, 128)
        a, lse_a = flashjit.attention(q, k[:, :200], v[:, :200], return_lse=True)
        b, lse_b = flashjit.attention(q, k[:, 200:], v[:, 200:], return_lse=True)
        merged, lse = flashjit.merge_attention_states(a, lse_a, b, lse_b)
        ref, ref_lse = reference(q, k, v)
        self.assertLess((merged.float() - ref).abs().max().item(), 2e-2)
        self.assertLess((lse - ref_lse).abs().max().item(), 1e-3)


def reference64(q, k, v, visible=None, bias=None, causal=False, softcap=0.0):
    """float64 attention on [b, s, h, d] tensors (GQA by repetition): scores scaled by
    1/sqrt(d), capped, plus `bias` ([b|1, h|1, sq, sk]), hidden where `visible` ([b|1, h|1, sq,
    sk] bool) is False or past the bottom-right causal diagonal; and the LSE [b, h, sq]."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.double()
    sq, sk = q.shape[2], k.shape[2]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.arange(sk, device=q.device)[None, :] <= \
            torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    if visible is not None:
        keep = keep & visible
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v).transpose(1, 2), lse


# A document mask over a batch of sequences of SEQLEN tokens: doc ids int32 [batch, SEQLEN].
SEQLEN = 2048
DOC_MASK = f"""
__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {{
  const int* doc = static_cast<const int*>(a.ptr[0]) + b * {SEQLEN};
  return doc[q] == doc[k];
}}"""
# T5-style relative-position bias from a table fp32 [heads, 2 * MAX_DISTANCE + 1].
MAX_DISTANCE = 64
RELATIVE_BIAS = f"""
__device__ float score_mod(float score, int b, int h, int q, int k,
                           const flashjit::UserArgs& a) {{
  const float* table = static_cast<const float*>(a.ptr[0]);
  const int d = min(max(q - k, -{MAX_DISTANCE}), {MAX_DISTANCE});
  return score + table[h * {2 * MAX_DISTANCE + 1} + d + {MAX_DISTANCE}];
}}"""
# Its derivative, for the backward: a bias added to the score.
RELATIVE_BIAS_GRAD = """
__device__ float score_mod_grad(float score, int b, int h, int q, int k,
                                const flashjit::UserArgs& a) {
  return 1.f;
}"""


def documents(batch, seqlen, count, seed):
    """int32 [batch, seqlen] document ids on the GPU: `count` documents of random lengths."""
    generator = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(batch):
        cuts = torch.randperm(seqlen - 1, generator=generator)[:count - 1].sort().values + 1
        lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([seqlen])]))
        ids.append(torch.repeat_interleave(torch.arange(count), lengths))
    return torch.stack(ids).to(torch.int32).cuda()


def relative_bias(table, sq, sk):
    """The RELATIVE_BIAS score_mod's bias as [1, h, sq, sk] for the reference."""
    distance = (torch.arange(sq)[:, None] - torch.arange(sk)[None, :]).clamp(
        -MAX_DISTANCE, MAX_DISTANCE).cuda() + MAX_DISTANCE
    return table[:, distance][None]


@unittest.skipUnless(HAVE_GPU, WHY)
class UserFunctions(unittest.TestCase):
    def check(self, out, ref, tol=2e-2):
        self.assertFalse(out.isnan().any().item())
        err = (out.double() - ref).abs().max().item()
        self.assertLess(err, tol, f"max abs error {err}")

    def test_document_mask_against_float64(self):
        torch.manual_seed(20)
        mask = flashjit.UserFunctions(mask_mod=DOC_MASK)
        for d in (64, 128):
            doc = documents(2, SEQLEN, 7, seed=d)
            visible = (doc[:, :, None] == doc[:, None, :])[:, None]
            q, k, v = rand(2, SEQLEN, 4, d), rand(2, SEQLEN, 2, d), rand(2, SEQLEN, 2, d)
            for causal in (True, False):
                with self.subTest(d=d, causal=causal):
                    out, lse = flashjit.attention(q, k, v, causal=causal, return_lse=True,
                                                  user_functions=mask, user_args=[doc])
                    ref, ref_lse = reference64(q, k, v, visible=visible, causal=causal)
                    self.check(out, ref)
                    self.assertLess((lse.double() - ref_lse).abs().max().item(), 1e-3)

    def test_block_mask_on_and_off_are_equal(self):
        torch.manual_seed(21)
        mask_mod = flashjit.UserFunctions(mask_mod=DOC_MASK)
        doc = documents(2, SEQLEN, 32, seed=3)
        q, k, v = rand(2, SEQLEN, 4, 128), rand(2, SEQLEN, 4, 128), rand(2, SEQLEN, 4, 128)
        args = dict(causal=True, user_functions=mask_mod, user_args=[doc])
        try:
            blocks = flashjit.create_block_mask(q, k, v, same_for_all_heads=True, **args)
        except flashjit.InvalidArgumentError as e:
            self.skipTest(f"no block masks for this problem here: {e.message}")
        counts = blocks.counts()
        self.assertGreater(counts["partial"], 0)
        # 32 documents of 64 tokens on average: most causal tiles (70-85 % for tiles of 64 to
        # 176 keys) lie wholly in other documents and are skipped.
        self.assertLess(counts["partial"] + counts["full"], counts["total"] / 2)
        self.assertIn(mask_mod.hash, blocks.variant)
        plain, plain_lse = flashjit.attention(q, k, v, return_lse=True, **args)
        masked, masked_lse = flashjit.attention(q, k, v, return_lse=True, block_mask=blocks,
                                                **args)
        # The tiles skipped are the ones whose every score the mask hides: the same sums.
        self.assertTrue(torch.equal(plain, masked), (plain.float() - masked.float()).abs().max())
        self.assertTrue(torch.equal(plain_lse, masked_lse))
        visible = (doc[:, :, None] == doc[:, None, :])[:, None]
        self.check(masked, reference64(q, k, v, visible=visible, causal=True)[0])
        # A mask for other arguments is refused, naming what differs.
        with self.assertRaises(flashjit.InvalidArgumentError) as caught:
            flashjit.attention(q, k, v, causal=False, user_functions=mask_mod, user_args=[doc],
                               block_mask=blocks)
        self.assertIn("block_mask", caught.exception.message)

    def test_relative_position_bias_against_float64(self):
        torch.manual_seed(22)
        bias = flashjit.UserFunctions(score_mod=RELATIVE_BIAS)
        heads = 8
        table = torch.randn(heads, 2 * MAX_DISTANCE + 1, device="cuda")
        for sq, sk, softcap in ((300, 300, 0.0), (200, 333, 0.0), (256, 256, 20.0)):
            with self.subTest(sq=sq, sk=sk, softcap=softcap):
                q, k, v = rand(1, sq, heads, 128), rand(1, sk, 2, 128), rand(1, sk, 2, 128)
                out, lse = flashjit.attention(q, k, v, causal=True, softcap=softcap,
                                              return_lse=True, user_functions=bias,
                                              user_args=[table])
                # q_idx and kv_idx are positions in the sequence; the score comes capped.
                ref, ref_lse = reference64(q, k, v, bias=relative_bias(table, sq, sk),
                                           causal=True, softcap=softcap)
                self.check(out, ref)
                finite = ref_lse.isfinite()
                self.assertLess((lse.double() - ref_lse)[finite].abs().max().item(), 1e-3)

    def test_backward_against_float64_autograd(self):
        # Autograd through user functions: a document mask (with and without its block mask,
        # which changes no gradient) and the relative bias with its derivative, against
        # reference64's float64 autograd; GQA, causal.
        torch.manual_seed(24)
        mask = flashjit.UserFunctions(mask_mod=DOC_MASK)
        bias = flashjit.UserFunctions(score_mod=RELATIVE_BIAS, score_mod_grad=RELATIVE_BIAS_GRAD)
        table = torch.randn(4, 2 * MAX_DISTANCE + 1, device="cuda")
        doc = documents(2, SEQLEN, 7, seed=5)
        visible = (doc[:, :, None] == doc[:, None, :])[:, None]
        for d in (64, 128):
            q, k, v = rand(2, SEQLEN, 4, d), rand(2, SEQLEN, 2, d), rand(2, SEQLEN, 2, d)
            dout = rand(2, SEQLEN, 4, d)
            masked = dict(causal=True, user_functions=mask, user_args=[doc])
            cases = [("document mask", masked, dict(visible=visible)),
                     ("relative bias", dict(causal=True, user_functions=bias, user_args=[table]),
                      dict(bias=relative_bias(table, SEQLEN, SEQLEN)))]
            try:
                blocks = flashjit.create_block_mask(q, k, v, same_for_all_heads=True, **masked)
                cases.append(("document mask, block mask", dict(block_mask=blocks, **masked),
                              dict(visible=visible)))
                # With the backward's maps too: autograd's backward skips the hidden tiles.
                both = flashjit.create_block_mask(q, k, v, same_for_all_heads=True,
                                                  backward=True, **masked)
                steps = both.backward_counts()
                self.assertLess(steps["full"] + steps["partial"], steps["total"])
                self.assertIsNone(blocks.backward_counts())
                # By default the maps come with inputs that require grad.
                wanting = [t.detach().requires_grad_() for t in (q, k, v)]
                self.assertIsNotNone(flashjit.create_block_mask(
                    *wanting, same_for_all_heads=True, **masked).backward_counts())
                cases.append(("document mask, block mask with backward", dict(block_mask=both,
                                                                              **masked),
                              dict(visible=visible)))
            except flashjit.InvalidArgumentError:
                pass  # no block masks on this GPU's family: the other cases still run
            for name, kwargs, ref_kwargs in cases:
                with self.subTest(d=d, functions=name):
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    got = torch.autograd.grad(flashjit.attention(*leaves, **kwargs), leaves, dout)
                    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                    ref = reference64(*ref_leaves, causal=True, **ref_kwargs)[0]
                    want = torch.autograd.grad(ref, ref_leaves, dout.double())
                    for grad_name, g, w in zip(("dq", "dk", "dv"), got, want):
                        self.assertFalse(g.isnan().any().item(), grad_name)
                        err = (g.double() - w).abs().max().item() / max(1.0, w.abs().max().item())
                        self.assertLess(err, 2e-2, f"{grad_name}: relative error {err}")
        # A score_mod without its derivative: the forward runs, its backward says what is missing.
        no_grad = flashjit.UserFunctions(score_mod=RELATIVE_BIAS)
        leaf = q.detach().requires_grad_()
        out = flashjit.attention(leaf, k, v, causal=True, user_functions=no_grad,
                                 user_args=[table])
        with self.assertRaisesRegex(NotImplementedError, "score_mod_grad"):
            out.sum().backward()

    def test_varlen_and_kvcache(self):
        torch.manual_seed(23)
        bias = flashjit.UserFunctions(score_mod=RELATIVE_BIAS)
        table = torch.randn(8, 2 * MAX_DISTANCE + 1, device="cuda")
        lengths = [37, 300, 129]
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                          device="cuda")
        total = sum(lengths)
        q, k, v = rand(total, 8, 128), rand(total, 2, 128), rand(total, 2, 128)
        out = flashjit.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                        user_functions=bias, user_args=[table])
        for i, n in enumerate(lengths):
            s = slice(int(cu[i]), int(cu[i]) + n)
            ref = reference64(q[None, s], k[None, s], v[None, s],
                              bias=relative_bias(table, n, n), causal=True)[0]
            self.check(out[None, s], ref)
        # A decode step over a dense cache with per-sequence lengths.
        used = torch.tensor([700, 64, 1000], dtype=torch.int32, device="cuda")
        q1, k_cache, v_cache = rand(3, 1, 8, 128), rand(3, 1024, 2, 128), rand(3, 1024, 2, 128)
        step = flashjit.attention_with_kvcache(q1, k_cache, v_cache, seqused_k=used, causal=True,
                                               user_functions=bias, user_args=[table])
        for b in range(3):
            n = int(used[b])
            # The query is position 0 of its sequence of one row.
            ref = reference64(q1[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n],
                              bias=relative_bias(table, 1, n), causal=True)[0]
            self.check(step[b:b + 1], ref)

    def test_compile_fullgraph_and_cuda_graph(self):
        mask = flashjit.UserFunctions(mask_mod=DOC_MASK)
        doc = documents(1, SEQLEN, 5, seed=9)
        q, k, v = rand(1, SEQLEN, 4, 64), rand(1, SEQLEN, 4, 64), rand(1, SEQLEN, 4, 64)

        def block(q, k, v, doc):
            return flashjit.attention(q * 2, k, v, causal=True, user_functions=mask,
                                      user_args=[doc]).float().sum(-1)

        compiled = torch.compile(block, fullgraph=True)
        torch.testing.assert_close(compiled(q, k, v, doc), block(q, k, v, doc), atol=1e-3,
                                   rtol=1e-3)
        flashjit.attention(q, k, v, causal=True, user_functions=mask, user_args=[doc])  # warm
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = flashjit.attention(q, k, v, causal=True, user_functions=mask, user_args=[doc])
        doc.copy_(documents(1, SEQLEN, 3, seed=10))  # the graph reads the ids as they are now
        graph.replay()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(out, flashjit.attention(q, k, v, causal=True,
                                                            user_functions=mask,
                                                            user_args=[doc])))

    def test_opcheck_with_user_functions(self):
        bias = flashjit.UserFunctions(score_mod=RELATIVE_BIAS)
        table = torch.randn(2, 2 * MAX_DISTANCE + 1, device="cuda")
        q, k, v = rand(1, 64, 2, 64), rand(1, 64, 2, 64), rand(1, 64, 2, 64)
        torch.library.opcheck(torch.ops.flashjit.attention.default,
                              (q, k, v, True, 0.0, True, -1, -1, 0.0, None, None, 0, None,
                               bias.hash, [table], [0], 0, False))
        # With its derivative, the backward op and the forward's autograd formula too.
        with_grad = flashjit.UserFunctions(score_mod=RELATIVE_BIAS,
                                           score_mod_grad=RELATIVE_BIAS_GRAD)
        out, lse = flashjit.attention(q, k, v, causal=True, return_lse=True,
                                      user_functions=with_grad, user_args=[table])
        torch.library.opcheck(torch.ops.flashjit.attention_backward.default,
                              (q, k, v, out, rand(1, 64, 2, 64), lse, True, 0.0, True, 0.0, -1,
                               -1, 0, None, None, with_grad.hash, [table], [0]))
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(torch.ops.flashjit.attention.default,
                              (*inputs, True, 0.0, False, -1, -1, 0.0, None, None, 0, None,
                               with_grad.hash, [table], [0], 0, True))

    def test_nvrtc_errors_name_the_users_line(self):
        broken = flashjit.UserFunctions(score_mod=(
            "__device__ float score_mod(float s, int b, int h, int q, int k,\n"
            "                           const flashjit::UserArgs& a) {\n"
            "  return s + not_declared;\n}\n"))
        q = rand(1, 64, 2, 64)
        with self.assertRaises(flashjit.CompileError) as caught:
            flashjit.attention(q, q, q, user_functions=broken)
        self.assertIn("score_mod(3): error", caught.exception.message)
        self.assertIn("not_declared", caught.exception.message)


if __name__ == "__main__":
    unittest.main()
