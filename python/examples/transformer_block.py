"""A small pre-norm transformer block (GQA attention with causal masking, MLP) in bf16, run
twice: with torch's scaled_dot_product_attention, then with flashjit.attention swapped in. The
outputs and a next-token cross-entropy loss must match within bf16 noise, and so must the
gradients of every parameter after loss.backward() (flashjit.attention's autograd runs its
backward kernels).

    PYTHONPATH=python FLASHJIT_LIBRARY=/path/libflashjit.so.0 \
        python3 python/examples/transformer_block.py
"""

import torch
import torch.nn.functional as F
from torch import nn

import flashjit


def sdpa(q, k, v):
    # SDPA takes [batch, heads, seqlen, head_dim]; enable_gqa needs torch >= 2.5, so repeat.
    groups = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def flashjit_attention(q, k, v):
    return flashjit.attention(q, k, v, causal=True)  # [batch, seqlen, heads, head_dim] as is


class Block(nn.Module):
    def __init__(self, dim=1024, heads=16, kv_heads=4, attention=sdpa):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.attention = attention

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim,
             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim)  # strided views: no copy for flashjit
        k = k.view(b, s, self.kv_heads, self.head_dim)
        v = v.view(b, s, self.kv_heads, self.head_dim)
        x = x + self.proj(self.attention(q, k, v).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def main():
    torch.manual_seed(0)
    vocab, dim = 4096, 1024
    embed = nn.Embedding(vocab, dim).cuda().bfloat16()
    block = Block(dim).cuda().bfloat16()
    head = nn.Linear(dim, vocab, bias=False).cuda().bfloat16()
    tokens = torch.randint(0, vocab, (4, 512), device="cuda")

    def run(attention):
        block.attention = attention
        hidden = block(embed(tokens[:, :-1]))
        logits = head(hidden).float()
        return hidden, F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    with torch.inference_mode():
        hidden_ref, loss_ref = run(sdpa)
        hidden, loss = run(flashjit_attention)
    diff = (hidden.float() - hidden_ref.float()).abs()
    scale = hidden_ref.float().abs().max().item()
    print(f"block output: max |diff| {diff.max().item():.4f} (of max |x| {scale:.2f}), mean "
          f"{diff.mean().item():.5f}")
    print(f"loss: SDPA {loss_ref.item():.5f}, flashjit {loss.item():.5f}, "
          f"|diff| {abs(loss.item() - loss_ref.item()):.5f}")
    # bf16 noise: the two attentions round differently; the residual stream keeps magnitudes.
    ok = diff.max().item() <= 0.02 * scale and abs(loss.item() - loss_ref.item()) <= 0.01

    # A training step's gradients, through SDPA's backward and then flashjit's.
    def gradients(attention):
        block.zero_grad(set_to_none=True)
        run(attention)[1].backward()
        return {name: p.grad.float() for name, p in block.named_parameters()}

    grads_ref, grads = gradients(sdpa), gradients(flashjit_attention)
    errors = {n: ((grads[n] - grads_ref[n]).norm() / grads_ref[n].norm()).item()
              for n in grads_ref}
    where = max(errors, key=errors.get)
    worst = errors[where]
    print(f"gradients: worst relative L2 difference {worst:.4f} ({where}) over "
          f"{len(grads_ref)} parameters")
    ok = ok and worst <= 0.05
    print("OK: matches within bf16 noise" if ok else "MISMATCH beyond bf16 noise")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
