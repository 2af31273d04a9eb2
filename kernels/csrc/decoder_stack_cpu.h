// A decode step's decoder layers in one call: kernels/decoder_stack_cpu.py says why.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

// One projection as the Python side packed it: a quantized weight (qtype names its
// blocks, for quantized_linear) or a bf16 weight in linear_packed's panels (qtype empty).
struct PackedLinear {
  PackedLinear(at::Tensor packed, std::string qtype, std::optional<at::Tensor> bias, bool gated,
               bool then_silu)
      : packed(std::move(packed)),
        qtype(std::move(qtype)),
        bias(std::move(bias)),
        gated(gated),
        then_silu(then_silu) {}

  // x [tokens, in] -> [tokens, out]
  at::Tensor operator()(const at::Tensor& x) const;

  at::Tensor packed;
  std::string qtype;
  std::optional<at::Tensor> bias;
  bool gated;      // linear_packed's merged gate_up: silu(gate) * up in the same pass
  bool then_silu;  // silu_and_mul on the output (a merged gate_up the kernel does not fuse)
};

struct DecoderLayerWeights {
  at::Tensor input_norm;
  at::Tensor post_attention_norm;
  PackedLinear qkv, o, gate_up, down;
  int64_t window;  // sliding window, 0 for none
};

// The layers of a Llama-family model, for steps whose every query token attends through
// decode_attention (no prefill chunk of 2+ tokens).
class DecoderStack {
 public:
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
               double scale);

  void add_layer(at::Tensor input_norm, at::Tensor post_attention_norm, PackedLinear qkv,
                 PackedLinear o, PackedLinear gate_up, PackedLinear down, int64_t window);

  // x [tokens, hidden] (the embedded tokens) -> (the last layer's output, the residual
  // stream before it), as the layers one by one give them: the final norm adds the two.
  std::tuple<at::Tensor, at::Tensor> forward(
      const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
      const at::Tensor& sin, const std::vector<at::Tensor>& k_caches,
      const std::vector<at::Tensor>& v_caches, const at::Tensor& block_tables,
      const at::Tensor& context_lens, const at::Tensor& slot_mapping) const;

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  std::vector<DecoderLayerWeights> layers_;
};
