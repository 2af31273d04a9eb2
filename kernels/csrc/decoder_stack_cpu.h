// A decode step's decoder layers in one call: kernels/decoder_stack_cpu.py says why.
#pragma once

#include "tensor_api.h"
#include <pybind11/pytypes.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "lora_cpu.h"

class MoeBlock;  // moe_cpu.h

// A step's LoRA adapters on one projection: each one's rows and its weights there.
struct StepLoRA {
  std::vector<LoRARowSpan> rows;
  std::vector<const LoRAWeights*> weights;
};

// The activation-and-mul a merged gate_up projection's output goes through after the
// kernel, where the kernel does not fuse it.
enum class GatedActivation { kNone, kSilu, kGeluTanh };

// One projection as the Python side packed it: a quantized weight (qtype names its
// blocks, for quantized_linear) or a bf16 weight in linear_packed's panels (qtype empty).
struct PackedLinear {
  PackedLinear(at::Tensor packed, std::string qtype, std::optional<at::Tensor> bias, bool gated,
               const std::string& then, int64_t activation_bits);

  // x [tokens, in] -> [tokens, out]: linear, then activate
  at::Tensor operator()(const at::Tensor& x) const;
  // The projection alone (a merged gate_up's [tokens, 2 x d] before its activation,
  // unless the kernel fuses it), and the activation-and-mul after it (if any). addend:
  // fp32 [tokens, out] added before the kernel rounds or activates (bf16 panels only).
  at::Tensor linear(const at::Tensor& x,
                    const std::optional<at::Tensor>& addend = std::nullopt) const;
  // linear with the LoRA updates of x's rows added (where the kernel fuses gate_up's
  // activation, to its sums before it); on bf16 panels in the kernel's parallel region.
  at::Tensor linear(const at::Tensor& x, const StepLoRA& lora) const;
  at::Tensor activate(const at::Tensor& out) const;

  at::Tensor packed;
  std::string qtype;
  std::optional<at::Tensor> bias;
  bool gated;  // linear_packed's merged gate_up: silu(gate) * up in the same pass
  // On the output of a merged gate_up the kernel does not fuse (HF's name: "" for none,
  // "silu": silu_and_mul, "gelu_pytorch_tanh": torch's tanh GELU of gate times up)
  GatedActivation then;
  int64_t activation_bits;  // quantized_linear's: 8 or 16
};

// One decoder layer, as DecoderLayerSpec (kernels/decoder_stack.py) describes it.
struct DecoderLayerWeights {
  at::Tensor input_norm;
  at::Tensor post_attention_norm;
  PackedLinear qkv, o;
  std::optional<PackedLinear> gate_up, down;  // the dense MLP; none in a sparse layer
  int64_t window;        // sliding window, 0 for none
  int64_t kv_group;      // the KV cache group whose block tables and slots it reads
  at::Tensor cos, sin;   // this layer's RoPE tables, fp32 [max_positions, head_dim]
  // The parts past Llama's, where the model has them: RMSNorms over each head of q and
  // k before RoPE (Qwen3, Gemma 3), or over all heads at once (OLMoE), and on the
  // attention's and the MLP's outputs (Gemma)
  std::optional<at::Tensor> q_norm, k_norm, attn_output_norm, mlp_output_norm;
  bool qk_norm_across_heads;
  // A sparse layer's mixture-of-experts block, in place of gate_up and down
  std::shared_ptr<MoeBlock> moe;
  // LoRA adapters' weights on qkv, o, gate_up and down (in that order), indexed by slot
  // (null: none there): a slot's found without a walk through memory a step has evicted
  std::array<std::vector<std::shared_ptr<LoRAWeights>>, 4> lora{};
};

// A decoder layer's description (kernels/decoder_stack.py's DecoderLayerSpec, every
// field by its name, its projections and expert block in their C++ forms) read into
// the stack's weights; None, with the parts the stack does not compute named in
// `unserved`, where it has any.
std::optional<DecoderLayerWeights> read_decoder_layer(const pybind11::dict& description,
                                                      std::vector<std::string>& unserved);

// A step's rows by LoRA adapter: the slots, and each one's rows (listed once a step,
// not once a projection).
struct LoRARows {
  std::vector<int64_t> slots;
  std::vector<std::vector<int64_t>> rows;
};

// The layers of a Llama-family model (with Qwen3's, Gemma 2's and 3's parts), for steps whose
// every query token attends through decode_attention (no prefill chunk of 2+ tokens).
class DecoderStack {
 public:
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
               double scale, double softcap);

  // A layer as kernels/decoder_stack.py's DecoderLayerSpec describes it (bindings.cpp
  // reads the description into these weights, refusing a part the stack does not take).
  void add_layer(DecoderLayerWeights layer);

  // A LoRA adapter's weights on one projection of a layer (0 qkv, 1 o, 2 gate_up,
  // 3 down), in its slot; and a slot emptied in every layer.
  void set_lora(int64_t layer, int64_t projection, int64_t slot,
                std::shared_ptr<LoRAWeights> weights);
  void remove_lora(int64_t slot);

  // x [tokens, hidden] (the embedded tokens) -> (the last layer's output, the residual
  // stream before it), as the layers one by one give them: the final norm adds the two.
  // block_tables and slot_mappings: one of each per KV cache group, by index; a layer
  // reads its group's (the first group's where the step has only that one: a draft
  // model keeps one cache for all of its layers).
  std::tuple<at::Tensor, at::Tensor> forward(
      const at::Tensor& x, const at::Tensor& positions, const std::vector<at::Tensor>& k_caches,
      const std::vector<at::Tensor>& v_caches, const std::vector<at::Tensor>& block_tables,
      const at::Tensor& context_lens, const std::vector<at::Tensor>& slot_mappings,
      const std::vector<int64_t>& lora_slots,
      const std::vector<std::optional<at::Tensor>>& lora_rows) const;

 private:
  // RMSNorm over each head_dim values of x [tokens, n * head_dim], as RMSNorm.each_row:
  // the rows made contiguous, normed as a [tokens * n, head_dim] batch.
  at::Tensor norm_each_head(const at::Tensor& x, const at::Tensor& weight) const;
  // The step's LoRA adapters on projection ``projection`` of ``layer``
  StepLoRA step_lora(const DecoderLayerWeights& layer, int projection,
                     const LoRARows& step) const;

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  double softcap_;  // attention's logit soft-capping (Gemma 2), 0 for none
  std::vector<DecoderLayerWeights> layers_;
};
