// Python bindings of the CPU kernels (kernels/paged_attention_cpu.py builds them).

#include <torch/extension.h>

#include <optional>
#include <string>
#include <tuple>

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale, int64_t window);
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
              at::Tensor& v_cache, const at::Tensor& slot_mapping);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
bool linear_packed_available();
at::Tensor pack_linear_weight(const at::Tensor& weight);
at::Tensor pack_gated_linear_weight(const at::Tensor& weight);
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, bool gated);
bool quantized_linear_available();
at::Tensor pack_quantized_weight(const at::Tensor& data, const std::string& qtype,
                                 const std::optional<at::Tensor>& scales);
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                            const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q,
                                          const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin, bool is_neox);
std::tuple<at::Tensor, at::Tensor> greedy_pick(const at::Tensor& logits);
bool prefill_attention_available();
void prefill_attention(const at::Tensor& query, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& block_tables,
                       const at::Tensor& context_lens, const at::Tensor& chunk_starts,
                       const at::Tensor& chunk_lens, double scale, at::Tensor& out);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "paged decode attention");
  m.def("prefill_attention_available", &prefill_attention_available,
        "whether prefill_attention was built (AVX512-BF16)");
  m.def("prefill_attention", &prefill_attention, "tiled causal attention of prefill chunks");
  m.def("store_kv", &store_kv, "write keys/values into their cache slots (-1: skipped)");
  m.def("rms_norm", &rms_norm, "RMSNorm (bf16/fp16)");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "residual add + RMSNorm (bf16/fp16)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (bf16/fp16)");
  m.def("rotary", &rotary, "rotary embeddings of q and k (bf16/fp16)");
  m.def("linear_packed_available", &linear_packed_available,
        "whether linear_packed was built (AVX512-BF16)");
  m.def("pack_linear_weight", &pack_linear_weight, "a bf16 weight in linear_packed's panels");
  m.def("pack_gated_linear_weight", &pack_gated_linear_weight,
        "a merged gate_up weight in linear_packed's gated panels");
  m.def("linear_packed", &linear_packed, "x W^T + b in bf16 on a packed weight",
        py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("gated") = false);
  m.def("quantized_linear_available", &quantized_linear_available,
        "whether quantized_linear was built (AVX512-VNNI, -BW and -BF16)");
  m.def("pack_quantized_weight", &pack_quantized_weight,
        "a GGUF weight's blocks [N, row_bytes] (or int8 rows and their scales) in "
        "quantized_linear's panels",
        py::arg("data"), py::arg("qtype"), py::arg("scales") = py::none());
  m.def("quantized_linear", &quantized_linear, "x W^T + b on a packed quantized weight",
        py::arg("x"), py::arg("packed"), py::arg("qtype"), py::arg("bias"));
  m.def("greedy_pick", &greedy_pick, "argmax token of each row and its log-probability");
}
