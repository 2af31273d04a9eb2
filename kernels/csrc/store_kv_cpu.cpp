// The KV store on the CPU: a step's new keys and values written into their slots of
// the paged cache (kernels/paged_attention_cpu.py), quantized as they are written where
// the cache is int8 (int8_kv_rows.h). The attention kernels read what it writes.

#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "int8_kv_rows.h"
#include "load_row.h"

using namespace int8_kv_rows;

namespace {

// One head's values (a key's rotated first where `rotate`) as int8 with their groups' fp16
// scales after them (kernels/kv_quant.py's rule, per group:
// scale = fp16(max|x| * (1 / 127)), q = round-half-even(x * (127 / max|x|)), a group of
// zeros all zeros).
template <typename scalar_t>
void quantize_head(const scalar_t* src, int8_t* dst, int64_t head_dim, bool rotate,
                   float* buffer) {
  load_row(src, buffer, head_dim);
  if (rotate) rotate_groups(buffer, head_dim);
  const int64_t group = scale_group(head_dim);
  for (int64_t g = 0; g * group < head_dim; ++g) {
    const float* x = buffer + g * group;
    float amax = 0.f;
    for (int64_t d = 0; d < group; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int64_t d = 0; d < group; ++d) {
      // nearbyint rounds half to even in the default rounding mode, as torch.round does.
      const float q = std::nearbyint(x[d] * inv);
      dst[g * group + d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
    }
    const c10::Half scale(amax * (1.f / 127.f));  // to nearest even, as torch's .half()
    std::memcpy(dst + head_dim + 2 * g, &scale, sizeof(scale));
  }
}

// store_kv into an int8 cache: each (token, KV head) row quantized as it is written.
void store_kv_int8(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
                   at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const int64_t tokens = key.size(0), heads = key.size(1), head_dim = key.size(2);
  const int64_t stride = head_dim + scale_elements<int8_t>(head_dim);  // a head's row
  const int64_t row = heads * stride;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  int8_t* k_dst = k_cache.data_ptr<int8_t>();
  int8_t* v_dst = v_cache.data_ptr<int8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "store_kv_int8", [&] {
    const scalar_t* k_src = key.data_ptr<scalar_t>();
    const scalar_t* v_src = value.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer(head_dim);
      for (int64_t t = begin; t < end; ++t) {
        if (slots[t] < 0) continue;
        for (int64_t h = 0; h < heads; ++h) {
          quantize_head(k_src + t * key.stride(0) + h * head_dim,
                        k_dst + slots[t] * row + h * stride, head_dim, rotates_keys(head_dim),
                        buffer.data());
          quantize_head(v_src + t * value.stride(0) + h * head_dim,
                        v_dst + slots[t] * row + h * stride, head_dim, false, buffer.data());
        }
      }
    });
  });
}

}  // namespace

// Writes each token's key and value rows into its cache slot (quantized where the cache
// is int8); slot -1 (padding) is skipped in the loop, so no pass over the slots is
// needed to find them first.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
              at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && key.stride(2) == 1 && key.stride(1) == key.size(2) &&
                  value.stride(2) == 1 && value.stride(1) == value.size(2),
              "key/value must be [tokens, kv_heads, head_dim] with contiguous heads");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  if (k_cache.scalar_type() == at::kChar) {
    TORCH_CHECK(v_cache.scalar_type() == at::kChar && key.scalar_type() == value.scalar_type() &&
                    k_cache.size(3) == key.size(2) + scale_elements<int8_t>(key.size(2)),
                "an int8 cache holds rows of head_dim values and their fp16 scales");
    store_kv_int8(key, value, k_cache, v_cache, slot_mapping);
    return;
  }
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() &&
                  value.scalar_type() == v_cache.scalar_type(),
              "key/value and cache dtypes differ");
  const int64_t tokens = key.size(0);
  const int64_t row = key.size(1) * key.size(2);  // bytes per slot / element size
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t element = key.element_size();
  const char* k_src = static_cast<const char*>(key.data_ptr());
  const char* v_src = static_cast<const char*>(value.data_ptr());
  char* k_dst = static_cast<char*>(k_cache.data_ptr());
  char* v_dst = static_cast<char*>(v_cache.data_ptr());
  const int64_t k_stride = key.stride(0) * element, v_stride = value.stride(0) * element;
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      std::memcpy(k_dst + slots[t] * row * element, k_src + t * k_stride, row * element);
      std::memcpy(v_dst + slots[t] * row * element, v_src + t * v_stride, row * element);
    }
  });
}
