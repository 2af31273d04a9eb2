// LoRA's updates of a step's rows, grouped by adapter (SGMV on the CPU): after the base
// projection ran once over every row, each adapter's rows get
//   out[rows, o : o + w] += (x[rows] @ A^T)[:, k : k + r] @ B^T
// for each part (o, k, B [w, r]) of its weights (kernels/lora.py).
//
// Two passes, each one parallel loop over all groups' work: the shrink reads each row of
// A once per adapter (not once per row) and dots it with the adapter's rows of x, kept
// in fp32; the expand reads each row of B once per adapter and adds its dot with the
// shrunk rows into out, rounded once. At a decode step's few rows the work is reading
// A and B: a rank-16 adapter on every projection of a 135M model is ~10 MB in bf16,
// in short arrays: each item's weights are asked for kAhead items ahead (at batch 16
// with 8 rank-8 adapters on SmolLM2, 7.6 -> 3.4 ms of adapter work a step, 1 thread).

#include "lora_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>

#include "load_row.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
constexpr bool kDotsBf16 = true;
#else
constexpr bool kDotsBf16 = false;
#endif

#if !defined(__AVX512BF16__)
// Never called without AVX512-BF16 (kDotsBf16 is false): declared for the compiler.
inline void expand_pairs(const uint32_t*, int64_t, int64_t, const float*, int64_t, int64_t,
                         int64_t, c10::BFloat16*) {}
#else
// out[first .. first + cols) (cols <= 32) += the rank pairs of B [pairs, width] dotted
// with t's pairs (rounded to bf16, as the torch reference rounds the shrunk rows).
inline void expand_pairs(const uint32_t* bp, int64_t width, int64_t pairs, const float* t,
                         int64_t rank, int64_t first, int64_t cols, c10::BFloat16* target) {
  const int64_t n0 = std::min<int64_t>(cols, 16), n1 = cols - n0;
  const __mmask16 m0 = n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n0) - 1);
  const __mmask16 m1 = n1 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n1) - 1);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const float hi = 2 * kp + 1 < rank ? t[2 * kp + 1] : 0.f;
    const uint32_t bits = bf16_bits(t[2 * kp]) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
    const __m512bh tv = (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
    const uint32_t* row = bp + kp * width + first;
    acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_maskz_loadu_epi32(m0, row), tv);
    if (n1 > 0) acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_maskz_loadu_epi32(m1, row + 16), tv);
  }
  float sums[32], current[32];
  _mm512_storeu_ps(sums, acc0);
  _mm512_storeu_ps(sums + 16, acc1);
  load_row(target, current, cols);
  for (int64_t c = 0; c < cols; ++c) current[c] += sums[c];
  store_row(current, target, cols);
}
#endif

LoRAWeights::LoRAWeights(at::Tensor a, std::vector<int64_t> out_starts,
                         std::vector<int64_t> rank_starts, std::vector<at::Tensor> bs)
    : a(a.contiguous()),
      out_starts(std::move(out_starts)),
      rank_starts(std::move(rank_starts)),
      bs(std::move(bs)) {
  TORCH_CHECK(this->a.dim() == 2, "A [R, in]");
  TORCH_CHECK(this->out_starts.size() == this->bs.size() &&
                  this->rank_starts.size() == this->bs.size(),
              "one output start and one rank start per B");
  for (size_t p = 0; p < this->bs.size(); ++p) {
    at::Tensor& b = this->bs[p];
    TORCH_CHECK(b.dim() == 2 && b.scalar_type() == this->a.scalar_type(), "B [width, rank]");
    TORCH_CHECK(b.size(1) >= 1, "B [width, rank >= 1]");
    TORCH_CHECK(this->rank_starts[p] + b.size(1) <= this->a.size(0), "B's ranks within A's");
    const int64_t width = b.size(0), rank = b.size(1);
    ranks.push_back(rank);
    // The expand runs along the output columns, 16 a vector (a dot of rank values per
    // column did not vectorize: 5x slower). In bf16 each column's ranks go in pairs,
    // as the dot instruction takes them, B read as it is stored (an fp32 copy doubled
    // the bytes a step reads: at batch 16 with 8 adapters they are what costs).
    if (kDotsBf16 && b.scalar_type() == at::kBFloat16) {
      const int64_t even = (rank + 1) / 2 * 2;
      at::Tensor padded = at::zeros({width, even}, b.options());
      padded.narrow(1, 0, rank).copy_(b);
      b = padded.view({width, even / 2, 2}).permute({1, 0, 2}).contiguous();
    } else {
      b = b.t().to(at::kFloat).contiguous();
    }
  }
}

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// A row of A dotted with the group's rows of x, into column k of t [rows, rank]: from
// fp32 copies of both (fp32; and bf16 without AVX512-BF16).
template <typename scalar_t>
inline void shrink_row(const scalar_t* a, const float* xf, const scalar_t*, const int64_t*,
                       int64_t n, int64_t in, float* a_row, float* t, int64_t rank) {
  load_row(a, a_row, in);
  for (int64_t i = 0; i < n; ++i) t[i * rank] = dot(xf + i * in, a_row, in);
}

