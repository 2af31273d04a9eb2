// The CPU kernels' entry points, for the bindings and for kernels that call others
// (decoder_stack_cpu.cpp runs a whole decode step's layers through them).
#pragma once

#include "tensor_api.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale, int64_t window,
                            double softcap);
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
              at::Tensor& v_cache, const at::Tensor& slot_mapping);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
at::Tensor gelu_tanh(const at::Tensor& x);
bool linear_packed_available();
at::Tensor pack_linear_weight(const at::Tensor& weight);
at::Tensor pack_gated_linear_weight(const at::Tensor& weight);
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, bool gated,
                         const std::optional<at::Tensor>& addend = std::nullopt);
// linear_packed taken apart: its checks and output made once, its panels then run in
// shares (run_share(t, n) for t in 0 .. n - 1, from any threads), so that a parallel
// region can run them beside other work (work_in_shares.h).
class PackedLinearWork {
 public:
  PackedLinearWork(const at::Tensor& x, const at::Tensor& packed,
                   const std::optional<at::Tensor>& bias, bool gated,
                   const std::optional<at::Tensor>& addend);
  void run_share(int64_t thread, int64_t threads) const;
  int64_t useful_shares() const;  // a thread's worth each: no more than the panels

  at::Tensor out;  // [M, N], or [M, N / 2] where gated

 private:
  bool gated_;
  bool tiles_;  // on AMX's tiles (linear_amx.h)
  int64_t rows_, pairs_, panels_;
  at::Tensor x_, packed_, bias_, addend_;
};
bool quantized_linear_available();
at::Tensor pack_quantized_weight(const at::Tensor& data, const std::string& qtype,
                                 const std::optional<at::Tensor>& scales);
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                            const std::optional<at::Tensor>& bias, int64_t activation_bits = 8);
// quantized_linear taken apart as PackedLinearWork takes linear_packed: its checks,
// output and quantized activations made once (x's quantization a parallel region of its
// own), its panels then run in shares.
class QuantizedLinearWork {
 public:
  QuantizedLinearWork(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                      const std::optional<at::Tensor>& bias, int64_t activation_bits);
  void run_share(int64_t thread, int64_t threads) const;
  // A thread's worth each: few enough that each has at least kMinThreadWork
  int64_t useful_shares() const;

  at::Tensor out;  // [M, N] in x's dtype

 private:
  struct Plan;  // quantized_linear_cpu.cpp's
  std::shared_ptr<const Plan> plan_;
};
// quantized_linear's product on AMX's bf16 tiles, the weight dequantized to bf16 and x
// rounded to it (not the int8 kernels' bits): where quantized_linear_bf16_ready().
bool quantized_linear_bf16_ready();
at::Tensor quantized_linear_bf16(const at::Tensor& x, const at::Tensor& packed,
                                 const std::string& qtype, const std::optional<at::Tensor>& bias);
// quantized_linear over several packed weights, each on its own run of x's rows (fp32),
// into out [R, N] fp32, in one parallel pass: a mixture-of-experts step's experts.
void quantized_linear_grouped(const at::Tensor& x, const std::vector<int64_t>& row_offsets,
                              const std::vector<const uint8_t*>& weights, int64_t panels,
                              int64_t panel_bytes, const std::string& qtype,
                              int64_t activation_bits, at::Tensor& out);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q,
                                          const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin, bool is_neox);
std::tuple<at::Tensor, at::Tensor> greedy_pick(const at::Tensor& logits, bool with_logprobs);
at::Tensor philox_uniform(const at::Tensor& keys, const at::Tensor& counters);
at::Tensor pixel_levels(const at::Tensor& pixels, const at::Tensor& levels, bool parallel);
at::Tensor resample_vertical(const at::Tensor& image, const at::Tensor& bounds,
                             const at::Tensor& weights, bool parallel);
at::Tensor resample_horizontal(const at::Tensor& image, const at::Tensor& bounds,
                               const at::Tensor& weights, bool parallel);
std::tuple<at::Tensor, at::Tensor> sample(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& uniforms,
    const at::Tensor& wants_logprob, const at::Tensor& presence, const at::Tensor& frequency,
    const at::Tensor& repetition, const at::Tensor& prompt_offsets, const at::Tensor& prompt_ids,
    const at::Tensor& output_offsets, const at::Tensor& output_ids,
    const at::Tensor& bias_offsets, const at::Tensor& bias_ids, const at::Tensor& bias_values,
    const at::Tensor& banned_offsets, const at::Tensor& banned_ids, const at::Tensor& allowed);
bool encoder_attention_available();
at::Tensor encoder_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale);
bool prefill_attention_available();
void prefill_attention(const at::Tensor& query, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& block_tables,
                       const at::Tensor& context_lens, const at::Tensor& chunk_starts,
                       const at::Tensor& chunk_lens, double scale, double softcap,
                       at::Tensor& out);
