"""The bottom-right causal mask (ours and FlashAttention's), counted, and how --case spells it."""

# The causal field of a --case spelling (kv:, varlen:; the dense form takes a few more words).
CAUSAL_WORDS = {"1": True, "true": True, "causal": True, "0": False, "false": False,
                "full": False}


def visible_pairs(seqlen_q, seqlen_k, causal):
    """(query, key) pairs the bottom-right causal mask lets through, per (batch, head)."""
    if not causal:
        return seqlen_q * seqlen_k
    offset = seqlen_k - seqlen_q
    return sum(min(seqlen_k, max(0, i + offset + 1)) for i in range(seqlen_q))