#if defined(__AVX512BF16__)
// bf16: the pairs' products summed in fp32 by the dot instruction, 32 values a step,
// straight from the bf16 rows (converting A's rows to fp32 first took most of the time).
template <>
inline void shrink_row<c10::BFloat16>(const c10::BFloat16* a, const float*,
                                      const c10::BFloat16* x, const int64_t* rows, int64_t n,
                                      int64_t in, float*, float* t, int64_t rank) {
  const int64_t whole = in / 32 * 32;
  for (int64_t i = 0; i < n; ++i) {
    const c10::BFloat16* xr = x + rows[i] * in;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < whole; j += 32) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + j);
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xr + j);
      acc = _mm512_dpbf16_ps(acc, av, xv);
    }
    float sum = _mm512_reduce_add_ps(acc);
    for (int64_t j = whole; j < in; ++j) sum += static_cast<float>(a[j]) * static_cast<float>(xr[j]);
    t[i * rank] = sum;
  }
}
#endif

// One group as the passes see it: its rows, its fp32 x rows and shrunk rows, and its
// weights' raw pointers (taken once: data_ptr's checks cost more than a column's work).
template <typename scalar_t>
struct Group {
  struct Part {
    const void* b;  // as LoRAWeights keeps it: bf16 rank pairs, or fp32 B^T
    int64_t width, rank, rank_start, out_start;
  };
  std::vector<int64_t> rows;
  const scalar_t* a = nullptr;  // [R, in]
  int64_t rank = 0;             // R
  std::vector<Part> parts;
  std::vector<float> x;  // [rows, in]
  std::vector<float> t;  // [rows, R]
};

