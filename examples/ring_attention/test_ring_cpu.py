"""The ring's algorithm on the CPU: ring_attention.py's generators and both drivers' lockstep
logic, with flashjit's three calls stood in for by float64 math (same signatures), against one
whole-sequence attention and its autograd gradients. What it checks is the zigzag blocks, the LSE
merges and the dK/dV trip around the ring; the kernels themselves are the GPU tests' (and
run.py --simulate runs this same code on them). Skipped, saying so, without torch.
Run: python3 python/tests/run.py examples/ring_attention/test_ring_cpu.py (ctest:
ring_attention_cpu)."""

import math
import sys
import types
import unittest
from pathlib import Path

try:
    import torch
except ImportError:
    torch = None


def _scores(q, k, causal, scale):
    # [b, h, sq, sk]; causal bottom-right aligned, as flashjit's
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq).unsqueeze(1) + (sk - sq)
        s = s.masked_fill(torch.arange(sk).unsqueeze(0) > rows, float("-inf"))
    return s


def _attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse.unsqueeze(-1)), v)
    return (out, lse) if return_lse else out


def _attention_backward(q, k, v, out, dout, lse, *, causal=False, softmax_scale=None):
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(_scores(q, k, causal, scale) - lse.unsqueeze(-1))
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # [b, h, sq, 1]
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, v)
    ds = p * (dp - delta) * scale
    return (torch.einsum("bhqk,bkhd->bqhd", ds, k), torch.einsum("bhqk,bqhd->bkhd", ds, q),
            torch.einsum("bhqk,bqhd->bkhd", p, dout))


def _merge_attention_states(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.exp(lse_a - lse).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse_b - lse).transpose(1, 2).unsqueeze(-1)
    return out_a * wa + out_b * wb, lse


ra = None  # ring_attention, imported over the stand-ins (setUpClass)


@unittest.skipUnless(torch is not None, "torch is not installed")
class SimulatedRing(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global ra
        real = sys.modules.get("flashjit")
        sys.modules["flashjit"] = types.SimpleNamespace(
            attention=_attention, attention_backward=_attention_backward,
            merge_attention_states=_merge_attention_states)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        try:
            import ring_attention
        finally:
            if real is None:
                del sys.modules["flashjit"]
            else:
                sys.modules["flashjit"] = real
        ra = ring_attention

    def check(self, world, causal, seqlen=24, heads=2, head_dim=8, batch=2):
        g = torch.Generator().manual_seed(world * 10 + causal)
        q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.float64,
                                     generator=g) for _ in range(4))
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        want_out, want_lse = _attention(*leaves, causal=causal, return_lse=True)
        want_grads = torch.autograd.grad(want_out, leaves, dout)
        out, lse, dq, dk, dv = ra.simulate(q, k, v, dout, world, causal=causal)
        for name, got, want in (("out", out, want_out), ("lse", lse, want_lse),
                                ("dq", dq, want_grads[0]), ("dk", dk, want_grads[1]),
                                ("dv", dv, want_grads[2])):
            torch.testing.assert_close(got, want.detach(), rtol=1e-9, atol=1e-9,
                                       msg=lambda m: f"{name}, world {world}, causal {causal}: {m}")

    def test_every_ring_size_causal_or_not(self):
        for world in (1, 2, 3, 4, 6):
            for causal in (False, True):
                self.check(world, causal)

    def test_rows_split_and_join_back(self):
        x = torch.arange(2 * 3 * 4).reshape(2, 12, 1)  # 12 = 2 chunks a rank, 3 ranks, 2 tokens
        parts = [ra.split_rows(x, 3, r) for r in range(3)]
        self.assertEqual(parts[0][0, :, 0].tolist(), [0, 1, 10, 11])
        self.assertTrue(torch.equal(ra.join_rows(parts), x))

    def test_lockstep_is_enforced(self):
        def steps(n):
            for _ in range(n):
                yield ()
            return n
        with self.assertRaisesRegex(RuntimeError, "lockstep"):
            ra.run_simulated([steps(1), steps(2)])


if __name__ == "__main__":
    unittest.main()
