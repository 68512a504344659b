// The derivative of relative_position_bias.cu's score_mod with respect to the score, which the
// backward needs (flashjit::UserFunctions' score_mod_grad): the bias does not depend on the score,
// so d score_mod / d score = 1. (The table is a constant to the backward: no gradient flows into
// it.)
//
//   flashjit precompile --score-mod examples/user_functions/relative_position_bias.cu \
//       --score-mod-grad examples/user_functions/relative_position_bias_grad.cu ...
__device__ float score_mod_grad(float score, int batch, int head, int q_idx, int kv_idx,
                                const flashjit::UserArgs& args) {
  return 1.f;
}
