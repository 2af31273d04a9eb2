// Python bindings of the CPU kernels (kernels/paged_attention_cpu.py builds them).

#include <torch/python.h>

#include "amx_tiles.h"
#include "cpu_kernels.h"
#include "decoder_stack_cpu.h"
#include "lora_cpu.h"
#include "moe_cpu.h"

// The kernels that take long run without the GIL, as torch's own operators do: the
// server's event loop (streaming the last step's tokens) goes on beside them.
using without_gil = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "paged decode attention", without_gil());
  m.def("prefill_attention_available", &prefill_attention_available,
        "whether prefill_attention was built (AVX-512 BW)");
  m.def("prefill_attention", &prefill_attention, "tiled causal attention of prefill chunks",
        without_gil());
  m.def("encoder_attention_available", &encoder_attention_available,
        "whether encoder_attention was built (AVX-512 BW)");
  m.def("encoder_attention", &encoder_attention,
        "attention within segments of one length (fp32, heads of 8, 16 or 32 dims)",
        without_gil());
  m.def("store_kv", &store_kv, "write keys/values into their cache slots (-1: skipped)");
  m.def("rms_norm", &rms_norm, "RMSNorm (bf16/fp16)");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "residual add + RMSNorm (bf16/fp16)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up (bf16/fp16)");
  m.def("gelu_tanh", &gelu_tanh, "GELU, tanh's approximation (bf16/fp16)", without_gil());
  m.def("rotary", &rotary, "rotary embeddings of q and k (bf16/fp16)");
  m.def("linear_packed_available", &linear_packed_available,
        "whether linear_packed was built (AVX-512 BW)");
  m.def("pack_linear_weight", &pack_linear_weight, "a bf16 weight in linear_packed's panels");
  m.def("pack_gated_linear_weight", &pack_gated_linear_weight,
        "a merged gate_up weight in linear_packed's gated panels");
  m.def("linear_packed", &linear_packed, "x W^T + b in bf16 on a packed weight",
        py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("gated") = false,
        py::arg("addend") = std::nullopt, without_gil());
  m.def("quantized_linear_available", &quantized_linear_available,
        "whether quantized_linear was built (AVX2, FMA and F16C)");
  m.def("amx_tiles_available", &amx_tiles_available,
        "whether the kernels may run on AMX's tiles (built for them, and granted them)");
  m.def("set_amx_tiles", &set_amx_tiles, "AMX's tiles on or off for the kernels; the previous wish");
  m.def("amx_tiles_ready", &amx_tiles::ready,
        "whether the kernels run on AMX's tiles now: available, and wished for");
  m.def("pack_quantized_weight", &pack_quantized_weight,
        "a GGUF weight's blocks [N, row_bytes] (or int8 rows and their scales) in "
        "quantized_linear's panels",
        py::arg("data"), py::arg("qtype"), py::arg("scales") = py::none());
  m.def("quantized_linear", &quantized_linear, "x W^T + b on a packed quantized weight",
        py::arg("x"), py::arg("packed"), py::arg("qtype"), py::arg("bias"),
        py::arg("activation_bits") = 8, without_gil());
  m.def("quantized_linear_bf16_ready", &quantized_linear_bf16_ready,
        "whether quantized_linear_bf16 runs here (AMX's tiles)");
  m.def("quantized_linear_bf16", &quantized_linear_bf16,
        "x W^T + b on AMX's bf16 tiles, the packed quantized weight dequantized to bf16",
        py::arg("x"), py::arg("packed"), py::arg("qtype"), py::arg("bias"), without_gil());
  m.def("greedy_pick", &greedy_pick,
        "argmax token of each row and its log-probability (NaN unless with_logprobs)",
        py::arg("logits"), py::arg("with_logprobs") = true, without_gil());
  m.def("pixel_levels", &pixel_levels,
        "8-bit pixels [n, channels, h, w] -> float32 by each channel's 256 levels",
        py::arg("pixels"), py::arg("levels"), py::arg("parallel"), without_gil());
  m.def("resample_vertical", &resample_vertical,
        "one pass of Pillow's resize along an 8-bit image's height (its weights given)",
        py::arg("image"), py::arg("bounds"), py::arg("weights"), py::arg("parallel"),
        without_gil());
  m.def("resample_horizontal", &resample_horizontal,
        "one pass of Pillow's resize along an 8-bit image's width (its weights given)",
        py::arg("image"), py::arg("bounds"), py::arg("weights"), py::arg("parallel"),
        without_gil());
  m.def("philox_uniform", &philox_uniform,
        "Philox4x32-10 uniforms in [0, 1) for keys [n] and counters [n, 2]");
  m.def("sample", &sample,
        "a step's sampling: processing, greedy or truncated draws, chosen logprobs "
        "(kernels/sampling.py's definition)",
        without_gil());
  py::class_<LoRAWeights, std::shared_ptr<LoRAWeights>>(m, "LoRAWeights")
      .def(py::init<at::Tensor, std::vector<int64_t>, std::vector<int64_t>,
                    std::vector<at::Tensor>>(),
           py::arg("a"), py::arg("out_starts"), py::arg("rank_starts"), py::arg("bs"));
  m.def("colocate_lora", &colocate_lora,
        "one projection's adapters' LoRA weights moved into one buffer, in order",
        py::arg("weights"));
  m.def("lora_add", &lora_add, "out += each LoRA adapter's update of its rows (grouped)",
        py::arg("out"), py::arg("x"), py::arg("rows"), py::arg("weights"),
        py::arg("assign") = false, without_gil());
  py::class_<PackedLinear>(m, "PackedLinear")
      .def(py::init<at::Tensor, std::string, std::optional<at::Tensor>, bool,
                    const std::string&, int64_t>(),
           py::arg("packed"), py::arg("qtype"), py::arg("bias"), py::arg("gated"),
           py::arg("then"), py::arg("activation_bits") = 8);
  py::class_<MoeBlock, std::shared_ptr<MoeBlock>>(m, "MoeBlock")
      .def(py::init<at::Tensor, at::Tensor, std::string, at::Tensor, std::string,
                    const std::string&, int64_t, int64_t, bool, std::optional<PackedLinear>,
                    std::optional<PackedLinear>, std::optional<at::Tensor>>(),
           py::arg("router"), py::arg("gate_up"), py::arg("gate_up_qtype"), py::arg("down"),
           py::arg("down_qtype"), py::arg("activation"), py::arg("activation_bits"),
           py::arg("top_k"), py::arg("renormalize"), py::arg("shared_gate_up") = py::none(),
           py::arg("shared_down") = py::none(), py::arg("shared_gate") = py::none())
      .def("forward", &MoeBlock::forward, "x [tokens, hidden] -> the block's output",
           py::arg("x"), without_gil())
      .def("experts", &MoeBlock::experts,
           "the routed experts alone, combined: (x, expert_ids, weights) -> [tokens, hidden]",
           py::arg("x"), py::arg("expert_ids"), py::arg("weights"), without_gil());
  m.def(
      "decoder_layer_unserved",
      [](const py::dict& description) {
        std::vector<std::string> unserved;
        read_decoder_layer(description, unserved);
        return unserved;
      },
      "the parts of a decoder layer's description the stack does not compute",
      py::arg("layer"));
  py::class_<DecoderStack>(m, "DecoderStack")
      .def(py::init<int64_t, int64_t, int64_t, double, double, double>(), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("scale"),
           py::arg("softcap") = 0.0)
      .def(
          "add_layer",
          [](DecoderStack& stack, const py::dict& description) {
            std::vector<std::string> unserved;
            auto layer = read_decoder_layer(description, unserved);
            if (!layer) throw py::value_error("the CPU decoder stack does not run " + unserved[0]);
            stack.add_layer(std::move(*layer));
          },
          "a decoder layer, as kernels/decoder_stack.py's DecoderLayerSpec describes it",
          py::arg("layer"))
      .def("set_lora", &DecoderStack::set_lora, "a LoRA adapter's weights on a projection",
           py::arg("layer"), py::arg("projection"), py::arg("slot"), py::arg("weights"))
      .def("remove_lora", &DecoderStack::remove_lora, "a LoRA slot emptied", py::arg("slot"))
      .def("forward", &DecoderStack::forward,
           "a decode step's layers: (hidden, residual) before the final norm", py::arg("x"),
           py::arg("positions"), py::arg("k_caches"), py::arg("v_caches"),
           py::arg("block_tables"), py::arg("context_lens"), py::arg("slot_mappings"),
           py::arg("lora_slots") = std::vector<int64_t>{},
           py::arg("lora_rows") = std::vector<std::optional<at::Tensor>>{}, without_gil());
}
