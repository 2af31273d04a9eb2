// LoRA's updates of a step's rows, grouped by adapter (SGMV on the CPU): after the base
// projection ran once over every row, each adapter's rows get
//   out[rows, o : o + w] += (x[rows] @ A^T)[:, k : k + r] @ B^T
// for each part (o, k, B [w, r]) of its weights (kernels/lora.py).
//
// Two passes, each one parallel loop over all groups' work: the shrink reads each row of
// A once per adapter (not once per row) and dots it with the adapter's rows of x, kept
// in fp32; the expand reads each row of B once per adapter and adds its dot with the
// shrunk rows into out, rounded once. At a decode step's few rows the work is reading
// A and B: a rank-16 adapter on every projection of a 135M model is ~10 MB in bf16.

#include "lora_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>

#include "load_row.h"

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
    b = b.contiguous();
    TORCH_CHECK(b.dim() == 2 && b.scalar_type() == this->a.scalar_type(), "B [width, rank]");
    TORCH_CHECK(this->rank_starts[p] + b.size(1) <= this->a.size(0), "B's ranks within A's");
  }
}

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One group as the passes see it: its rows, its fp32 x rows and shrunk rows.
struct Group {
  std::vector<int64_t> rows;
  const LoRAWeights* w;
  std::vector<float> x;  // [rows, in]
  std::vector<float> t;  // [rows, R]
};

template <typename scalar_t>
void lora_add_typed(at::Tensor& out, const at::Tensor& x, std::vector<Group>& groups) {
  const int64_t in = x.size(1), out_cols = out.size(1);
  const scalar_t* x_data = x.data_ptr<scalar_t>();
  scalar_t* out_data = out.data_ptr<scalar_t>();
  // The shrink: work items (group, rank row).
  std::vector<std::pair<int64_t, int64_t>> shrink;
  for (int64_t g = 0; g < static_cast<int64_t>(groups.size()); ++g) {
    Group& group = groups[g];
    const int64_t n = static_cast<int64_t>(group.rows.size());
    const int64_t rank = group.w->a.size(0);
    group.x.resize(n * in);
    group.t.assign(n * rank, 0.f);
    for (int64_t i = 0; i < n; ++i) {
      load_row(x_data + group.rows[i] * in, group.x.data() + i * in, in);
    }
    for (int64_t k = 0; k < rank; ++k) shrink.emplace_back(g, k);
  }
  at::parallel_for(0, static_cast<int64_t>(shrink.size()), 4, [&](int64_t begin, int64_t end) {
    std::vector<float> a_row(in);
    for (int64_t item = begin; item < end; ++item) {
      Group& group = groups[shrink[item].first];
      const int64_t k = shrink[item].second, rank = group.w->a.size(0);
      load_row(group.w->a.data_ptr<scalar_t>() + k * in, a_row.data(), in);
      for (size_t i = 0; i < group.rows.size(); ++i) {
        group.t[i * rank + k] = dot(group.x.data() + i * in, a_row.data(), in);
      }
    }
  });
  // The expand: work items (group, part, block of output columns).
  constexpr int64_t kBlock = 32;
  struct Expand {
    int64_t group, part, first, last;
  };
  std::vector<Expand> expand;
  for (int64_t g = 0; g < static_cast<int64_t>(groups.size()); ++g) {
    const LoRAWeights& w = *groups[g].w;
    for (int64_t p = 0; p < static_cast<int64_t>(w.bs.size()); ++p) {
      const int64_t width = w.bs[p].size(0);
      TORCH_CHECK(w.out_starts[p] + width <= out_cols, "a LoRA part past the output's columns");
      for (int64_t c = 0; c < width; c += kBlock) {
        expand.push_back({g, p, c, std::min(width, c + kBlock)});
      }
    }
  }
  at::parallel_for(0, static_cast<int64_t>(expand.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> b_row;
    for (int64_t item = begin; item < end; ++item) {
      const Expand& e = expand[item];
      Group& group = groups[e.group];
      const LoRAWeights& w = *group.w;
      const at::Tensor& b = w.bs[e.part];
      const int64_t r = b.size(1), rank = w.a.size(0);
      const int64_t rank_start = w.rank_starts[e.part], out_start = w.out_starts[e.part];
      b_row.resize(r);
      for (int64_t c = e.first; c < e.last; ++c) {
        load_row(b.data_ptr<scalar_t>() + c * r, b_row.data(), r);
        for (size_t i = 0; i < group.rows.size(); ++i) {
          const float delta = dot(group.t.data() + i * rank + rank_start, b_row.data(), r);
          scalar_t* target = out_data + group.rows[i] * out_cols + out_start + c;
          float value;
          load_row(target, &value, 1);
          value += delta;
          store_row(&value, target, 1);
        }
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
  std::vector<Group> groups(rows.size());
  for (size_t g = 0; g < rows.size(); ++g) {
    const LoRAWeights& w = *weights[g];
    TORCH_CHECK(w.a.scalar_type() == x.scalar_type() && w.a.size(1) == x.size(1),
                "A [R, in] in x's dtype");
    groups[g].w = &w;
    if (rows[g].has_value()) {
      const at::Tensor r = rows[g]->to(at::kLong).contiguous();
      const int64_t* data = r.data_ptr<int64_t>();
      groups[g].rows.assign(data, data + r.numel());
      for (int64_t row : groups[g].rows) TORCH_CHECK(0 <= row && row < tokens, "a row out of range");
    } else {
      groups[g].rows.resize(tokens);
      for (int64_t i = 0; i < tokens; ++i) groups[g].rows[i] = i;
    }
  }
  if (x.scalar_type() == at::kBFloat16) {
    lora_add_typed<c10::BFloat16>(out, xc, groups);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "lora_add: bf16 or fp32");
    lora_add_typed<float>(out, xc, groups);
  }
}
