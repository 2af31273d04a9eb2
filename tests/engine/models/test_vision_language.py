"""engine/models/vision_language.py: a vision-language model's vision side ends up on
the model's device, whatever device the loader's tensors are on (the vision modules
assign the tensors they are given; on a GPU the loader's CPU tensors stayed on the CPU,
and the step's embeddings met the text model's on another device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hetero_infer.engine import loader
from hetero_infer.engine.models import ModelConfig, build_model
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.kernels import select_kernels

from tests.tiny_models import save_tiny_gemma3_vision, save_tiny_idefics3, save_tiny_qwen2_5_vl

FAMILIES = {
    "idefics3": save_tiny_idefics3,
    "gemma3": save_tiny_gemma3_vision,
    "qwen2_5_vl": save_tiny_qwen2_5_vl,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vision_side_is_loaded_onto_the_models_device(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = loader.resolve_model(str(FAMILIES[family](tmp_path)))
    config = ModelConfig.from_hf(loader.load_config(source))
    with torch.device("meta"):
        model = build_model(config, select_kernels("auto", torch.device("cpu")))
    # A device other than the loader's CPU, without a GPU: the meta device, as load_model
    # puts the model on its device (to_empty) before it loads the weights.
    model = model.to_empty(device="meta")
    # The text side is loaded by the decoder's own code, tested with the engine.
    monkeypatch.setattr(DecoderForCausalLM, "load_weights", lambda self, state_dict: None)
    state_dict = loader.load_state_dict(source, torch.float32)
    assert {t.device.type for t in state_dict.values()} == {"cpu"}
    model.load_weights(state_dict)
    devices = {p.device.type for p in model.vision.parameters()}
    devices |= {b.device.type for b in model.vision.buffers()}
    assert devices == {"meta"}
