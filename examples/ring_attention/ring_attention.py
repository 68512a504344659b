"""Ring attention (context parallelism) on flashjit's kernels: one sequence split over N ranks in
zigzag order (zigzag.py), K/V passed around the ring while each rank computes on the block it
holds, partial results merged with flashjit.merge_attention_states; the backward passes K/V around
again, with their dK/dV accumulators travelling beside them until they are home.

The algorithm is written once, per rank, as a generator that yields the tensors it sends to the
next rank and is resumed with a `wait()` that returns what the previous rank sent. Two drivers run
it: `run_on_ring` over torch.distributed (NCCL isend/irecv, started before the step's compute so
the transfer hides under it) and `run_simulated`, which runs N ranks' generators in lockstep on one
device (the single-GPU check of the same code).

Tensors are [batch, rows, heads, head_dim] (rows: the rank's [early; late] chunks), bf16 or fp16,
on CUDA; the LSE is fp32 [batch, heads, rows].
"""

import math

import torch

import flashjit
import zigzag


def _world_rows(q, world):
    rows = q.shape[1]
    if rows % 2:
        raise ValueError(f"q has {rows} rows on this rank: expected two equal chunks (an even "
                         "number; zigzag.split makes them)")
    return rows * world


def _merge_rows(out, lse, rows, part_out, part_lse):
    """Merges a partial result over other keys into rows [start, end) of (out, lse)."""
    start, end = rows
    if out is None:  # the first step covers every local row
        return part_out, part_lse
    merged_out, merged_lse = flashjit.merge_attention_states(
        out[:, start:end].contiguous(), lse[:, :, start:end].contiguous(), part_out, part_lse)
    out[:, start:end] = merged_out
    lse[:, :, start:end] = merged_lse
    return out, lse


def forward_steps(q, k, v, world, rank, causal, softmax_scale):
    """This rank's forward: returns (out, lse) over every key of the sequence."""
    seqlen = _world_rows(q, world)
    out = lse = None
    kv = (k, v)
    for step in range(world):
        wait = (yield kv) if step < world - 1 else None  # the next rank's K/V start moving
        block = zigzag.step_block(seqlen, world, rank, step, causal)
        part_out, part_lse = flashjit.attention(
            q[:, block.q_start:block.q_end], kv[0][:, block.kv_start:block.kv_end],
            kv[1][:, block.kv_start:block.kv_end], causal=block.causal,
            softmax_scale=softmax_scale, return_lse=True)
        out, lse = _merge_rows(out, lse, (block.q_start, block.q_end), part_out, part_lse)
        if wait is not None:
            kv = tuple(wait())
    return out, lse


def backward_steps(q, k, v, out, lse, dout, world, rank, causal, softmax_scale):
    """This rank's backward: returns (dq, dk, dv) for its own rows of q, k and v. Each step's
    gradients use the whole sequence's out and LSE, so the partial dQ, dK and dV just add up;
    dK and dV of the K/V a rank holds travel with it and come home after `world` hops."""
    seqlen = _world_rows(q, world)
    accumulate = torch.promote_types(q.dtype, torch.float32)  # fp32 for bf16 / fp16 inputs
    dq = torch.zeros(q.shape, device=q.device, dtype=accumulate)
    kv = (k, v)
    dkv = (torch.zeros(k.shape, device=k.device, dtype=accumulate),
           torch.zeros(v.shape, device=v.device, dtype=accumulate))
    lse = lse.contiguous()
    for step in range(world):
        wait_kv = (yield kv) if step < world - 1 else None
        block = zigzag.step_block(seqlen, world, rank, step, causal)
        rows, keys = slice(block.q_start, block.q_end), slice(block.kv_start, block.kv_end)
        part_dq, part_dk, part_dv = flashjit.attention_backward(
            q[:, rows], kv[0][:, keys], kv[1][:, keys], out[:, rows], dout[:, rows],
            lse[:, :, rows].contiguous(), causal=block.causal, softmax_scale=softmax_scale)
        dq[:, rows] += part_dq
        dkv[0][:, keys] += part_dk
        dkv[1][:, keys] += part_dv
        if world > 1:
            wait_dkv = yield dkv  # to the next rank: after `world` hops, back with its owner
            if wait_kv is not None:
                kv = tuple(wait_kv())
            dkv = tuple(wait_dkv())
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def run_on_ring(steps, group=None):
    """Drives a forward_steps / backward_steps generator over torch.distributed: each yield sends
    its tensors to rank + 1 and receives the same shapes from rank - 1 (NCCL isend / irecv)."""
    import torch.distributed as dist
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    to_next = dist.get_global_rank(group, (rank + 1) % world) if group else (rank + 1) % world
    from_prev = dist.get_global_rank(group, (rank - 1) % world) if group else (rank - 1) % world
    try:
        sending = next(steps)
        while True:
            received = [torch.empty_like(t) for t in sending]
            ops = [dist.P2POp(dist.isend, t, to_next, group) for t in sending]
            ops += [dist.P2POp(dist.irecv, t, from_prev, group) for t in received]
            requests = dist.batch_isend_irecv(ops)

            def wait(requests=requests, received=received):
                for request in requests:
                    request.wait()
                return received
            sending = steps.send(wait)
    except StopIteration as done:
        return done.value


