// LoRA's low-rank updates of a projection's rows, grouped by adapter: kernels/lora.py
// has the math and the torch reference.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

// One adapter's weights on one merged projection: A of its parts stacked [R, in], and
// per part the first output column, the first column of the shrunk activations, and
// B [width, rank] (the scaling folded in). bf16 or fp32, all the same dtype.
struct LoRAWeights {
  LoRAWeights(at::Tensor a, std::vector<int64_t> out_starts, std::vector<int64_t> rank_starts,
              std::vector<at::Tensor> bs);

  at::Tensor a;
  std::vector<int64_t> out_starts, rank_starts, ranks;
  // Each part's B as the expand reads it: bf16 on AVX512-BF16, [ceil(rank / 2), width]
  // pairs of ranks (one 32-bit word per column and pair); otherwise fp32 B^T [rank, width].
  std::vector<at::Tensor> bs;
};

// out [tokens, out] += for each group, its rows' update (rows[g] null: every row), in
// fp32 from the rows of x [tokens, in], rounded once into out.
void lora_add(at::Tensor& out, const at::Tensor& x,
              const std::vector<std::optional<at::Tensor>>& rows,
              const std::vector<std::shared_ptr<LoRAWeights>>& weights);
