// A decode step's decoder layers in one call from Python (kernels/decoder_stack_cpu.py
// says why): the same kernels, in the same order, on the same tensors as the model's
// layers call them one by one, so the results are the same to the bit.

#include "decoder_stack_cpu.h"

#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/silu_ops.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <tuple>
#include <utility>

#include "cpu_kernels.h"
#include "moe_cpu.h"
#include "work_in_shares.h"

namespace {

// The activations a gated MLP's gate goes through, by their HF names
constexpr std::array<std::pair<const char*, GatedActivation>, 2> kGatedActivations{{
    {"silu", GatedActivation::kSilu},
    {"gelu_pytorch_tanh", GatedActivation::kGeluTanh},
}};

std::optional<GatedActivation> find_activation(const std::string& name) {
  for (const auto& [known, activation] : kGatedActivations) {
    if (name == known) return activation;
  }
  return std::nullopt;
}

GatedActivation gated_activation(const std::string& name) {
  if (name.empty()) return GatedActivation::kNone;
  const auto activation = find_activation(name);
  TORCH_CHECK(activation, "no gated activation ", name, " (\"\", \"silu\", \"gelu_pytorch_tanh\")");
  return *activation;
}

}  // namespace

PackedLinear::PackedLinear(at::Tensor packed, std::string qtype, std::optional<at::Tensor> bias,
                           bool gated, const std::string& then, int64_t activation_bits)
    : packed(std::move(packed)),
      qtype(std::move(qtype)),
      bias(std::move(bias)),
      gated(gated),
      then(gated_activation(then)),
      activation_bits(activation_bits) {}

at::Tensor PackedLinear::operator()(const at::Tensor& x) const { return activate(linear(x)); }

at::Tensor PackedLinear::linear(const at::Tensor& x, const std::optional<at::Tensor>& addend) const {
  TORCH_CHECK(qtype.empty() || !addend.has_value(), "an addend on a quantized projection");
  return qtype.empty() ? linear_packed(x, packed, bias, gated, addend)
                       : quantized_linear(x, packed, qtype, bias, activation_bits);
}

at::Tensor PackedLinear::linear(const at::Tensor& x, const StepLoRA& lora) const {
  if (lora.weights.empty()) return linear(x);
  if (!qtype.empty()) {
    const QuantizedLinearWork projecting(x, packed, qtype, bias, activation_bits);
    const LoRAWork updating(projecting.out, x, lora.rows, lora.weights);
    in_one_region(projecting, updating);
    return projecting.out;
  }
  if (gated) {  // the updates first, into the sums the kernel adds before its activation
    at::Tensor updates =
        tensors::empty({x.size(0), packed.size(0) * packed.size(2)}, x.options().dtype(at::kFloat));
    const LoRAWork updating(updates, x, lora.rows, lora.weights, /*assign=*/true);
    const PackedLinearWork projecting(x, packed, bias, true, updates);
    in_one_region(updating, projecting);
    return projecting.out;
  }
  const PackedLinearWork projecting(x, packed, bias, false, std::nullopt);
  const LoRAWork updating(projecting.out, x, lora.rows, lora.weights);
  in_one_region(projecting, updating);
  return projecting.out;
}

at::Tensor PackedLinear::activate(const at::Tensor& out) const {
  switch (then) {
    case GatedActivation::kSilu: {
      if (out.scalar_type() != at::kFloat) return silu_and_mul(out);
      // fp32 (a mixture-of-experts block's shared expert): torch's ops, as the
      // reference (kernels/activation.py) computes it
      const int64_t d = out.size(-1) / 2;
      return at::_ops::silu::call(out.narrow(-1, 0, d)).mul(out.narrow(-1, d, d));
    }
    case GatedActivation::kGeluTanh: {
      // torch's ops, as kernels/activation.py's gelu_tanh_and_mul_ref calls them in bf16
      const int64_t d = out.size(-1) / 2;
      return at::_ops::gelu::call(out.narrow(-1, 0, d), "tanh").mul(out.narrow(-1, d, d));
    }
    case GatedActivation::kNone:
      break;
  }
  return out;
}

DecoderStack::DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                           double eps, double scale, double softcap)
    : num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      eps_(eps),
      scale_(scale),
      softcap_(softcap) {}

