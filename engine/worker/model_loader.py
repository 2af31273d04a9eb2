"""Loading the model where the engine's setup says (engine/setup.py: its device and
dtype): the kernels are chosen once for them (kernels.select_kernels), and the model is
built on that device straight from the checkpoint.
"""

from __future__ import annotations

import logging
import time

import torch
from hetero_infer.engine import loader
from hetero_infer.engine.distributed.process_group import TensorParallelGroup
from hetero_infer.engine.loader.int8 import COMPRESSED_TENSORS
from hetero_infer.engine.loader.weights import checkpoint_quantized_by
from hetero_infer.engine.models import CausalLM, ModelConfig, build_model
from hetero_infer.engine.models.sharding import shard_state_dict
from hetero_infer.engine.settings import host_memory
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import Kernels, LinearChooser, select_kernels

logger = logging.getLogger(__name__)


def select_model_kernels(config: EngineConfig, device: torch.device) -> Kernels:
    # Ours wherever it takes the weight (the default) needs no chooser.
    mode = config.cpu_linear_kernel
    chooser = LinearChooser(mode) if mode != "kernel" else None
    try:
        kernels = select_kernels(
            config.attention_backend,
            device,
            config.cpu_kernels,
            linear_chooser=chooser,
            amx=config.cpu_amx,
        )
    except ValueError as exc:  # a backend that cannot run here
        raise ConfigError(str(exc)) from exc
    return kernels


def keeps_quantized(
    source: loader.ModelSource, quantization: str, dtype: torch.dtype, tensor_parallel: bool = False
) -> bool:
    """Whether the checkpoint's quantized weights are kept as stored (where a kernel
    takes them), or ConfigError where ``quantization`` does not fit the checkpoint.
    "auto" in fp32 dequantizes, so that fp32 stays exact against transformers on the
    same weights; a quantization named explicitly is kept in fp32 too. With tensor
    parallelism "auto" dequantizes (the ranks split float weights; EngineConfig refuses
    a quantization named explicitly)."""
    quantized_by = checkpoint_quantized_by(source)
    if quantization in ("gguf", COMPRESSED_TENSORS) and quantized_by != quantization:
        raise ConfigError(
            f"quantization {quantization!r} does not match {source.path}, which is "
            f"{'quantized by ' + quantized_by if quantized_by else 'not quantized'}"
        )
    if quantization == "int8" and source.is_gguf:
        raise ConfigError(
            "quantization 'int8' quantizes a safetensors checkpoint at load; a GGUF file "
            "keeps its own blocks ('auto' or 'gguf')"
        )
    if tensor_parallel:
        return False
    return quantization != "none" and (quantization != "auto" or dtype != torch.float32)


def load_model(
    source: loader.ModelSource,
    model_config: ModelConfig,
    kernels: Kernels,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str = "auto",
    tp: TensorParallelGroup | None = None,
) -> CausalLM:
    """The model on ``device``, its weights from ``source``; with ``tp``, this rank's
    share of it."""
    started = time.monotonic()
    keep_quantized = keeps_quantized(source, quantization, dtype, tensor_parallel=tp is not None)
    # Built without memory, then filled from the checkpoint: no random init.
    with torch.device("meta"):
        model = build_model(model_config, kernels, tp)
    model = model.to_empty(device=device).to(dtype)
    state_dict = loader.load_state_dict(
        source, dtype, keep_quantized, quantize_int8=quantization == "int8"
    )
    if tp is not None:
        state_dict = shard_state_dict(
            state_dict, tp.rank, tp.world_size, model_config, keep_whole=model.is_vision_weight
        )
    model.load_weights(state_dict)
    # On the CPU the packed weights share one buffer on huge pages, in step order.
    model.pack_weights(host_memory.gather_on_huge_pages if device.type == "cpu" else None)
    model.init_rope(device)
    model.eval()
    if kernels.linear_chooser is not None and kernels.linear_chooser.chosen:
        logger.info("%s", kernels.linear_chooser.table())
    if device.type == "cpu":
        host_memory.release_freed_memory()
    logger.info("loaded %s in %.1f s", source.path, time.monotonic() - started)
    return model
