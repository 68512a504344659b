"""CPU tests of the ring's partition and step plans (zigzag.py): every (query, key) pair the mask
allows is computed exactly once over the ring, none it forbids, and the causal work is balanced.
Run: python3 examples/ring_attention/test_zigzag.py (ctest: ring_attention_plan)."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zigzag  # noqa: E402


class Partition(unittest.TestCase):
    def test_ranks_hold_every_position_once(self):
        for world in (1, 2, 3, 4, 8):
            seqlen = 2 * world * 5
            held = [p for r in range(world) for p in zigzag.global_positions(seqlen, world, r)]
            self.assertEqual(sorted(held), list(range(seqlen)))

    def test_chunks_mirror(self):
        self.assertEqual(zigzag.global_chunks(4, 0), (0, 7))
        self.assertEqual(zigzag.global_chunks(4, 3), (3, 4))
        self.assertEqual(zigzag.split(list(range(8)), 2, 1), [2, 3, 4, 5])

    def test_bad_splits_name_the_argument(self):
        with self.assertRaisesRegex(ValueError, "seqlen is 10: expected a positive multiple of 2 \\* world = 4"):
            zigzag.chunk_length(10, 2)
        with self.assertRaisesRegex(ValueError, "world is 0"):
            zigzag.chunk_length(8, 0)
        with self.assertRaisesRegex(ValueError, "rank is 2"):
            zigzag.global_chunks(2, 2)


class Steps(unittest.TestCase):
    def covered(self, seqlen, world, rank, causal):
        """Every pair the rank's steps compute, counting repeats."""
        pairs = []
        for step in range(world):
            pairs.extend(zigzag.block_pairs(seqlen, world, rank, step, causal))
        return pairs

    def test_every_allowed_pair_once_and_no_other(self):
        for world in (1, 2, 3, 4, 5, 8):
            seqlen = 2 * world * 3
            for causal in (False, True):
                for rank in range(world):
                    pairs = self.covered(seqlen, world, rank, causal)
                    want = {(q, k) for q in zigzag.global_positions(seqlen, world, rank)
                            for k in range(seqlen) if not causal or k <= q}
                    self.assertEqual(len(pairs), len(set(pairs)), (world, rank, causal))
                    self.assertEqual(set(pairs), want, (world, rank, causal))

    def test_no_call_computes_a_masked_block(self):
        # Each call's pairs are all allowed: a full block never spans the diagonal.
        for world in (2, 4, 8):
            seqlen = 2 * world * 4
            for rank in range(world):
                for step in range(world):
                    block = zigzag.step_block(seqlen, world, rank, step, True)
                    size = (block.q_end - block.q_start) * (block.kv_end - block.kv_start)
                    pairs = zigzag.block_pairs(seqlen, world, rank, step, True)
                    self.assertEqual(len(pairs), size // 2 + (block.q_end - block.q_start) // 2
                                     if block.causal else size, (world, rank, step))

    def test_causal_work_is_balanced(self):
        for world in (2, 4, 8):
            seqlen = 2 * world * 16
            work = [len(self.covered(seqlen, world, r, True)) for r in range(world)]
            self.assertEqual(len(set(work)), 1, work)
            # A step past the first is half of a full step: one chunk pair of two.
            c = zigzag.chunk_length(seqlen, world)
            for rank in range(world):
                for step in range(1, world):
                    b = zigzag.step_block(seqlen, world, rank, step, True)
                    self.assertEqual((b.q_end - b.q_start) * (b.kv_end - b.kv_start), 2 * c * c)


if __name__ == "__main__":
    unittest.main()