// A decoder layer's description (kernels/decoder_stack.py's DecoderLayerSpec, every
// field by its name, its projections and expert block in their C++ forms) read into the
// stack's weights. A part the stack does not compute is named in `unserved`, not
// ignored: a field it does not know, a norm at a place it does not know, an activation
// it lacks, a sparse layer without the C++ expert block.
std::optional<DecoderLayerWeights> read_decoder_layer(const py::dict& description,
                                                      std::vector<std::string>& unserved) {
  py::dict rest = description.attr("copy")();  // what is left once each known part is read
  auto take = [&](const char* field) -> py::object {
    TORCH_CHECK(rest.contains(field), "a decoder layer's description without ", field);
    return rest.attr("pop")(field);
  };
  py::dict norms = take("norms").attr("copy")();
  auto norm = [&](const char* place) -> std::optional<at::Tensor> {
    if (!norms.contains(place)) return std::nullopt;
    return norms.attr("pop")(place).cast<at::Tensor>();
  };
  auto linear = [&](const char* field) { return take(field).cast<std::optional<PackedLinear>>(); };
  auto required = [&](const char* field) {
    auto projection = linear(field);
    TORCH_CHECK(projection, "a decoder layer without its ", field, " projection");
    return *projection;
  };
  const auto activation = take("activation").cast<std::string>();
  if (!find_activation(activation)) unserved.push_back("the " + activation + " activation");
  const auto rope = take("rope").cast<std::tuple<at::Tensor, at::Tensor>>();
  const auto input_norm = norm("input"), post_attention_norm = norm("post_attention");
  TORCH_CHECK(input_norm && post_attention_norm, "a decoder layer without its two RMSNorms");
  DecoderLayerWeights layer{*input_norm,
                            *post_attention_norm,
                            required("qkv"),
                            required("o"),
                            linear("gate_up"),
                            linear("down"),
                            take("sliding_window").cast<std::optional<int64_t>>().value_or(0),
                            take("kv_group").cast<int64_t>(),
                            std::get<0>(rope),
                            std::get<1>(rope),
                            norm("q"),
                            norm("k"),
                            norm("attn_output"),
                            norm("mlp_output"),
                            take("qk_norm_across_heads").cast<bool>(),
                            take("moe").cast<std::shared_ptr<MoeBlock>>()};
  if (!layer.gate_up && !layer.moe) {
    unserved.push_back("mixture-of-experts layers without the C++ expert kernel");
  }
  for (const auto& item : norms) {
    unserved.push_back("the " + item.first.cast<std::string>() + " norm");
  }
  for (const auto& item : rest) {
    unserved.push_back("the layer's " + item.first.cast<std::string>());
  }
  if (!unserved.empty()) return std::nullopt;
  return layer;
}

void DecoderStack::add_layer(DecoderLayerWeights layer) {
  TORCH_CHECK((layer.gate_up.has_value() && layer.down.has_value()) != (layer.moe != nullptr),
              "a layer has either a dense MLP (gate_up and down) or a mixture-of-experts block");
  TORCH_CHECK(!layer.qk_norm_across_heads || (layer.q_norm && layer.k_norm),
              "q and k norms across heads without the norms");
  layers_.push_back(std::move(layer));
}

void DecoderStack::set_lora(int64_t layer, int64_t projection, int64_t slot,
                            std::shared_ptr<LoRAWeights> weights) {
  TORCH_CHECK(0 <= layer && layer < static_cast<int64_t>(layers_.size()), "no such layer");
  TORCH_CHECK(0 <= projection && projection < 4, "projection: 0 qkv, 1 o, 2 gate_up, 3 down");
  TORCH_CHECK(projection < 2 || layers_[layer].gate_up.has_value(),
              "LoRA on the MLP of a mixture-of-experts layer");
  TORCH_CHECK(slot >= 0, "a LoRA slot is not negative");
  auto& by_slot = layers_[layer].lora[projection];
  if (static_cast<int64_t>(by_slot.size()) <= slot) by_slot.resize(slot + 1);
  by_slot[slot] = std::move(weights);
}

void DecoderStack::remove_lora(int64_t slot) {
  for (DecoderLayerWeights& layer : layers_) {
    for (auto& by_slot : layer.lora) {
      if (slot >= 0 && slot < static_cast<int64_t>(by_slot.size())) by_slot[slot] = nullptr;
    }
  }
}

