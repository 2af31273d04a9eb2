// LoRA's low-rank updates of a projection's rows, grouped by adapter: kernels/lora.py
// has the math and the torch reference.
#pragma once

#include "tensor_api.h"

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "parallel_by_work.h"

// One adapter's weights on one merged projection: A of its parts stacked [R, in], and
// per part the first output column, the first column of the shrunk activations, and
// B [width, rank] (the scaling folded in). bf16 or fp32, all the same dtype, kept in
// the layouts the kernel reads front to back (lora_cpu.cpp).
//
// What the kernel reads is held in the object itself, raw pointers included: a
// tensor's data is three pointers away, each a miss from memory once the step's
// weights have streamed through the caches (and looking the weights up in a
// std::map cost as much again: 0.3 ms of a 13 ms step at 8 adapters).
struct LoRAWeights {
  LoRAWeights(at::Tensor a, std::vector<int64_t> out_starts, std::vector<int64_t> rank_starts,
              std::vector<at::Tensor> bs);

  static constexpr int kMaxParts = 3;  // q, k and v
  struct Part {
    int64_t out_start, rank_start, rank, width;
    const void* b;
  };
  at::ScalarType dtype;
  int64_t in, ranks;  // A's shape [R, in] as given
  int64_t elements;   // of A and the Bs: what the threads' shares are weighed by
  bool tiled;         // the AVX-512 bf16 layouts (below); otherwise A as given, fp32 B^T
  const void* a;
  int num_parts;
  std::array<Part, kMaxParts> parts;
  // The tensors that hold the weights: where tiled, one buffer (A, then each B).
  std::vector<at::Tensor> storage;
};

// Moves the weights' tensors (one projection's adapters, in the order a step reads them)
// into one buffer, back to back, each re-pointed in place: a thread's share of a step's
// adapters is then one stream from memory rather than one per adapter, which the
// hardware's prefetch starts afresh each time (a step of 8 adapters at batch 16 read
// its updates' weights in 1.22 ms rather than 1.43).
void colocate_lora(const std::vector<std::shared_ptr<LoRAWeights>>& weights);

// One adapter's rows of a step: indices of rows of x and of out.
struct LoRARowSpan {
  const int64_t* rows;
  int64_t count;
};

// A set of rows as a list (checked to lie in [0, tokens)); none: every row.
std::vector<int64_t> lora_row_list(const std::optional<at::Tensor>& rows, int64_t tokens);

// lora_add_rows taken apart: its checks and work items made once, the items then run in
// shares (run_share(t, n) for t in 0 .. n - 1, from any threads), so that a parallel
// region can run them beside other work: the base projection's (work_in_shares.h).
// assign: out's rows are set to their updates, not added to, and rows of no adapter set
// to zero (an update buffer needs no zeroing before).
class LoRAWork {
 public:
  LoRAWork(const at::Tensor& out, const at::Tensor& x, const std::vector<LoRARowSpan>& rows,
           const std::vector<const LoRAWeights*>& weights, bool assign = false);
  void run_share(int64_t thread, int64_t threads) const;
  // The shares worth a thread each: one where there is only one item
  int64_t useful_shares() const;

  // Some of one adapter's rows (up to 16): their shrink, then their expand
  struct Item {
    const LoRAWeights* weights;
    const int64_t* rows;
    int64_t count;
  };

 private:
  at::Tensor out_, x_;
  bool assign_;
  std::vector<Item> items_;
  WorkShares shares_;
  std::vector<int64_t> idle_rows_;  // assign: the rows of no adapter
};

// out [tokens, out] += for each adapter, its rows' update, in fp32 from the rows of
// x [tokens, in], rounded once into out (in x's dtype, or fp32: the updates a gated
// gate_up kernel adds before its activation).
void lora_add_rows(at::Tensor& out, const at::Tensor& x, const std::vector<LoRARowSpan>& rows,
                   const std::vector<const LoRAWeights*>& weights, bool assign = false);

// lora_add_rows with each adapter's rows as a tensor (null: every row); assign as
// LoRAWork's.
void lora_add(at::Tensor& out, const at::Tensor& x,
              const std::vector<std::optional<at::Tensor>>& rows,
              const std::vector<std::shared_ptr<LoRAWeights>>& weights, bool assign);
