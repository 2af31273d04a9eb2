"""Mixture-of-experts GGUF files as llama.cpp's converter writes them: the experts of a
layer merged into ffn_{gate,up,down}_exps [experts, out, in], the router as
ffn_gate_inp, Qwen2-MoE's shared expert as ffn_*_shexp with its gate as a vector
ffn_gate_inp_shexp, Mixtral filed as "llama" (q/k rows permuted) with an expert count.

The engine on such a file gives transformers' greedy tokens on the checkpoint it was
written from, in fp32; and the config the engine derives from the file's metadata is
the checkpoint's.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import metadata
from hetero_infer.engine.loader.gguf_moe import moe_gguf_config
from hetero_infer.engine.models import ModelConfig
from safetensors.torch import load_file

from tests.engine.loader.test_gguf_families import GGUF_ARCHS, gguf_tensor_name, write_gguf
from tests.engine.test_exactness import random_prompts, reference_outputs
from tests.tiny_models import MOE_MODELS, TINY_MODELS, save_tiny_model


def permute_for_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for a "llama" file (RoPE on adjacent pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# A checkpoint's expert tensor: "model.layers.{layer}.{mlp}.experts.{expert}.{proj}.weight"
# (Mixtral's mlp is "block_sparse_moe", its projections w1/w2/w3).
EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.(\w+)\.experts\.(\d+)\.(\w+)\.weight")


def write_moe_gguf(folder: Path, name: str, qtype: gguf.GGMLQuantizationType | None = None) -> Path:
    """The checkpoint in ``folder`` as a GGUF file with llama.cpp's names and MoE
    metadata; 2-D and 3-D weights as ``qtype`` where given (else F32), norms, biases
    and the router F32 (as llama-quantize leaves them).

    As llama.cpp's converter does: each layer's experts stacked per projection under
    the name "model.layers.{layer}.{mlp}.experts.{proj}.weight", and every tensor named
    by gguf-py's mapping."""
    config = transformers.AutoConfig.from_pretrained(folder)
    arch = GGUF_ARCHS[config.architectures[0]]
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_expert_feed_forward_length(width)
    if getattr(config, "shared_expert_intermediate_size", 0):
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)

    def add(hf_name: str, values: np.ndarray) -> None:
        gguf_name = gguf_tensor_name(hf_name, arch, config.num_hidden_layers)
        if hf_name.endswith("shared_expert_gate.weight"):
            values = values.reshape(-1)  # llama.cpp's [hidden]
        keep_float = values.ndim < 2 or "ffn_gate_inp" in gguf_name
        if qtype is None or keep_float:
            writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    stacks: dict[str, dict[int, np.ndarray]] = {}
    for hf_name, tensor in load_file(folder / "model.safetensors").items():
        values = tensor.float().numpy()
        if (expert := EXPERT_RE.fullmatch(hf_name)) is not None:
            layer, mlp, index, proj = expert.groups()
            merged_name = f"model.layers.{layer}.{mlp}.experts.{proj}.weight"
            stacks.setdefault(merged_name, {})[int(index)] = values
            continue
        if arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads
            if hf_name.endswith("k_proj.weight"):
                heads = config.num_key_value_heads
            values = permute_for_llama_cpp(values, heads)
        add(hf_name, values)
    for merged_name, per_expert in stacks.items():
        # by expert number: the file lists them by name (experts.10 before experts.2)
        assert sorted(per_expert) == list(range(experts)), merged_name
        add(merged_name, np.stack([per_expert[i] for i in range(experts)]))  # [experts, out, in]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", MOE_MODELS)
def test_a_moe_gguf_file_gives_the_checkpoints_tokens(name: str, tmp_path: Path, monkeypatch):
    folder = save_tiny_model(name, tmp_path / name)
    path = write_moe_gguf(folder, name)
    monkeypatch.setattr(metadata, "gguf_metadata_folder", lambda source: folder)
    prompts = random_prompts(3, TINY_MODELS[name]().vocab_size)[::3]
    expected = reference_outputs(folder, prompts)
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32"))
    outputs = engine.generate(
        prompts, SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False
    )
    assert [out.token_ids for out in outputs] == expected


@pytest.mark.parametrize("name", MOE_MODELS)
def test_the_config_from_the_files_metadata_is_the_checkpoints(name: str, tmp_path: Path):
    folder = save_tiny_model(name, tmp_path / name)
    path = write_moe_gguf(folder, name)
    from_file = ModelConfig.from_hf(moe_gguf_config(path))
    from_folder = ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(folder))
    for field in ("architecture", "moe", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
                  "num_layers", "qkv_bias", "qk_norm", "qk_norm_across_heads", "rope_theta",
                  "tie_word_embeddings", "vocab_size"):  # fmt: skip
        assert getattr(from_file, field) == getattr(from_folder, field), field
    # stored as fp32 in the file
    assert from_file.rms_norm_eps == pytest.approx(from_folder.rms_norm_eps, rel=1e-6)


def test_a_dense_gguf_file_has_no_moe_config(tmp_path: Path):
    folder = save_tiny_model("qwen3", tmp_path / "qwen3")
    assert moe_gguf_config(write_gguf(folder, "qwen3")) is None
