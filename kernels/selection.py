"""The one place the kernels are chosen: once per engine, from its settings and device.

``attention_backend`` "auto" is Triton on CUDA (torch's reference where triton is not
installed) and the C++ kernels on the CPU (the torch reference where they did not build,
or ``cpu_kernels`` is off). "torch" is the reference on CUDA, the same as "auto" on the
CPU. "triton" is Triton on CUDA, and on CPU tensors only in Triton's interpreter
(``TRITON_INTERPRET=1``: slow, for tests).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from types import ModuleType

import torch
from hetero_infer.kernels.attention_backend import AttentionBackend
from hetero_infer.kernels.backends import BACKENDS
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.cpu_isa import cpu_flags
from hetero_infer.kernels.linear_choice import LinearChooser
from hetero_infer.kernels.ops import KernelOps, cpu_ops
from hetero_infer.kernels.paged_attention import torch_attention
from hetero_infer.kernels.paged_attention_cpu import cpu_attention

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernels:
    """What the model calls: attention, and every other op."""

    attention: AttentionBackend
    ops: KernelOps
    # which kernel runs each bf16 projection's rows on the CPU (None: ours wherever it
    # takes the weight), with what it chose once the model is packed
    linear_chooser: LinearChooser | None = None


def triton_available() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["triton"] = None
        return False


def select_kernels(
    attention_backend: str,
    device: torch.device,
    cpu_kernels: bool = True,
    linear_chooser: LinearChooser | None = None,
    amx: bool = True,
) -> Kernels:
    """The kernels an engine on ``device`` runs. ``cpu_kernels``: whether the C++ CPU
    kernels may be used (else the torch code runs, with the same results, more slowly);
    ``linear_chooser``: which of ours and oneDNN runs a bf16 projection's rows on the
    CPU (kernels/linear_choice.py; None: ours wherever it takes the weight); ``amx``:
    whether the C++ kernels may use AMX's tiles where the CPU has them. ValueError where
    the choice cannot run here."""
    if attention_backend not in BACKENDS:
        raise ValueError(
            f"attention_backend must be one of {', '.join(BACKENDS)}; got {attention_backend!r}"
        )
    on_cpu = device.type == "cpu"
    module = load_cpu_kernels() if on_cpu and cpu_kernels else None
    if module is not None:
        use_amx_tiles(module, amx)
    if not on_cpu or module is None:
        linear_chooser = None  # nothing to choose between: one kernel takes bf16 weights
    device_ops = cpu_ops(module, linear_chooser) if on_cpu else KernelOps()  # GPU: references
    if attention_backend == "triton":
        _check_triton_runs_on(device)
    elif attention_backend == "auto" and not on_cpu and not triton_available():
        logger.warning("triton is not installed: the torch kernels run on the GPU (slower)")
        attention_backend = "torch"
    if attention_backend == "triton" or (attention_backend == "auto" and not on_cpu):
        from hetero_infer.kernels.triton_backend import triton_attention, triton_ops

        return Kernels(triton_attention(), triton_ops(device_ops))
    if module is not None:
        return Kernels(cpu_attention(module), device_ops, linear_chooser)
    return Kernels(torch_attention(), device_ops)


def use_amx_tiles(module: ModuleType, wanted: bool) -> None:
    """AMX's tiles on or off for the C++ kernels (a process-wide switch), saying which."""
    module.set_amx_tiles(wanted)
    if module.amx_tiles_available():
        state = "in use" if wanted else "not used (cpu_amx is off)"
        logger.info(
            "AMX tiles: %s for bf16 projections, quantized projections of many rows and "
            "bf16 prefill attention",
            state,
        )
    elif "amx_tile" in cpu_flags():
        logger.warning(
            "AMX tiles: this CPU has them but the kernels cannot use them (not built for "
            "them, or the process was refused their state); the AVX-512 code runs"
        )


def _check_triton_runs_on(device: torch.device) -> None:
    if not triton_available():
        raise ValueError("attention_backend 'triton' needs the triton package installed")
    if device.type == "cpu":
        from hetero_infer.kernels.triton_utils import interpreting

        if not interpreting():
            raise ValueError(
                "attention_backend 'triton' on the CPU runs only in Triton's interpreter "
                "(TRITON_INTERPRET=1, slow: for tests); use 'auto' or 'torch'"
            )
