// A mixture-of-experts block in one call (kernels/moe_cpu.py says why): route, run each
// active expert once over all the tokens routed to it, combine each token's experts.
//
// The step's (token, slot) pairs are sorted by expert (a counting sort), their rows of
// x gathered in that order, and quantized_linear_grouped multiplies every active
// expert's gate_up weight with its run of rows in one parallel pass, then (after the
// gated activation) every active expert's down weight: each expert's weights are read
// once per step however many tokens chose it, and only the active experts' are read.
// Each token's outputs are then summed in its slot order, weighted, in fp32.

#include "moe_cpu.h"

#include <ATen/ops/linear_ops.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "cpu_kernels.h"

namespace {

GatedActivation expert_activation(const std::string& name) {
  if (name == "silu") return GatedActivation::kSilu;
  if (name == "gelu_pytorch_tanh") return GatedActivation::kGeluTanh;
  TORCH_CHECK(false, "no expert activation ", name, " (\"silu\", \"gelu_pytorch_tanh\")");
}

// Rows of x per task when gathering or combining them.
constexpr int64_t kRowGrain = 16;

// silu(g) = g / (1 + e^-g), or the tanh approximation of GELU.
inline float activate(float g, bool silu) {
  if (silu) return g / (1.f + std::exp(-g));
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

}  // namespace

MoeBlock::MoeBlock(at::Tensor router, at::Tensor gate_up, std::string gate_up_qtype,
                   at::Tensor down, std::string down_qtype, const std::string& activation,
                   int64_t activation_bits, int64_t top_k, bool renormalize,
                   std::optional<PackedLinear> shared_gate_up,
                   std::optional<PackedLinear> shared_down, std::optional<at::Tensor> shared_gate)
    : router_(std::move(router)),
      gate_up_(std::move(gate_up)),
      down_(std::move(down)),
      gate_up_qtype_(std::move(gate_up_qtype)),
      down_qtype_(std::move(down_qtype)),
      activation_(expert_activation(activation)),
      activation_bits_(activation_bits),
      top_k_(top_k),
      renormalize_(renormalize),
      shared_gate_up_(std::move(shared_gate_up)),
      shared_down_(std::move(shared_down)),
      shared_gate_(std::move(shared_gate)) {
  TORCH_CHECK(gate_up_.dim() == 3 && down_.dim() == 3 && gate_up_.size(0) == down_.size(0) &&
                  gate_up_.scalar_type() == at::kByte && down_.scalar_type() == at::kByte &&
                  gate_up_.is_contiguous() && down_.is_contiguous(),
              "gate_up and down: uint8 [num_experts, panels, panel_bytes], contiguous");
  TORCH_CHECK(router_.dim() == 2 && router_.size(0) == gate_up_.size(0),
              "router [num_experts, hidden]");
  TORCH_CHECK(top_k_ >= 1 && top_k_ <= router_.size(0), "top_k between 1 and num_experts");
  TORCH_CHECK(shared_gate_up_.has_value() == shared_down_.has_value() &&
                  shared_down_.has_value() == shared_gate_.has_value(),
              "the shared expert's gate_up, down and gate come together");
}

at::Tensor MoeBlock::forward(const at::Tensor& x) const {
  // As engine/models/moe.py routes: logits in x's dtype, the softmax and top k in fp32,
  // renormalized where the family does, the weights rounded to x's dtype.
  // at::linear through its operator: its own header would bring in ATen/Context.h
  const at::Tensor logits = at::_ops::linear::call(x, router_, std::nullopt);
  const at::Tensor probs = logits.to(at::kFloat).softmax(-1);
  auto [weights, expert_ids] = probs.topk(top_k_, -1);
  if (renormalize_) weights = weights.div(weights.sum(-1, true));
  weights = weights.to(x.scalar_type()).to(at::kFloat);
  at::Tensor out = experts(x, expert_ids, weights);
  if (shared_gate_up_) {
    const at::Tensor shared = (*shared_down_)((*shared_gate_up_)(x));
    out = out.add(at::_ops::linear::call(x, *shared_gate_, std::nullopt).sigmoid().mul(shared));
  }
  return out;
}

at::Tensor MoeBlock::experts(const at::Tensor& x, const at::Tensor& expert_ids,
                             const at::Tensor& weights) const {
  TORCH_CHECK(x.dim() == 2 && expert_ids.dim() == 2 && expert_ids.sizes() == weights.sizes() &&
                  expert_ids.size(0) == x.size(0),
              "x [tokens, hidden], expert_ids and weights [tokens, top_k]");
  const int64_t tokens = x.size(0), hidden = x.size(1), k = expert_ids.size(1);
  const int64_t num_experts = gate_up_.size(0), rows = tokens * k;
  const int64_t gate_up_panels = gate_up_.size(1), down_panels = down_.size(1);
  const int64_t width = gate_up_panels * 16 / 2;
  TORCH_CHECK(down_panels * 16 == hidden, "down's outputs are x's hidden size");
  const at::Tensor ids = expert_ids.to(at::kLong).contiguous();
  const at::Tensor w = weights.to(at::kFloat).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();

  // Sort the (token, slot) pairs by expert: row_of[pair] is the pair's row in that order.
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t i = 0; i < rows; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < num_experts, "expert id ", id[i], " out of range");
    ++start[id[i] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1), row_of(rows), token_of(rows);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = next[id[i]]++;
    row_of[i] = r;
    token_of[r] = i / k;
  }
  // The active experts: their runs of rows and their weights.
  std::vector<int64_t> offsets{0};
  std::vector<const uint8_t*> gate_up_weights, down_weights;
  const uint8_t* gate_up_base = gate_up_.data_ptr<uint8_t>();
  const uint8_t* down_base = down_.data_ptr<uint8_t>();
  for (int64_t e = 0; e < num_experts; ++e) {
    if (start[e + 1] == start[e]) continue;
    offsets.push_back(start[e + 1]);
    gate_up_weights.push_back(gate_up_base + e * gate_up_.stride(0));
    down_weights.push_back(down_base + e * down_.stride(0));
  }

  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor gathered = tensors::empty({rows, hidden}, xf.options());
  const float* xp = xf.data_ptr<float>();
  float* gp = gathered.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::copy(xp + token_of[r] * hidden, xp + (token_of[r] + 1) * hidden, gp + r * hidden);
    }
  });
  at::Tensor gate_up = tensors::empty({rows, 2 * width}, xf.options());
  quantized_linear_grouped(gathered, offsets, gate_up_weights, gate_up_panels, gate_up_.size(2),
                           gate_up_qtype_, activation_bits_, gate_up);
  // act(gate) * up, in fp32: one pass here rather than torch's ops on views.
  at::Tensor activated = tensors::empty({rows, width}, xf.options());
  const float* gu = gate_up.data_ptr<float>();
  float* ap = activated.data_ptr<float>();
  const bool silu = activation_ == GatedActivation::kSilu;
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gu + r * 2 * width;
      const float* u = g + width;
      float* a = ap + r * width;
      for (int64_t j = 0; j < width; ++j) a[j] = activate(g[j], silu) * u[j];
    }
  });
  at::Tensor expert_out = tensors::empty({rows, hidden}, xf.options());
  quantized_linear_grouped(activated, offsets, down_weights, down_panels, down_.size(2),
                           down_qtype_, activation_bits_, expert_out);

  // Each token's experts, in its slot order, weighted.
  at::Tensor out = tensors::empty({tokens, hidden}, xf.options());
  const float* yp = expert_out.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = op + t * hidden;
      std::fill(o, o + hidden, 0.f);
      for (int64_t s = 0; s < k; ++s) {
        const float weight = wp[t * k + s];
        const float* y = yp + row_of[t * k + s] * hidden;
        for (int64_t j = 0; j < hidden; ++j) o[j] += weight * y[j];
      }
    }
  });
  return out.to(x.scalar_type());
}
