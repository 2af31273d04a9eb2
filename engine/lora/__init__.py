"""LoRA adapters served on the model: many at once, mixed in one batch (docs/lora.md).

adapter.py reads and checks a PEFT adapter; registry.py keeps the loaded ones in
max_loras slots; model_lora.py holds their weights beside the model's projections and
the running step's rows by adapter; manager.py loads and unloads them at run time.
"""

from hetero_infer.engine.lora.manager import LoRAManager
from hetero_infer.engine.lora.model_lora import ModelLoRA, step_groups
from hetero_infer.engine.lora.registry import LoRANotFoundError, LoRARequest

__all__ = ["LoRAManager", "LoRANotFoundError", "LoRARequest", "ModelLoRA", "step_groups"]
