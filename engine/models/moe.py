"""The mixture-of-experts block that replaces a sparse layer's MLP (Qwen2- and
Qwen3-MoE, OLMoE, Mixtral: moe_config.py says which layers and how they route).

A router (``gate``, [num_experts, hidden]) scores each token; the softmax's top-k
experts run the token through their own gated MLP, and their outputs are summed,
weighted by those probabilities (renormalized to sum to one where the family does).
Qwen2-MoE adds a shared expert every token runs, its output scaled by a sigmoid gate.

The experts' weights are stacked as transformers 5 keeps them: ``gate_up_proj``
[num_experts, 2 * width, hidden] (gate rows, then up rows) and ``down_proj``
[num_experts, hidden, width]; a checkpoint's per-expert tensors are stacked at load
(moe_weights.py), and a GGUF file's quantized experts are kept as one quantized weight
per expert.

Two ways to run the block, bound when the weights are packed: the kernels' own block
(``KernelOps.pack_moe``: on the CPU, one C++ call over experts kept quantized,
kernels/moe_cpu.py), or the torch reference here (each active expert once over its
tokens, summed in expert order as transformers does: in fp32 it gives transformers'
tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.layers import MLP, DirectCall, Linear
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps, MoeLayerSpec, QuantizedWeight
from torch import nn


class Experts(DirectCall, nn.Module):
    """The routed experts' stacked weights, and their torch reference.

    The stacks are filled at load (``load``), not allocated when the model is built: a
    model whose experts stay quantized never holds them in float (OLMoE's would take
    12 GB in bf16)."""

    PROJECTIONS = ("gate_up_proj", "down_proj")

    def __init__(self, num_experts: int, hidden: int, width: int, activation: str) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.width = num_experts, hidden, width
        self.activation = activation
        self.shapes = {
            "gate_up_proj": (num_experts, 2 * width, hidden),
            "down_proj": (num_experts, hidden, width),
        }
        # Placeholders carrying the model's dtype and device until loaded.
        self.gate_up_proj = nn.Parameter(torch.empty(0), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(0), requires_grad=False)
        # Each expert's blocks (gate_up, down), where the checkpoint's are kept quantized.
        self.quantized: tuple[list[QuantizedWeight], list[QuantizedWeight]] | None = None
        self.kept: dict[str, list[QuantizedWeight]] = {}

    def load(self, projection: str, weights: torch.Tensor | list[QuantizedWeight]) -> None:
        """A projection's experts: a float stack, or one quantized weight per expert
        (kept where both projections' are, ``finish_loading``)."""
        if projection not in self.shapes:
            raise ConfigError(f"checkpoint tensor for unknown expert parameter {projection!r}")
        expected = self.shapes[projection]
        shape = (len(weights), *weights[0].shape) if isinstance(weights, list) else weights.shape
        if tuple(shape) != expected:
            raise ConfigError(
                f"{projection}: checkpoint shape {tuple(shape)} does not match the model's "
                f"{expected}"
            )
        if isinstance(weights, list):
            self.kept[projection] = weights
            return
        placeholder = getattr(self, projection)
        stack = weights.to(device=placeholder.device, dtype=placeholder.dtype)
        setattr(self, projection, nn.Parameter(stack, requires_grad=False))

    def finish_loading(self) -> None:
        """Keep the experts quantized where both projections' are; dequantize a lone
        one."""
        if set(self.kept) == set(self.PROJECTIONS):
            self.quantized = (self.kept["gate_up_proj"], self.kept["down_proj"])
        else:
            for projection, weights in self.kept.items():
                self.load(projection, self._stacked(weights))
        self.kept = {}

    def _stacked(self, weights: list[QuantizedWeight]) -> torch.Tensor:
        return torch.stack([w.dequantize(self.gate_up_proj.dtype) for w in weights])

    def dequantize(self) -> None:
        """Quantized experts no kernel takes, as float stacks for the reference."""
        if self.quantized is None:
            return
        gate_up, down = self.quantized
        self.quantized = None
        self.load("gate_up_proj", self._stacked(gate_up))
        self.load("down_proj", self._stacked(down))

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """x [tokens, hidden], expert ids and weights [tokens, top_k] -> the weighted sum
        of each token's experts: each active expert once over its tokens, added into
        the output in expert order (transformers')."""
        out = torch.zeros_like(x)
        hit = torch.bincount(expert_ids.flatten(), minlength=self.num_experts).nonzero()
        for expert in hit.flatten().tolist():
            token, slot = torch.where(expert_ids == expert)
            gate, up = F.linear(x[token], self.gate_up_proj[expert]).chunk(2, dim=-1)
            act = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
            y = F.linear(act * up, self.down_proj[expert])  # [its tokens, hidden]
            y = y * weights[token, slot, None].to(y.dtype)
            out.index_add_(0, token, y.to(out.dtype))
        return out


class SparseMoe(DirectCall, nn.Module):
    """A sparse layer's MLP: router, routed experts, and the shared expert where the
    family has one."""

    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.top_k = moe.top_k
        self.renormalize = moe.renormalize
        self.activation = config.hidden_act
        hidden = config.hidden_size
        self.gate = Linear(hidden, moe.num_experts, False, ops.pack_linear)
        self.experts = Experts(
            moe.num_experts, hidden, moe.expert_intermediate_size, config.hidden_act
        )
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            shared = replace(config, intermediate_size=moe.shared_expert_intermediate_size)
            self.shared_expert = MLP(shared, ops)
            self.shared_expert_gate = Linear(hidden, 1, False, ops.pack_linear)
        # The kernels' whole block, where they have one for these weights (pack_weights)
        self.fused: Callable[[torch.Tensor], torch.Tensor] | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [tokens, hidden] -> (expert ids [tokens, top_k], their weights in fp32):
        the softmax over all experts in fp32, its top k, renormalized where the family
        does, rounded to x's dtype (as transformers' routers give them)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return expert_ids, weights.to(x.dtype).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused(x)
        expert_ids, weights = self.route(x)
        out = self.experts(x, expert_ids, weights)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def pack_weights(self, ops: KernelOps) -> None:
        """After the block's Linears are packed: bind the kernels' block where they take
        it, else the reference (on experts dequantized now, if they were kept)."""
        self.fused = ops.pack_moe(self.layer_spec())
        if self.fused is None:
            self.experts.dequantize()
        else:  # the kernel holds its own copy (repacked): the loader's goes
            self.experts.quantized = None

    def model_dtype(self) -> torch.dtype:
        """The model's dtype (the experts' placeholders and stacks are in it)."""
        return self.experts.gate_up_proj.dtype

    def layer_spec(self) -> MoeLayerSpec:
        """This block as the kernels take it."""
        shared = None
        if self.shared_expert is not None:
            shared = (
                self.shared_expert.gate_up_proj.packed,
                self.shared_expert.down_proj.packed,
                self.shared_expert_gate.weight,
            )
        experts = self.experts
        gate_up, down = experts.quantized or (experts.gate_up_proj, experts.down_proj)
        router = self.gate.weight
        if self.gate.quantized is not None:  # small: the kernels take it as a tensor
            router = self.gate.quantized.dequantize(self.model_dtype())
        return MoeLayerSpec(
            router=router,
            gate_up=gate_up,
            down=down,
            activation=self.activation,
            top_k=self.top_k,
            renormalize=self.renormalize,
            shared=shared,
        )
