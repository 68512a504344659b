// A learned relative-position bias (T5, Swin): each query head adds a bias to the score that
// depends on how far the key is from the query, clamped to kMaxDistance on either side.
//
//   flashjit precompile --score-mod examples/user_functions/relative_position_bias.cu ...
//
// args.ptr[0]: const float table[heads_q * (2 * kMaxDistance + 1)] in device memory, natural-log
// units (added to softmax_scale · q·k); entry head * (2 * kMaxDistance + 1) + kMaxDistance + d is
// the bias at distance d = kv_idx - q_idx (negative: keys before the query).
constexpr int kMaxDistance = 128;

__device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,
                           const flashjit::UserArgs& args) {
  const float* table = static_cast<const float*>(args.ptr[0]);
  int distance = kv_idx - q_idx;
  distance = distance < -kMaxDistance ? -kMaxDistance : distance;
  distance = distance > kMaxDistance ? kMaxDistance : distance;
  return score + table[head * (2 * kMaxDistance + 1) + kMaxDistance + distance];
}
