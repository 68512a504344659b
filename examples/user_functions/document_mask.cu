// Document masking (FlexAttention's document_mask): several documents packed into one sequence,
// each token attending only to tokens of its own document. Use with ForwardOptions::causal = true
// for causal attention within each packed document.
//
//   flashjit precompile --mask-mod examples/user_functions/document_mask.cu ...
//
// args.ptr[0]: const int32 doc_id[seqlen] in device memory, the document of each position (the
// same array for every sequence of the batch and every head). q_idx and kv_idx are positions
// within the sequence, so self-attention (seqlen_q == seqlen_k) reads one array for both.
// Tiles of keys that lie wholly in other documents are skipped when the forward is given a block
// mask (Engine::create_block_mask, same_for_all_heads and same_for_all_batches).
__device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,
                         const flashjit::UserArgs& args) {
  const int* doc_id = static_cast<const int*>(args.ptr[0]);
  return doc_id[q_idx] == doc_id[kv_idx];
}
