// Decode attention over the paged KV cache on the CPU: one query token per sequence.
//
// The torch path would gather every sequence's blocks into a padded copy before a
// batched matmul, moving the whole KV cache through memory three times per layer.
// This kernel reads each key and value row once, straight from its block, and keeps
// a sequence's scores in a small buffer; query heads that share a KV head (GQA) read
// the same row.
// Sequences are split across torch's intra-op threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "load_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

template <typename scalar_t>
void decode_attention_kernel(
    const at::Tensor& query,         // [num_seqs, num_heads, head_dim]
    const at::Tensor& k_cache,       // [num_blocks, block_size, num_kv_heads, head_dim]
    const at::Tensor& v_cache,       // same
    const at::Tensor& block_tables,  // [num_seqs, max_blocks] int32
    const at::Tensor& context_lens,  // [num_seqs] int32
    at::Tensor& out,                 // [num_seqs, num_heads, head_dim]
    float scale,
    int64_t window) {                // keys older than `window` positions are skipped; 0 = none
  const int64_t num_seqs = query.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1);
  const int64_t num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t token_stride = num_kv_heads * head_dim;

  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();

  // One work item per sequence: a token's keys for all KV heads are one contiguous row,
  // so the cache is read in whole rows (block by block), which the prefetcher follows.
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(num_heads * head_dim), acc(num_heads * head_dim), row(token_stride);
    std::vector<float> scores, maxes(num_heads), sums(num_heads);
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t len = lens[seq];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - first;
      const int32_t* table = tables + seq * max_blocks;
      load_row(q_ptr + seq * num_heads * head_dim, q.data(), num_heads * head_dim);
      for (int64_t i = 0; i < num_heads * head_dim; ++i) q[i] *= scale;

      // Pass 1: every head's score against each key row, read once.
      scores.resize(num_heads * n);
      std::fill(maxes.begin(), maxes.end(), -std::numeric_limits<float>::infinity());
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = first + t;
        load_row(k_ptr + (static_cast<int64_t>(table[pos / block_size]) * block_size +
                          pos % block_size) * token_stride,
                 row.data(), token_stride);
        for (int64_t h = 0; h < num_heads; ++h) {
          const float* qh = q.data() + h * head_dim;
          const float* kh = row.data() + (h / group) * head_dim;
          float dot = 0.f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
          scores[h * n + t] = dot;
          maxes[h] = std::max(maxes[h], dot);
        }
      }
      for (int64_t h = 0; h < num_heads; ++h) {
        float sum = 0.f;
        float* s = scores.data() + h * n;
        for (int64_t t = 0; t < n; ++t) {
          s[t] = std::exp(s[t] - maxes[h]);
          sum += s[t];
        }
        sums[h] = sum;
      }

      // Pass 2: the probability-weighted sum of the value rows, each read once.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = first + t;
        load_row(v_ptr + (static_cast<int64_t>(table[pos / block_size]) * block_size +
                          pos % block_size) * token_stride,
                 row.data(), token_stride);
        for (int64_t h = 0; h < num_heads; ++h) {
          const float p = scores[h * n + t];
          const float* vh = row.data() + (h / group) * head_dim;
          float* a = acc.data() + h * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vh[d];
        }
      }
      scalar_t* o = out_ptr + seq * num_heads * head_dim;
      for (int64_t h = 0; h < num_heads; ++h) {
        const float inv = 1.f / sums[h];
        for (int64_t d = 0; d < head_dim; ++d) {
          o[h * head_dim + d] = static_cast<scalar_t>(acc[h * head_dim + d] * inv);
        }
      }
    }
  });
}

}  // namespace

at::Tensor decode_attention(
    const at::Tensor& query,
    const at::Tensor& k_cache,
    const at::Tensor& v_cache,
    const at::Tensor& block_tables,
    const at::Tensor& context_lens,
    double scale,
    int64_t window) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4, "query [seqs, heads, dim], cache 4-D");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.scalar_type() == k_cache.scalar_type(), "query and cache dtypes differ");
  TORCH_CHECK(query.size(1) % k_cache.size(2) == 0, "heads must be a multiple of KV heads");
  TORCH_CHECK(query.size(2) == k_cache.size(3), "query and cache head dims differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
              "block_tables and context_lens must be int32");
  auto q = query.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    decode_attention_kernel<scalar_t>(q, k_cache, v_cache, tables, lens, out,
                                      static_cast<float>(scale), window);
  });
  return out;
}

// Writes each token's key and value rows into its cache slot; slot -1 (padding) is
// skipped in the loop, so no pass over the slots is needed to find them first.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
              at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && key.stride(2) == 1 && key.stride(1) == key.size(2) &&
                  value.stride(2) == 1 && value.stride(1) == value.size(2),
              "key/value must be [tokens, kv_heads, head_dim] with contiguous heads");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() &&
                  value.scalar_type() == v_cache.scalar_type(),
              "key/value and cache dtypes differ");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
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
