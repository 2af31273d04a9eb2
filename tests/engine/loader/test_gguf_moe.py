"""Mixture-of-experts GGUF files as llama.cpp's converter writes them: the experts of a
layer merged into ffn_{gate,up,down}_exps [experts, out, in], the router as
ffn_gate_inp, Qwen2-MoE's shared expert as ffn_*_shexp with its gate as a vector
ffn_gate_inp_shexp, Mixtral filed as "llama" (q/k rows permuted) with an expert count.

The engine on such a file gives transformers' greedy tokens on the checkpoint it was
written from, in fp32; and the config the engine derives from the file's metadata is
the checkpoint's.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import metadata
from hetero_infer.engine.loader.gguf import GGUF_GLOBAL_NAMES, gguf_layer_parts
from hetero_infer.engine.loader.gguf_moe import moe_gguf_config
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.models.architectures import family_of

from tests.engine.test_exactness import random_prompts, reference_outputs
from tests.tiny_models import MOE_MODELS, TINY_MODELS, save_tiny_model


def permute_for_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for a "llama" file (RoPE on adjacent pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_moe_gguf(folder: Path, name: str, qtype: gguf.GGMLQuantizationType | None = None) -> Path:
    """The checkpoint in ``folder`` as a GGUF file with llama.cpp's names and MoE
    metadata; 2-D and 3-D weights as ``qtype`` where given (else F32), norms, biases
    and the router F32 (as llama-quantize leaves them)."""
    config = transformers.AutoConfig.from_pretrained(folder)
    family = family_of(config)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    to_gguf = {hf: part for part, hf in gguf_layer_parts(family).items()}
    to_gguf_global = {hf: gguf_name for gguf_name, hf in GGUF_GLOBAL_NAMES.items()}
    arch = family.gguf_arch
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(path, arch)
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

    def add(gguf_name: str, values: np.ndarray) -> None:
        keep_float = values.ndim < 2 or "ffn_gate_inp" in gguf_name
        if qtype is None or keep_float:
            writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    for hf_name, tensor in model.state_dict().items():
        values = tensor.float().numpy()
        if hf_name in to_gguf_global:
            add(to_gguf_global[hf_name], values)
            continue
        _, _, layer, *rest = hf_name.split(".")
        part = ".".join(rest)
        if part == "mlp.experts.gate_up_proj":  # [experts, 2 * width, hidden]
            add(f"blk.{layer}.ffn_gate_exps.weight", values[:, :width])
            add(f"blk.{layer}.ffn_up_exps.weight", values[:, width:])
            continue
        if part == "mlp.experts.down_proj":
            add(f"blk.{layer}.ffn_down_exps.weight", values)
            continue
        module, kind = part.rsplit(".", 1)
        gguf_part = to_gguf[module]
        if gguf_part == "ffn_gate_inp_shexp":
            values = values.reshape(-1)  # llama.cpp's [hidden]
        if family.gguf_permuted_qk and gguf_part in ("attn_q", "attn_k"):
            heads = (
                config.num_attention_heads if gguf_part == "attn_q" else config.num_key_value_heads
            )
            values = permute_for_llama_cpp(values, heads)
        add(f"blk.{layer}.{gguf_part}.{kind}", values)
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
    from tests.engine.loader.test_gguf_families import write_gguf

    folder = save_tiny_model("qwen3", tmp_path / "qwen3")
    assert moe_gguf_config(write_gguf(folder, "qwen3")) is None