StepLoRA DecoderStack::step_lora(const DecoderLayerWeights& layer, int projection,
                                 const LoRARows& step) const {
  StepLoRA lora;
  const auto& by_slot = layer.lora[projection];
  for (size_t g = 0; g < step.slots.size() && !by_slot.empty(); ++g) {
    const int64_t slot = step.slots[g];
    if (slot < 0 || slot >= static_cast<int64_t>(by_slot.size()) || !by_slot[slot]) continue;
    lora.rows.push_back({step.rows[g].data(), static_cast<int64_t>(step.rows[g].size())});
    lora.weights.push_back(by_slot[slot].get());
  }
  return lora;
}

at::Tensor DecoderStack::norm_each_head(const at::Tensor& x, const at::Tensor& weight) const {
  return rms_norm(x.reshape({-1, head_dim_}).contiguous(), weight, eps_).view(x.sizes());
}

std::tuple<at::Tensor, at::Tensor> DecoderStack::forward(
    const at::Tensor& x, const at::Tensor& positions, const std::vector<at::Tensor>& k_caches,
    const std::vector<at::Tensor>& v_caches, const std::vector<at::Tensor>& block_tables,
    const at::Tensor& context_lens, const std::vector<at::Tensor>& slot_mappings,
    const std::vector<int64_t>& lora_slots,
    const std::vector<std::optional<at::Tensor>>& lora_rows) const {
  TORCH_CHECK(lora_slots.size() == lora_rows.size(), "one set of rows per LoRA slot");
  TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
              "one key and one value cache per layer");
  TORCH_CHECK(!block_tables.empty() && block_tables.size() == slot_mappings.size(),
              "one set of block tables and one slot mapping per KV cache group");
  TORCH_CHECK(x.dim() == 2, "x [tokens, hidden]");
  const int64_t tokens = x.size(0);
  LoRARows lora{lora_slots, {}};
  for (const auto& rows : lora_rows) lora.rows.push_back(lora_row_list(rows, tokens));
  const int64_t q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
  at::Tensor hidden = x, residual, normed;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayerWeights& layer = layers_[i];
    if (i == 0) {  // the embedded tokens start the residual stream
      normed = rms_norm(hidden, layer.input_norm, eps_);
      residual = hidden;
    } else {
      std::tie(normed, residual) = fused_add_rms_norm(hidden, residual, layer.input_norm, eps_);
    }
    const at::Tensor qkv = layer.qkv.activate(layer.qkv.linear(normed, step_lora(layer, 0, lora)));
    at::Tensor q = qkv.narrow(1, 0, q_size);
    at::Tensor k = qkv.narrow(1, q_size, kv_size);
    if (layer.qk_norm_across_heads) {  // as RMSNorm.each_row over the whole projection
      q = rms_norm(q.contiguous(), *layer.q_norm, eps_);
      k = rms_norm(k.contiguous(), *layer.k_norm, eps_);
    } else {
      if (layer.q_norm) q = norm_each_head(q, *layer.q_norm);
      if (layer.k_norm) k = norm_each_head(k, *layer.k_norm);
    }
    q = q.view({tokens, num_heads_, head_dim_});
    k = k.view({tokens, num_kv_heads_, head_dim_});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size)
                             .view({tokens, num_kv_heads_, head_dim_});
    std::tie(q, k) = rotary(positions, q, k, layer.cos, layer.sin, /*is_neox=*/true);
    at::Tensor k_cache = k_caches[i], v_cache = v_caches[i];
    const size_t group =
        static_cast<size_t>(layer.kv_group) < block_tables.size() ? layer.kv_group : 0;
    store_kv(k, v, k_cache, v_cache, slot_mappings[group]);
    const at::Tensor attention = decode_attention(q, k_cache, v_cache, block_tables[group],
                                                  context_lens, scale_, layer.window, softcap_);
    const at::Tensor attended = attention.reshape({tokens, q_size});
    at::Tensor projected = layer.o.activate(layer.o.linear(attended, step_lora(layer, 1, lora)));
    if (layer.attn_output_norm) projected = rms_norm(projected, *layer.attn_output_norm, eps_);
    std::tie(normed, residual) =
        fused_add_rms_norm(projected, residual, layer.post_attention_norm, eps_);
    if (layer.moe) {
      hidden = layer.moe->forward(normed);
    } else {
      // a gate_up kernel that fuses the activation takes the updates before it
      const at::Tensor activated =
          layer.gate_up->activate(layer.gate_up->linear(normed, step_lora(layer, 2, lora)));
      hidden = layer.down->activate(layer.down->linear(activated, step_lora(layer, 3, lora)));
    }
    if (layer.mlp_output_norm) hidden = rms_norm(hidden, *layer.mlp_output_norm, eps_);
  }
  return {hidden, residual};
}
