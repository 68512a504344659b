// Prefix-LM masking (T5's prefix LM, PaliGemma): the first prefix[batch] tokens of a sequence (a
// prompt, an image) are seen by every query, the rest causally. Use with ForwardOptions::causal =
// false: this mask is the causal part too.
//
//   flashjit precompile --mask-mod examples/user_functions/prefix_lm.cu ...
//
// args.ptr[0]: const int32 prefix[batch] in device memory, the prefix length of each sequence.
// Query and key positions are within the sequence (self-attention: seqlen_q == seqlen_k).
__device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,
                         const flashjit::UserArgs& args) {
  const int* prefix = static_cast<const int*>(args.ptr[0]);
  return kv_idx < prefix[batch] || kv_idx <= q_idx;
}
