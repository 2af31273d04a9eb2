"""Each family from a GGUF file as llama.cpp's converter writes it: its tensor names
(Qwen3's and Gemma 3's q/k norms, Gemma's four norms a layer, Phi-3's fused
projections) given by gguf-py's mapping, not the engine's tables (a wrong entry there
would otherwise read back what it wrote), q/k rows in HF's order (permuted only for
Llama's), Gemma's norms stored as (1 + w). The engine on the file gives transformers'
greedy tokens on the checkpoint it was written from, in fp32.

The file carries no tokenizer: its config and tokenizer come from the checkpoint's
folder (turning a GGUF's metadata into them is transformers' work, tested with the
real files in test_gguf.py).
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
from safetensors.torch import load_file

from tests.engine.test_exactness import random_prompts, reference_outputs
from tests.tiny_models import TINY_MODELS, save_tiny_model

FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3"]

# The architecture llama.cpp's converter files each HF architecture under (Mixtral's
# as "llama"). Written out here, as the tensor names below come from gguf-py, so that
# the files do not depend on the engine's own tables.
GGUF_ARCHS = {
    "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
    "Gemma2ForCausalLM": gguf.MODEL_ARCH.GEMMA2,
    "Gemma3ForCausalLM": gguf.MODEL_ARCH.GEMMA3,
    "Phi3ForCausalLM": gguf.MODEL_ARCH.PHI3,
    "MixtralForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "Qwen2MoeForCausalLM": gguf.MODEL_ARCH.QWEN2MOE,
    "Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE,
    "OlmoeForCausalLM": gguf.MODEL_ARCH.OLMOE,
}


def gguf_tensor_name(hf_name: str, arch: gguf.MODEL_ARCH, n_blocks: int) -> str:
    """The GGUF name llama.cpp's converter gives the HF tensor ``hf_name``, by gguf-py's
    mapping (the converter's own).

    A few tiny checkpoints hold tensors their llama.cpp architecture has no slot for
    (Gemma 2's untied head; the dense MLP of Qwen-MoE's mixed layers): those take the
    name gguf-py gives them under "llama", which the engine reads too.
    """
    suffixes = (".weight", ".bias")
    name = gguf.get_tensor_name_map(arch, n_blocks).get_name(hf_name, try_suffixes=suffixes)
    if name is None:
        llama = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
        name = llama.get_name(hf_name, try_suffixes=suffixes)
    assert name is not None, f"gguf-py has no name for {hf_name}"
    return name


def write_gguf(folder: Path, name: str) -> Path:
    """The checkpoint in ``folder`` as an F32 GGUF file with llama.cpp's names."""
    config = transformers.AutoConfig.from_pretrained(folder)
    arch = GGUF_ARCHS[config.architectures[0]]
    gemma = arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3)
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    for hf_name, tensor in load_file(folder / "model.safetensors").items():
        values = tensor.float().numpy()
        if gemma and hf_name.endswith("norm.weight"):
            values = values + np.float32(1)  # as llama.cpp's converter stores them
        writer.add_tensor(gguf_tensor_name(hf_name, arch, config.num_hidden_layers), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", FAMILIES)
def test_a_gguf_file_gives_the_checkpoints_tokens(name: str, tmp_path: Path, monkeypatch):
    folder = save_tiny_model(name, tmp_path / name)
    path = write_gguf(folder, name)
    monkeypatch.setattr(metadata, "gguf_metadata_folder", lambda source: folder)
    prompts = random_prompts(3, TINY_MODELS[name]().vocab_size)[::3]
    expected = reference_outputs(folder, prompts)
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32"))
    params = SamplingParams(max_tokens=24, temperature=0.0)
    outputs = engine.generate(prompts, params, use_tqdm=False)
    assert [out.token_ids for out in outputs] == expected
    assert torch.equal(
        engine.runner.model.layers[0].input_layernorm.weight,
        load_file(folder / "model.safetensors")["model.layers.0.input_layernorm.weight"]
        + engine.model_config.norm_weight_offset,
    )
