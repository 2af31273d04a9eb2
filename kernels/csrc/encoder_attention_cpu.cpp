// Attention within an encoder's segments of one length (a vision tower's tiles), in
// fp32 with heads of 8, 16 or 32 dims: every token sees every token of its segment, no
// mask. Each (segment, head, 16 queries) is a task of equal work, the queries across
// the lanes (query_lanes_f32.h), the keys and values read where the merged projection
// left them. torch's scaled_dot_product_attention (kernels/encoder_attention.py) serves
// the other dtypes and sizes: at these, its flash kernel spends its time calling tiny
// matrix products (a tiny tower's 13 tiles x 4 heads of 64 patches: ~160 us a layer,
// here ~60).

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>

#include "query_lanes_f32.h"

bool encoder_attention_available() {
#if defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

#if defined(__AVX512BW__)
namespace {

template <int HEAD_DIM>
void attend_segments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, float scale,
                     at::Tensor& out) {
  const int64_t segments = q.size(0), heads = q.size(1), length = q.size(2);
  const int64_t query_tiles = (length + kQueryTile - 1) / kQueryTile;
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k.data_ptr<float>();
  const float* v_ptr = v.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t out_stride = heads * HEAD_DIM;  // a token's row: its heads side by side
  at::parallel_for(0, segments * heads * query_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task % query_tiles, head = task / query_tiles % heads;
      const int64_t segment = task / query_tiles / heads;
      const int64_t first = tile * kQueryTile;
      const int64_t count = std::min<int64_t>(kQueryTile, length - first);
      auto row = [&](const at::Tensor& t, const float* base, int64_t token) {
        return base + segment * t.stride(0) + head * t.stride(1) + token * t.stride(2);
      };
      QueryLanesF32<HEAD_DIM> lanes(row(q, q_ptr, first), q.stride(2), count);
      lanes.attend(row(k, k_ptr, 0), row(v, v_ptr, 0), k.stride(2), length,
                   lanes.full_reach(length), scale, 0.f);
      lanes.write(out_ptr + (segment * length + first) * out_stride + head * HEAD_DIM,
                  out_stride);
    }
  });
}

}  // namespace
#endif

// q, k, v [segments, heads, length, head_dim] fp32 (views: each row's values
// contiguous; k's and v's rows equally apart) -> [segments, length, heads, head_dim],
// contiguous: softmax(q k^T * scale) v within each segment and head.
at::Tensor encoder_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale) {
  TORCH_CHECK(encoder_attention_available(), "built without AVX-512 (BW)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "fp32 q, k and v");
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
              "q, k and v [segments, heads, length, head_dim] alike");
  const int64_t head_dim = q.size(3), length = q.size(2);
  TORCH_CHECK(head_dim == 8 || head_dim == 16 || head_dim == 32, "head_dim 8, 16 or 32");
  TORCH_CHECK(length % kLaneKeys == 0, "a segment's length a multiple of 8");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 &&
                  k.stride(2) == v.stride(2),
              "rows of contiguous values; k's and v's rows equally apart");
  auto out = tensors::empty({q.size(0), length, q.size(1), head_dim}, q.options());
#if defined(__AVX512BW__)
  const float scale_f = static_cast<float>(scale);
  switch (head_dim) {
    case 8: attend_segments<8>(q, k, v, scale_f, out); break;
    case 16: attend_segments<16>(q, k, v, scale_f, out); break;
    default: attend_segments<32>(q, k, v, scale_f, out); break;
  }
#endif
  return out;
}
