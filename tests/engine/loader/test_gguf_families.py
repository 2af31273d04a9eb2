"""Each family from a GGUF file as llama.cpp's converter writes it: its tensor names
(Qwen3's and Gemma 3's q/k norms, Gemma's four norms a layer, Phi-3's fused
projections), q/k rows in HF's order (permuted only for Llama's), Gemma's norms stored
as (1 + w). The engine on the file
gives transformers' greedy tokens on the checkpoint it was written from, in fp32.

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
from hetero_infer.engine.loader.gguf import GGUF_GLOBAL_NAMES, gguf_layer_parts
from hetero_infer.engine.models.architectures import family_of
from safetensors.torch import load_file

from tests.engine.test_exactness import random_prompts, reference_outputs
from tests.tiny_models import TINY_MODELS, save_tiny_model

FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3"]


def write_gguf(folder: Path, name: str) -> Path:
    """The checkpoint in ``folder`` as an F32 GGUF file with llama.cpp's names."""
    family = family_of(transformers.AutoConfig.from_pretrained(folder))
    to_gguf = {hf: part for part, hf in gguf_layer_parts(family).items()}
    to_gguf_global = {hf: gguf_name for gguf_name, hf in GGUF_GLOBAL_NAMES.items()}
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(path, family.gguf_arch)
    for hf_name, tensor in load_file(folder / "model.safetensors").items():
        if hf_name in to_gguf_global:
            gguf_name = to_gguf_global[hf_name]
        else:
            _, _, layer, *part, kind = hf_name.split(".")
            gguf_name = f"blk.{layer}.{to_gguf['.'.join(part)]}.{kind}"
        values = tensor.float().numpy()
        if family.gemma and hf_name.endswith("norm.weight"):
            values = values + np.float32(1)  # as llama.cpp's converter stores them
        writer.add_tensor(gguf_name, values)
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
