"""LoRA adapters for the tiny models (tests/tiny_models.py), built and saved by PEFT,
and the reference they are measured against: transformers on PEFT's merged weights.

PEFT initializes B to zeros (an adapter that changes nothing); these draw A and B at
random (init_lora_weights=False) and scale B up, so that each adapter changes most
greedy tokens: an engine that dropped or mixed up adapters would fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapter(
    model_dir: Path,
    out: Path,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    modules: list[str] | None = None,
    b_scale: float = 3.0,
    **config: object,
) -> Path:
    """A random LoRA adapter on the model in ``model_dir``, saved by PEFT in ``out``."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=modules or ALL_MODULES,
        init_lora_weights=False,
        **config,
    )
    model = get_peft_model(base, lora_config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(b_scale)
    model.save_pretrained(out)
    return out


def merged_model(model_dir: Path, adapter_dir: Path | None) -> torch.nn.Module:
    """transformers' model with the adapter's weights merged in by PEFT (fp32)."""
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is None:
        return base.eval()
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()


def edit_adapter_config(adapter_dir: Path, **changes: object) -> None:
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
