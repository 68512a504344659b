"""GPU tests of the torch entry points: numerics against float32 references (SDPA with explicit
masks), torch.compile(fullgraph=True), CUDA-graph capture, GQA, causal, windows, softcap, sinks,
varlen, decode over dense and paged caches, merge_attention_states, errors. Without torch or a
GPU every test skips, saying why.

On a GPU machine with torch (no install needed):
    PYTHONPATH=python FLASHJIT_LIBRARY=/path/libflashjit.so.0 \
        python3 python/tests/run.py python/tests/test_gpu.py
"""

import importlib.util
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
                              (q, k, v, True, 0.0, True, -1, -1, 0.0, None, None, 0, None))

    def test_errors_carry_the_library_message(self):
        q = rand(1, 64, 3, 64)
        k = rand(1, 64, 2, 64)
        with self.assertRaises(flashjit.InvalidArgumentError) as caught:
            flashjit.attention(q, k, k)
        self.assertIn("heads", caught.exception.message)
        with self.assertRaisesRegex(ValueError, "on cpu"):
            flashjit.attention(q.cpu(), k, k)

    def test_backward_raises(self):
        q = rand(1, 64, 2, 64).requires_grad_()
        out = flashjit.attention(q, q, q)
        with self.assertRaisesRegex(NotImplementedError, "backward kernels do not exist yet"):
            out.float().sum().backward()


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


if __name__ == "__main__":
    unittest.main()
