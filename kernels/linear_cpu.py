"""bf16 linear layers on the CPU with weights packed once, when the model is loaded.

Where the C++ kernels are built with AVX-512 (kernels/csrc/linear_cpu.cpp), a
weight whose output count is a multiple of 32 and input count even is packed into
that kernel's panels: in the offline benchmark's step shapes, with weights streamed
from memory as in a real step, it ran 350-440 GFLOP/s at 32-128 rows where oneDNN ran
290-370, and about twice oneDNN's rate at 1-8 rows. Other weights go to oneDNN, also
on a copy packed once into its blocked layout (``_reorder_linear_weight``): torch's
``F.linear`` reorders the weight on every call, 10-25% slower. The packed copy is kept
by the returned object beside its weight (e.g. 270 MB for SmolLM2). Where neither is
available, torch's ``F.linear`` runs, in fp32 from WIDEN_ROWS rows where the CPU has no
bf16 arithmetic (WidenedLinear).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from hetero_infer.kernels import cpu_isa
from hetero_infer.kernels.linear import GatedLinear, LinearFn, TorchLinear
from hetero_infer.kernels.linear_choice import (
    KERNEL,
    ONEDNN,
    STREAM_BYTES,
    LinearChooser,
    ShapeChoice,
    Timer,
    num_copies,
    stream_timer,
)
from hetero_infer.kernels.linear_quantized import QuantizedLinear
from hetero_infer.kernels.quantized import QuantizedWeight

logger = logging.getLogger(__name__)

# Rows from which WidenedLinear computes a bf16 product in fp32. Widening the weight
# costs a pass over it, which 16 rows repay on every shape measured (AVX2 EPYC, one
# thread: SmolLM2's projections 3-5x faster, its 49152-row lm_head 1.4x); at 2-8 rows
# the lm_head ran 1.3-5x slower widened, the projections already faster.
WIDEN_ROWS = 16


class KernelLinear:
    """x [..., in] @ weight^T + bias by our kernel on the weight's panels; ``gated``:
    a merged gate_up weight [2 * d, in] whose fp32 sums become silu(gate) * up [..., d]
    in the same pass. ``addend`` (fp32 [rows, out], gate then up where gated) is added
    to the sums before they are rounded or activated: LoRA's updates of a gate_up."""

    def __init__(
        self,
        module: ModuleType,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        gated: bool = False,
    ) -> None:
        pack = module.pack_gated_linear_weight if gated else module.pack_linear_weight
        self.packed = pack(weight.detach())  # [out / 32, in / 2, 32]
        self.run = module.linear_packed
        self.bias, self.gated = bias, gated
        self.out_features = weight.shape[0] // 2 if gated else weight.shape[0]

    def __call__(self, x: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
        out = self.run(x.reshape(-1, x.shape[-1]), self.packed, self.bias, self.gated, addend)
        return out.view(*x.shape[:-1], self.out_features)


class WidenedLinear(TorchLinear):
    """torch's F.linear on a bf16 weight, where the CPU has no bf16 arithmetic and
    neither packed form takes the weight: torch then emulates the bf16 matmul, about
    3 GFLOP/s a core, so from WIDEN_ROWS rows the rows and the weight are widened to
    fp32 (each product exact, the sums in fp32, rounded to bf16 once, as a bf16 matmul
    rounds them): 5-7x faster at 16-32 rows on SmolLM2's projections."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < WIDEN_ROWS * x.shape[-1]:
            return super().__call__(x)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> TorchLinear:
    """torch's F.linear on the weight as it is, widened from WIDEN_ROWS rows for a bf16
    weight where the CPU has no bf16 arithmetic."""
    if bf16_cpu_matrix(weight) and not cpu_isa.has_bf16_matmul():
        return WidenedLinear(weight, bias)
    return TorchLinear(weight, bias)


class OneDnnLinear:
    """x [..., in] @ weight^T + bias by oneDNN on its packed copy of the weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        # 128: the batch size oneDNN picks its blocked layout for.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 128)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def bf16_cpu_matrix(weight: torch.Tensor) -> bool:
    """What both packed forms take: a bf16 weight [out, in] on the CPU."""
    return weight.is_cpu and weight.dtype == torch.bfloat16 and weight.dim() == 2


def kernel_takes(module: ModuleType | None, weight: torch.Tensor) -> bool:
    """Whether the bf16 kernel takes this weight [out, in]."""
    return (
        module is not None
        and module.linear_packed_available()
        and bf16_cpu_matrix(weight)
        and weight.shape[0] % 32 == 0
        and weight.shape[1] % 2 == 0
    )


def onednn_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn | None:
    """oneDNN on its packed copy of a bf16 CPU weight, or None where it cannot take it
    here (then torch's F.linear runs)."""
    if not (bf16_cpu_matrix(weight) and onednn_runs()):
        return None
    return tried_onednn_linear(weight, bias)


def tried_onednn_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn | None:
    """OneDnnLinear, with one row through it: it fails here, if at all, not in a step."""
    try:
        linear = OneDnnLinear(weight, bias)
        with torch.no_grad():
            linear(torch.zeros(1, weight.shape[1], dtype=weight.dtype))
    except (AttributeError, RuntimeError) as exc:
        logger.warning("packed oneDNN linear unavailable, using F.linear: %s", exc)
        return None
    return linear


def pack_linear(
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None,
    module: ModuleType | None,
    chooser: LinearChooser | None = None,
) -> LinearFn:
    """A bf16 CPU weight packed for our kernel (``module``, where built) or oneDNN, or
    both, each for the rows ``chooser`` gives it (without one: ours wherever it takes the
    weight); a quantized weight for the quantized kernels (which the caller checked take
    it); any other weight as it is, for torch's F.linear."""
    if isinstance(weight, QuantizedWeight):
        # A chooser gives up batch-independent results for speed: so do AMX's bf16 tiles.
        return QuantizedLinear(module, weight, bias, bf16_tiles=chooser is not None)
    if not kernel_takes(module, weight):
        return onednn_linear(weight, bias) or torch_linear(weight, bias)
    return ours_or_onednn(
        weight,
        chooser,
        lambda w: KernelLinear(module, w, bias),
        lambda w: OneDnnLinear(w, bias),
    )


def pack_gated_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    module: ModuleType | None,
    chooser: LinearChooser | None = None,
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> LinearFn | None:
    """silu-and-mul of x @ weight^T, for a merged gate_up weight our kernel takes (and no
    bias): in one pass by our kernel, or by oneDNN then ``silu_and_mul``, each for the
    rows ``chooser`` gives it; None where our kernel does not take it."""
    if isinstance(weight, QuantizedWeight) or bias is not None or not kernel_takes(module, weight):
        return None
    return ours_or_onednn(
        weight,
        chooser if silu_and_mul is not None else None,
        lambda w: KernelLinear(module, w, gated=True),
        lambda w: GatedLinear(OneDnnLinear(w), silu_and_mul, "silu"),
        gated=True,
    )


def ours_or_onednn(
    weight: torch.Tensor,
    chooser: LinearChooser | None,
    ours: Callable[[torch.Tensor], KernelLinear],
    onednn: Callable[[torch.Tensor], LinearFn],
    gated: bool = False,
) -> LinearFn:
    """For a weight our kernel takes: ours, oneDNN's, or both split by rows, as
    ``chooser`` has it (None: ours)."""
    if chooser is None or not onednn_runs():
        return ours(weight)
    out_features, in_features = weight.shape
    choice = chooser.choose(
        f"{out_features}x{in_features}{' gated' if gated else ''}",
        lambda: copies_timer(weight, ours, onednn),
    )
    kernels = set(choice.kernels)
    if kernels == {ONEDNN}:
        return onednn(weight)
    if kernels == {KERNEL}:
        return ours(weight)
    return RowSplitLinear(ours(weight), onednn(weight), choice)


@functools.cache
def onednn_runs() -> bool:
    """Whether oneDNN's packed bf16 matmul runs on this CPU: tried once (where it does
    not, one warning rather than one a layer)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return tried_onednn_linear(torch.zeros(32, 32, dtype=torch.bfloat16), None) is not None


def copies_timer(
    weight: torch.Tensor,
    ours: Callable[[torch.Tensor], LinearFn],
    onednn: Callable[[torch.Tensor], LinearFn],
) -> Timer:
    """The choice's timer for ``weight``: each candidate packed on copies of it, which a
    timing streams through as a step streams the layers' weights. A weight larger than
    STREAM_BYTES is timed on its first rows: the same work a row, without packing all of
    it twice more (an 8B model's lm_head is 1 GB)."""
    rows = max(64, STREAM_BYTES // (weight.shape[1] * weight.element_size()) // 64 * 64)
    weight = weight[:rows]
    copies = [weight] + [weight.clone() for _ in range(num_copies(weight) - 1)]
    packers = {KERNEL: ours, ONEDNN: onednn}
    return stream_timer(lambda kind: [packers[kind](w) for w in copies], weight.shape[1])


class RowSplitLinear:
    """Our kernel for the calls whose rows the choice gives it, oneDNN for the others;
    the attributes of our kernel's form (``packed``, ``gated``, ``out_features``), which
    the one-call decoder stack, LoRA and the placement of packed weights read."""

    def __init__(self, kernel: KernelLinear, onednn: LinearFn, choice: ShapeChoice) -> None:
        self.kernel, self.onednn, self.choice = kernel, onednn, choice
        self.gated, self.out_features = kernel.gated, kernel.out_features

    @property
    def packed(self) -> torch.Tensor:
        return self.kernel.packed

    @packed.setter
    def packed(self, packed: torch.Tensor) -> None:  # placed on huge pages
        self.kernel.packed = packed

    def __call__(self, x: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.choice.kernel_for(rows.shape[0]) == KERNEL:
            return self.kernel(x, addend)
        if addend is None:
            out = self.onednn(rows)
        else:  # LoRA's updates of a gate_up, added before the activation as ours does
            assert isinstance(self.onednn, GatedLinear)
            sums = self.onednn.linear(rows).float() + addend
            out = self.onednn.activation_and_mul(sums.to(x.dtype))
        return out.view(*x.shape[:-1], self.out_features)
