// A mixture-of-experts block on the CPU: kernels/moe_cpu.py says why and how.
#pragma once

#include "tensor_api.h"

#include <optional>
#include <string>

#include "decoder_stack_cpu.h"

// A sparse layer's MLP: the router, the routed experts kept quantized (each expert's
// weight in quantized_linear's panels, the experts stacked), and the shared expert where
// the model has one.
class MoeBlock {
 public:
  // router [num_experts, hidden] in the model's dtype; gate_up uint8 [num_experts,
  // panels, panel_bytes] (each expert's gate rows, then its up rows), down likewise;
  // activation: the HF name ("silu", "gelu_pytorch_tanh").
  MoeBlock(at::Tensor router, at::Tensor gate_up, std::string gate_up_qtype, at::Tensor down,
           std::string down_qtype, const std::string& activation, int64_t activation_bits,
           int64_t top_k, bool renormalize, std::optional<PackedLinear> shared_gate_up,
           std::optional<PackedLinear> shared_down, std::optional<at::Tensor> shared_gate);

  // x [tokens, hidden] -> the block's output [tokens, hidden] in x's dtype.
  at::Tensor forward(const at::Tensor& x) const;

  // The routed experts alone: x [tokens, hidden], expert ids [tokens, top_k] int64,
  // weights [tokens, top_k] fp32 -> sum over k of weight x expert(x), in x's dtype.
  at::Tensor experts(const at::Tensor& x, const at::Tensor& expert_ids,
                     const at::Tensor& weights) const;

 private:
  at::Tensor router_, gate_up_, down_;
  std::string gate_up_qtype_, down_qtype_;
  GatedActivation activation_;
  int64_t activation_bits_, top_k_;
  bool renormalize_;
  std::optional<PackedLinear> shared_gate_up_, shared_down_;
  std::optional<at::Tensor> shared_gate_;
};