template <typename scalar_t>
void lora_add_typed(at::Tensor& out, const at::Tensor& x,
                    const std::vector<std::vector<int64_t>>& rows,
                    const std::vector<std::shared_ptr<LoRAWeights>>& weights) {
  const int64_t in = x.size(1), out_cols = out.size(1);
  const scalar_t* x_data = x.data_ptr<scalar_t>();
  scalar_t* out_data = out.data_ptr<scalar_t>();
  const int64_t num_groups = static_cast<int64_t>(rows.size());
  std::vector<Group<scalar_t>> groups(num_groups);
  // The work items: the shrink's (group, rank row), the expand's (group, part, first
  // column), 32 columns each.
  constexpr int64_t kBlock = 32;
  // Work items ahead whose weights are asked for before use: the adapters' weights are
  // ~2,000 short arrays a step, which the hardware prefetcher hardly follows.
  constexpr int64_t kAhead = 8;
  std::vector<std::pair<int64_t, int64_t>> shrink;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> expand;
  for (int64_t g = 0; g < num_groups; ++g) {
    Group<scalar_t>& group = groups[g];
    const LoRAWeights& w = *weights[g];
    group.rows = rows[g];
    group.a = w.a.data_ptr<scalar_t>();
    group.rank = w.a.size(0);
    const int64_t n = static_cast<int64_t>(group.rows.size());
    group.t.assign(n * group.rank, 0.f);
    if (!kDotsBf16 || !std::is_same_v<scalar_t, c10::BFloat16>) {  // fp32 copies of x's rows
      group.x.resize(n * in);
      for (int64_t i = 0; i < n; ++i) {
        load_row(x_data + group.rows[i] * in, group.x.data() + i * in, in);
      }
    }
    for (int64_t k = 0; k < group.rank; ++k) shrink.emplace_back(g, k);
    for (size_t p = 0; p < w.bs.size(); ++p) {
      const at::Tensor& b = w.bs[p];
      const int64_t width = b.size(1);
      TORCH_CHECK(w.out_starts[p] + width <= out_cols, "a LoRA part past the output's columns");
      group.parts.push_back({b.data_ptr(), width, w.ranks[p], w.rank_starts[p], w.out_starts[p]});
      for (int64_t c = 0; c < width; c += kBlock) expand.emplace_back(g, p, c);
    }
  }
  const int64_t num_shrink = static_cast<int64_t>(shrink.size());
  at::parallel_for(0, num_shrink, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> a_row(in);
    for (int64_t item = begin; item < end; ++item) {
      Group<scalar_t>& group = groups[shrink[item].first];
      const int64_t k = shrink[item].second;
      if (item + kAhead < end) {  // the row kAhead items on, asked for ahead of use
        const auto [ahead_g, ahead_k] = shrink[item + kAhead];
        const char* row = reinterpret_cast<const char*>(groups[ahead_g].a + ahead_k * in);
        for (int64_t byte = 0; byte < in * static_cast<int64_t>(sizeof(scalar_t)); byte += 64) {
          __builtin_prefetch(row + byte);
        }
      }
      shrink_row<scalar_t>(group.a + k * in, group.x.data(), x_data, group.rows.data(),
                           static_cast<int64_t>(group.rows.size()), in, a_row.data(),
                           group.t.data() + k, group.rank);
    }
  });
  const int64_t num_expand = static_cast<int64_t>(expand.size());
  at::parallel_for(0, num_expand, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const auto [g, p, first] = expand[item];
      Group<scalar_t>& group = groups[g];
      const typename Group<scalar_t>::Part& part = group.parts[p];
      const int64_t r = part.rank, cols = std::min(part.width - first, kBlock);
      if (item + kAhead < end) {  // the block kAhead items on: each of its rank rows
        const auto [ahead_g, ahead_p, ahead_first] = expand[item + kAhead];
        const typename Group<scalar_t>::Part& next = groups[ahead_g].parts[ahead_p];
        const bool pairs = kDotsBf16 && std::is_same_v<scalar_t, c10::BFloat16>;
        const int64_t rows = pairs ? (next.rank + 1) / 2 : next.rank;
        const char* base = static_cast<const char*>(next.b) + ahead_first * 4;
        for (int64_t k = 0; k < rows; ++k) {
          __builtin_prefetch(base + k * next.width * 4);
          __builtin_prefetch(base + k * next.width * 4 + 64);
        }
      }
      for (size_t i = 0; i < group.rows.size(); ++i) {
        const float* t = group.t.data() + i * group.rank + part.rank_start;
        scalar_t* target = out_data + group.rows[i] * out_cols + part.out_start + first;
        if constexpr (kDotsBf16 && std::is_same_v<scalar_t, c10::BFloat16>) {
          expand_pairs(static_cast<const uint32_t*>(part.b), part.width, (r + 1) / 2, t, r,
                       first, cols, target);
          continue;
        }
        const float* bt = static_cast<const float*>(part.b);
        float sums[kBlock];
        load_row(target, sums, cols);
        for (int64_t k = 0; k < r; ++k) {
          const float tk = t[k];
          const float* row = bt + k * part.width + first;
          for (int64_t c = 0; c < cols; ++c) sums[c] += tk * row[c];
        }
        store_row(sums, target, cols);
      }
    }
  });
}

}  // namespace

void lora_add(at::Tensor& out, const at::Tensor& x,
              const std::vector<std::optional<at::Tensor>>& rows,
              const std::vector<std::shared_ptr<LoRAWeights>>& weights) {
  TORCH_CHECK(rows.size() == weights.size(), "one set of rows per adapter");
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "x, out [tokens, .]");
  TORCH_CHECK(out.is_contiguous() && x.scalar_type() == out.scalar_type(), "out contiguous");
  const at::Tensor xc = x.contiguous();
  const int64_t tokens = x.size(0);
  std::vector<std::vector<int64_t>> row_lists(rows.size());
  for (size_t g = 0; g < rows.size(); ++g) {
    const LoRAWeights& w = *weights[g];
    TORCH_CHECK(w.a.scalar_type() == x.scalar_type() && w.a.size(1) == x.size(1),
                "A [R, in] in x's dtype");
    if (rows[g].has_value()) {
      const at::Tensor r = rows[g]->to(at::kLong).contiguous();
      const int64_t* data = r.data_ptr<int64_t>();
      row_lists[g].assign(data, data + r.numel());
      for (int64_t row : row_lists[g]) TORCH_CHECK(0 <= row && row < tokens, "a row out of range");
    } else {
      row_lists[g].resize(tokens);
      for (int64_t i = 0; i < tokens; ++i) row_lists[g][i] = i;
    }
  }
  if (x.scalar_type() == at::kBFloat16) {
    lora_add_typed<c10::BFloat16>(out, xc, row_lists, weights);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "lora_add: bf16 or fp32");
    lora_add_typed<float>(out, xc, row_lists, weights);
  }
}
