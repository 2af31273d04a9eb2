"""engine/setup.py's default dtype: bf16 where the CPU computes in bf16, and on CPUs
without bf16 instructions where our kernels run the projections in bf16 anyway: the
int8 kernel on projections kept quantized (fp32 would not use it: it dequantizes to
stay exact), the bf16 linear kernel on float ones (it needs AVX-512 alone); fp32 for
the rest."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.setup import (
    bf16_kernels_on_cpu,
    quantized_on_cpu,
    resolve_dtype,
    resolve_setup,
)
from hetero_infer.kernels import has_bf16_matmul, kernel_unavailable

from tests.engine.loader.test_gguf_header import write_gguf
from tests.tiny_models import save_tiny_model

CPU = torch.device("cpu")
QUANTIZED_KERNEL = kernel_unavailable("quantized_linear") is None
LINEAR_KERNEL = kernel_unavailable("linear_packed") is None


def test_our_bf16_kernels_take_bf16_on_any_cpu() -> None:
    assert resolve_dtype("auto", CPU, bf16_kernels=True) == torch.bfloat16
    plain = torch.bfloat16 if has_bf16_matmul() else torch.float32
    assert resolve_dtype("auto", CPU, bf16_kernels=False) == plain
    assert resolve_dtype("float32", CPU, bf16_kernels=True) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda"), bf16_kernels=False) == torch.bfloat16


def test_the_embedded_q4_1_model_serves_bf16_where_the_kernel_runs() -> None:
    source = resolve_model(None)
    assert quantized_on_cpu(EngineConfig(), source, CPU) == QUANTIZED_KERNEL
    kernels = QUANTIZED_KERNEL or LINEAR_KERNEL
    expected = torch.bfloat16 if kernels or has_bf16_matmul() else torch.float32
    assert resolve_setup(EngineConfig()).dtype == expected


def test_a_float_model_serves_bf16_where_the_linear_kernel_runs(tmp_path) -> None:
    folder = str(save_tiny_model("llama", tmp_path / "llama"))
    source = resolve_model(folder)
    assert bf16_kernels_on_cpu(EngineConfig(model=folder), source, CPU) == LINEAR_KERNEL
    off = EngineConfig(model=folder, cpu_kernels=False)
    assert not bf16_kernels_on_cpu(off, source, CPU)
    assert not bf16_kernels_on_cpu(EngineConfig(model=folder), source, torch.device("cuda"))
    plain = torch.bfloat16 if has_bf16_matmul() else torch.float32
    assert resolve_setup(off).dtype == plain
    kernel = torch.bfloat16 if LINEAR_KERNEL else plain
    assert resolve_setup(EngineConfig(model=folder)).dtype == kernel


@pytest.mark.parametrize(
    "settings",
    [dict(quantization="none"), dict(cpu_kernels=False), dict(tensor_parallel_size=2)],
)
def test_dequantized_projections_are_not_counted(settings) -> None:
    """Where the weights are dequantized at load, or the int8 kernel is off."""
    assert not quantized_on_cpu(EngineConfig(**settings), resolve_model(None), CPU)


def test_only_gguf_types_the_kernel_takes_count(tmp_path) -> None:
    config = EngineConfig()
    for file_type, kept in (
        (15, True),
        (7, True),
        (1, False),
        (12, False),
    ):  # Q4_K_M Q8_0 F16 Q3_K_M
        path = write_gguf(tmp_path / f"{file_type}.gguf", file_type)
        source = resolve_model(str(path))
        assert quantized_on_cpu(config, source, CPU) == (kept and QUANTIZED_KERNEL)
    assert not quantized_on_cpu(config, resolve_model(None), torch.device("cuda"))
