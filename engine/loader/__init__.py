"""Weights, config and tokenizer from a model source: a safetensors folder (local or hub)
or a GGUF file.

Everything leaves here keyed by Hugging Face parameter names, on CPU, in the requested
dtype or, where asked, kept quantized (kernels/quantized.py's QuantizedWeight): the
model code never knows where its weights came from.

- source.py: what the user named -> a ModelSource (the embedded default model too)
- metadata.py: the HF config and tokenizer of a source
- weights.py: its state dict, from safetensors.py (with int8.py: weight-only int8) or
  gguf.py
"""

from hetero_infer.engine.loader.metadata import load_config, load_tokenizer
from hetero_infer.engine.loader.source import (
    DEFAULT_MODEL_PACKAGE,
    DEFAULT_MODEL_PIP,
    ModelSource,
    default_model_path,
    resolve_model,
)
from hetero_infer.engine.loader.weights import load_state_dict

__all__ = [
    "DEFAULT_MODEL_PACKAGE",
    "DEFAULT_MODEL_PIP",
    "ModelSource",
    "default_model_path",
    "load_config",
    "load_state_dict",
    "load_tokenizer",
    "resolve_model",
]
