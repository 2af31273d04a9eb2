"""The C++ mixture-of-experts block (kernels/moe_cpu.py) on experts kept quantized:
each token's experts combined as the quantized kernel's own product would give them
(the activations quantized per block of 32 as it does, in fp64), whatever the mix of
experts per step, at any thread count; the routing and the shared expert as the
model's torch code computes them."""

from __future__ import annotations

import dataclasses
import functools

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.linear import GatedLinear
from hetero_infer.kernels.linear_quantized import QuantizedLinear, quantized_linear_ref
from hetero_infer.kernels.moe import MoeLayerSpec
from hetero_infer.kernels.moe_cpu import pack_moe, stacked_panels
from hetero_infer.kernels.quantized import QuantizedWeight, quantize_int8

from tests.kernels.checks import refusals
from tests.kernels.test_cpu_threads import THREADS, torch_threads

pytestmark = pytest.mark.cpu_kernels("quantized_linear")

HIDDEN, WIDTH, EXPERTS = 128, 96, 6


@functools.cache
def expert_weights(qtype: str, seed: int) -> tuple[list[QuantizedWeight], list[QuantizedWeight]]:
    """Random experts (gate_up [2 * WIDTH, HIDDEN], down [HIDDEN, WIDTH]) in ``qtype``."""
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> QuantizedWeight:
        values = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        if qtype == "I8":
            return quantize_int8(torch.from_numpy(values))
        data = gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype])
        return QuantizedWeight(qtype, torch.from_numpy(data), (rows, cols))

    gate_up = [weight(2 * WIDTH, HIDDEN) for _ in range(EXPERTS)]
    down = [weight(HIDDEN, WIDTH) for _ in range(EXPERTS)]
    return gate_up, down


