"""Compressed-tensors weight-only int8 (W8A16) checkpoints of tiny models, written the
way llm-compressor writes them, beside a float checkpoint of the same dequantized
weights for transformers to run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from tests.helpers import make_byte_fallback_tokenizer

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantization_config(fmt: str) -> dict:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}
        },
        "ignore": ["lm_head"],
    }


def save_int8_checkpoint(
    model: transformers.PreTrainedModel, folder: Path, reference: Path, fmt: str = "int-quantized"
) -> dict[str, torch.Tensor]:
    """``model``'s linear weights quantized per output row (bf16 scales, as a bf16
    model's checkpoint stores them) into ``folder`` in compressed-tensors ``fmt``
    ("int-quantized" or "pack-quantized"), and the dequantized model in fp32 into
    ``reference``. Returns the int8 values by weight name."""
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    tensors, values_by_name = {}, {}
    for name, tensor in state.items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if not any(f"{linear}.weight" in name for linear in LINEAR_NAMES):
            tensors[name] = tensor.contiguous()
            continue
        scale = (tensor.float().abs().amax(dim=1, keepdim=True) / 127).bfloat16()
        values = torch.round(tensor.float() / scale.float()).clamp(-128, 127).to(torch.int8)
        values_by_name[name] = values
        state[name] = values.float() * scale.float()  # what the checkpoint means
        tensors[name + "_scale"] = scale
        if fmt == "pack-quantized":
            # Four values plus 128 per int32, the first in the lowest byte; rows padded.
            unsigned = (values.to(torch.int16) + 128).to(torch.uint8)
            pad = -unsigned.shape[1] % 4
            unsigned = torch.nn.functional.pad(unsigned, (0, pad))
            tensors[name + "_packed"] = unsigned.view(torch.int32).contiguous()
            tensors[name + "_shape"] = torch.tensor(list(values.shape), dtype=torch.int32)
        else:
            tensors[name] = values
    model.load_state_dict(state)
    model.save_pretrained(reference)
    make_byte_fallback_tokenizer().save_pretrained(reference)

    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    make_byte_fallback_tokenizer().save_pretrained(folder)
    return values_by_name