def run_simulated(all_steps):
    """Drives one generator per rank in lockstep on one device: what rank r yields, rank r + 1
    receives. Returns every rank's result."""
    world = len(all_steps)
    results = [None] * world
    sending = [None] * world
    for r, steps in enumerate(all_steps):
        try:
            sending[r] = next(steps)
        except StopIteration as done:
            results[r] = done.value
    while any(s is not None for s in sending):
        if any(s is None for s in sending):
            raise RuntimeError("the ranks' steps fell out of lockstep: every rank must exchange "
                               "the same number of times")
        received = [sending[(r - 1) % world] for r in range(world)]
        for r, steps in enumerate(all_steps):
            try:
                sending[r] = steps.send(lambda got=received[r]: got)
            except StopIteration as done:
                sending[r], results[r] = None, done.value
    return results


class RingAttention(torch.autograd.Function):
    """out = attention of this rank's query rows over the whole sequence, with a backward, on a
    torch.distributed group (NCCL)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, group):
        import torch.distributed as dist
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        out, lse = run_on_ring(forward_steps(q, k, v, world, rank, causal, scale), group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.group = causal, scale, group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        import torch.distributed as dist
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        dq, dk, dv = run_on_ring(backward_steps(q, k, v, out, lse, dout.contiguous(), world,
                                                rank, ctx.causal, ctx.scale), ctx.group)
        return dq, dk, dv, None, None, None


def ring_attention(q, k, v, causal=False, softmax_scale=None, group=None):
    """This rank's (out, lse) of ring attention; differentiable in q, k and v."""
    return RingAttention.apply(q, k, v, causal, softmax_scale, group)


def split_rows(x, world, rank, dim=1):
    """The rank's zigzag rows of a whole-sequence tensor (dim: the sequence's)."""
    c = zigzag.chunk_length(x.shape[dim], world)
    early, late = zigzag.global_chunks(world, rank)
    return torch.cat([x.narrow(dim, early * c, c), x.narrow(dim, late * c, c)], dim).contiguous()


def join_rows(parts, dim=1):
    """The whole-sequence tensor from every rank's rows (split_rows's inverse)."""
    world = len(parts)
    c = parts[0].shape[dim] // 2
    chunks = [None] * (2 * world)
    for rank, part in enumerate(parts):
        early, late = zigzag.global_chunks(world, rank)
        chunks[early], chunks[late] = part.narrow(dim, 0, c), part.narrow(dim, c, c)
    return torch.cat(chunks, dim)


def simulate(q, k, v, dout, world, causal=False, softmax_scale=None):
    """The ring's forward and backward for `world` ranks on one device, from whole-sequence
    tensors: returns whole-sequence (out, lse, dq, dk, dv), to compare with one flashjit call."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    parts = [[split_rows(x, world, r) for x in (q, k, v, dout)] for r in range(world)]
    forward = run_simulated([forward_steps(p[0], p[1], p[2], world, r, causal, scale)
                             for r, p in enumerate(parts)])
    backward = run_simulated([
        backward_steps(p[0], p[1], p[2], forward[r][0], forward[r][1], p[3], world, r, causal,
                       scale) for r, p in enumerate(parts)])
    out = join_rows([f[0] for f in forward])
    lse = join_rows([f[1] for f in forward], dim=2)
    dq, dk, dv = (join_rows([b[i] for b in backward]) for i in range(3))
    return out, lse, dq, dk, dv
