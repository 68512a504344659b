"""Where a sequence lives on a ring of N ranks, and what each ring step computes (no torch here:
the CPU tests check it against a brute-force mask).

The sequence (seqlen divisible by 2N) is cut into 2N equal chunks; rank r holds chunk r (its
"early" chunk) and chunk 2N-1-r (its "late" one), laid out [early; late] along the sequence. Under
a causal mask every rank then has the same work (zigzag ring attention). At ring step s rank r
holds the keys and values of rank src = (r - s) mod N, and one attention call covers the step:

- s = 0 (its own K/V): [early; late] against [early; late] with causal=True. In the local layout
  that mask is exactly the global one: the early chunk sees its own keys up to the diagonal and
  none of the late chunk, the late chunk sees all of the early chunk and its own up to the
  diagonal.
- src < r: both local chunks against the source's early chunk, full (its late chunk lies after
  both of ours).
- src > r: our late chunk against both of the source's chunks, full (our early chunk lies before
  both of them).

Without a causal mask every step is [early; late] against [early; late], full. So no step computes
a masked-out block, and a causal step past the first does exactly half of a full one.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One attention call of a ring step: local query rows [q_start, q_end) against the source's
    local key rows [kv_start, kv_end) (both in [early; late] layout), causal or full."""
    q_start: int
    q_end: int
    kv_start: int
    kv_end: int
    causal: bool


def check_split(seqlen, world):
    if world < 1:
        raise ValueError(f"world is {world}: expected at least 1 rank")
    if seqlen <= 0 or seqlen % (2 * world) != 0:
        raise ValueError(f"seqlen is {seqlen}: expected a positive multiple of 2 * world "
                         f"= {2 * world} (two equal chunks a rank)")


def chunk_length(seqlen, world):
    check_split(seqlen, world)
    return seqlen // (2 * world)


def global_chunks(world, rank):
    """The global chunk indices rank `rank` holds, in its local order (early, late)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank is {rank}: expected 0 <= rank < world = {world}")
    return rank, 2 * world - 1 - rank


def global_positions(seqlen, world, rank):
    """The global token positions of the rank's local rows, in order."""
    c = chunk_length(seqlen, world)
    return [chunk * c + i for chunk in global_chunks(world, rank) for i in range(c)]


def step_source(world, rank, step):
    """Whose keys and values rank `rank` holds at ring step `step` (0 <= step < world)."""
    return (rank - step) % world


def step_block(seqlen, world, rank, step, causal):
    """The one attention call of ring step `step` on rank `rank`."""
    c = chunk_length(seqlen, world)
    src = step_source(world, rank, step)
    if not causal:
        return Block(0, 2 * c, 0, 2 * c, False)
    if step == 0:
        return Block(0, 2 * c, 0, 2 * c, True)
    if src < rank:
        return Block(0, 2 * c, 0, c, False)
    return Block(c, 2 * c, 0, 2 * c, False)


def block_pairs(seqlen, world, rank, step, causal):
    """The global (query, key) position pairs the step's call lets through (causal blocks
    bottom-right aligned, as flashjit's causal is): what the CPU tests compare with the mask."""
    block = step_block(seqlen, world, rank, step, causal)
    q_pos = global_positions(seqlen, world, rank)[block.q_start:block.q_end]
    kv_pos = global_positions(seqlen, world, step_source(world, rank, step))[
        block.kv_start:block.kv_end]
    diagonal = len(kv_pos) - len(q_pos)
    return {(q, k) for i, q in enumerate(q_pos) for j, k in enumerate(kv_pos)
            if not block.causal or j <= i + diagonal}


def split(sequence, world, rank):
    """The rank's rows of a per-position list (tests; the torch side slices tensors the same
    way)."""
    return [sequence[p] for p in global_positions(len(sequence), world, rank)]
