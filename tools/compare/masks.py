"""The bottom-right causal mask (ours and FlashAttention's), counted."""
def visible_pairs(seqlen_q, seqlen_k, causal):
    """(query, key) pairs the bottom-right causal mask lets through, per (batch, head)."""
    if not causal:
        return seqlen_q * seqlen_k
    offset = seqlen_k - seqlen_q
    return sum(min(seqlen_k, max(0, i + offset + 1)) for i in range(seqlen_q))