def block_for(qtype: str, top_k: int = 2, shared: bool = False, activation: str = "silu"):
    """The C++ block on random experts, and its spec; ``shared``: with a shared expert
    (its gate_up followed by silu-and-mul, as the model packs it)."""
    module = load_cpu_kernels()
    gate_up, down = expert_weights(qtype, 0)
    router = torch.randn(EXPERTS, HIDDEN, generator=torch.Generator().manual_seed(3))
    shared_parts = None
    if shared:
        shared_gate_up, shared_down = expert_weights(qtype, 1)
        shared_parts = (
            GatedLinear(QuantizedLinear(module, shared_gate_up[0]), _silu_and_mul, "silu"),
            QuantizedLinear(module, shared_down[0]),
            torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(4)),
        )
    spec = MoeLayerSpec(router, gate_up, down, activation, top_k, True, shared_parts)
    moe = pack_moe(module, spec)
    assert moe is not None
    return moe, spec


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def experts_ref(x, ids, weights, gate_up, down, activation="silu") -> torch.Tensor:
    """Each (token, slot) through its expert by the quantized kernel's reference
    product (fp64), summed in slot order."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            gu = quantized_linear_ref(x[t : t + 1].float(), gate_up[e])
            g, u = gu[:, :WIDTH], gu[:, WIDTH:]
            act = F.silu(g) if activation == "silu" else F.gelu(g, approximate="tanh")
            h = (act * u).float()
            out[t] += float(weights[t, s]) * quantized_linear_ref(h, down[e])[0]
    return out


def random_routing(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    return ids, weights


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # The kernel's fp32 sums and the fp32 intermediate (quantized again for down) differ
    # from the fp64 reference by a few ulps per block: tight against the output's scale.
    scale = expected.abs().max().item()
    error = (actual.double() - expected).abs().max().item()
    assert error <= 1e-3 * scale, (error, scale)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "I8"])
@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_experts_match_the_quantized_reference(qtype, tokens):
    moe, spec = block_for(qtype, top_k=3)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))
    ids, weights = random_routing(tokens, 3, seed=tokens)
    actual = moe.block.experts(x, ids, weights)
    assert actual.dtype == torch.float32 and actual.shape == x.shape
    assert_close_to(actual, experts_ref(x, ids, weights, spec.gate_up, spec.down))


def test_gelu_experts_and_bf16_activations():
    moe, spec = block_for("Q8_0", top_k=2, activation="gelu_pytorch_tanh")
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16()
    ids, weights = random_routing(5, 2, seed=7)
    actual = moe.block.experts(x, ids, weights)
    assert actual.dtype == torch.bfloat16
    expected = experts_ref(x, ids, weights, spec.gate_up, spec.down, "gelu_pytorch_tanh")
    scale = expected.abs().max().item()
    assert (actual.double() - expected).abs().max().item() <= 1e-2 * scale  # bf16 output


def test_every_token_choosing_one_expert_and_unused_experts():
    moe, spec = block_for("Q4_0", top_k=1)
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
    ids = torch.full((9, 1), 4)
    weights = torch.ones(9, 1)
    assert_close_to(
        moe.block.experts(x, ids, weights), experts_ref(x, ids, weights, spec.gate_up, spec.down)
    )


def experts_arguments(case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, expert_ids, weights) for two tokens and two experts each, but for ``case``."""
    x, ids, weights = torch.zeros(2, HIDDEN), torch.tensor([[0, 1], [2, 3]]), torch.ones(2, 2)
    match case:
        case "1-d x":
            x = x[0]
        case "1-d ids":
            ids = ids[0]
        case "a weight short":
            weights = weights[:, :1]
        case "ids for one token":
            ids, weights = ids[:1], weights[:1]
        case "half the hidden size":
            x = x[:, : HIDDEN // 2]
        case "expert 6" | "expert -1":
            ids[1, 0] = int(case.split()[1])
    return x, ids, weights


EXPERTS_REFUSALS = {
    r"x \[tokens, hidden\], expert_ids and weights \[tokens, top_k\]": [
        "1-d x",
        "1-d ids",
        "a weight short",
        "ids for one token",
    ],
    "down's outputs are x's hidden size": ["half the hidden size"],
    "expert id 6 out of range": ["expert 6"],
    "expert id -1 out of range": ["expert -1"],
}


@pytest.mark.parametrize(("case", "message"), refusals(EXPERTS_REFUSALS))
def test_the_experts_refuse_what_they_cannot_run(case, message):
    moe, _ = block_for("Q8_0", top_k=2)
    moe.block.experts(*experts_arguments("none"))
    with pytest.raises(RuntimeError, match=message):
        moe.block.experts(*experts_arguments(case))


def block_arguments(case: str) -> dict:
    """MoeBlock's arguments as pack_moe gives them for Q8_0 experts, but for ``case``."""
    module = load_cpu_kernels()
    gate_up, down = expert_weights("Q8_0", 0)
    args = dict(
        router=torch.zeros(EXPERTS, HIDDEN),
        gate_up=stacked_panels(module, gate_up),
        gate_up_qtype="Q8_0",
        down=stacked_panels(module, down),
        down_qtype="Q8_0",
        activation="silu",
        activation_bits=gate_up[0].activation_bits,
        top_k=2,
        renormalize=True,
    )
    match case:
        case "relu":
            args["activation"] = "relu"
        case "2-d gate_up" | "2-d down":
            name = case.split()[1]
            args[name] = args[name][0]
        case "a down expert short":
            args["down"] = args["down"][:-1]
        case "int8 gate_up" | "int8 down":
            name = case.split()[1]
            args[name] = args[name].view(torch.int8)
        case "strided gate_up" | "strided down":
            name = case.split()[1]
            args[name] = args[name].transpose(1, 2)
        case "1-d router":
            args["router"] = args["router"][0]
        case "a router row short":
            args["router"] = args["router"][:-1]
        case "top 0" | "top 7" | "top 6":
            args["top_k"] = int(case.split()[1])
        case "a shared gate alone":
            args["shared_gate"] = torch.zeros(1, HIDDEN)
    return args


MOE_BLOCK_REFUSALS = {
    "no expert activation relu": ["relu"],
    r"gate_up and down: uint8 \[num_experts, panels, panel_bytes\], contiguous": [
        "2-d gate_up",
        "2-d down",
        "a down expert short",
        "int8 gate_up",
        "int8 down",
        "strided gate_up",
        "strided down",
    ],
    r"router \[num_experts, hidden\]": ["1-d router", "a router row short"],
    "top_k between 1 and num_experts": ["top 0", "top 7"],
    "the shared expert's gate_up, down and gate come together": ["a shared gate alone"],
}


@pytest.mark.parametrize(("case", "message"), refusals(MOE_BLOCK_REFUSALS))
def test_the_block_refuses_what_it_cannot_run(case, message):
    module = load_cpu_kernels()
    module.MoeBlock(**block_arguments("top 6"))  # every expert a token's: the largest top_k
    with pytest.raises(RuntimeError, match=message):
        module.MoeBlock(**block_arguments(case))


@pytest.mark.parametrize("shared", [False, True])
def test_the_block_routes_as_the_model_does(shared):
    """forward = the model's routing (softmax in fp32, top k, renormalized) into the
    experts, plus the sigmoid-gated shared expert: the same ops, the same results."""
    moe, spec = block_for("Q8_0", top_k=2, shared=shared)
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(9))
    probs = torch.softmax(F.linear(x, spec.router).float(), dim=-1)
    weights, ids = torch.topk(probs, 2, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    expected = moe.block.experts(x, ids, weights)
    if shared:
        gate_up, down, gate = spec.shared
        expected = expected + torch.sigmoid(F.linear(x, gate)) * down(gate_up(x))
    torch.testing.assert_close(moe(x), expected, rtol=0, atol=0)


def test_the_same_result_at_any_thread_count():
    moe, _ = block_for("Q4_1", top_k=3)
    x = torch.randn(11, HIDDEN, generator=torch.Generator().manual_seed(5))
    ids, weights = random_routing(11, 3, seed=5)
    results = []
    for threads in THREADS:
        with torch_threads(threads):
            results.append(moe.block.experts(x, ids, weights))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_experts_the_kernel_does_not_take_are_left_to_the_model():
    module = load_cpu_kernels()
    gate_up, down = expert_weights("Q8_0", 0)
    mixed = [
        *down[:-1],
        QuantizedWeight(
            "Q4_0", torch.zeros(HIDDEN, 18 * WIDTH // 32, dtype=torch.uint8), (HIDDEN, WIDTH)
        ),
    ]
    spec = MoeLayerSpec(torch.zeros(EXPERTS, HIDDEN), gate_up, mixed, "silu", 2, True)
    assert pack_moe(module, spec) is None
    # an activation it does not apply; a shared expert's projection not one of ours
    assert pack_moe(module, dataclasses.replace(spec, down=down, activation="relu")) is None
    shared = (torch.nn.Identity(), QuantizedLinear(module, down[0]), torch.zeros(1, HIDDEN))
    assert pack_moe(module, dataclasses.replace(spec, down=down, shared=shared)) is None
    assert pack_moe(module, dataclasses.replace(spec, down=down)) is not None
    assert (
        pack_moe(module, MoeLayerSpec(torch.zeros(EXPERTS, HIDDEN), None, None, "silu", 2, True))
        is None
    )
