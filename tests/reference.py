"""The reference our engine is measured against: transformers' greedy generate and
final hidden states, fp32."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from hetero_infer.engine.loader import ModelSource
from hetero_infer.engine.loader.gguf_bulk_reader import bulk_gguf_reader
from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder


def transformers_from_gguf(source: ModelSource) -> tuple[Any, torch.nn.Module]:
    """transformers' tokenizer and fp32 model of a GGUF file. transformers reads the
    weights from the file itself; the config and tokenizer are its own conversion of the
    file's metadata as the engine keeps it (gguf_metadata_folder), as each conversion
    reads every field of the file through gguf-py. gguf-py's reader takes the fields in
    bulk (BulkGGUFReader: the same fields, 17 s sooner on Gemma 3's file)."""
    metadata = gguf_metadata_folder(source)
    with bulk_gguf_reader():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            source.folder,
            config=transformers.AutoConfig.from_pretrained(metadata),
            dtype=torch.float32,
            gguf_file=source.gguf_file,
        ).eval()
    return transformers.AutoTokenizer.from_pretrained(metadata), model


@torch.no_grad()
def transformers_greedy(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int = 1,
    **generate_kwargs,
) -> list[list[int]]:
    """Each prompt's greedy continuation, ``batch_size`` prompts at a time, left-padded
    and taken in order of length so that a batch pads little. Batched, sums run in
    another order than one at a time, which can part the two only at a tie: the tiny
    models (tests/tiny_models.py) gave the same tokens for every family in one batch, in
    a fifth of the time (each step's Python costs more than its sums there), as did
    SmolLM2 and Gemma 3 in batches of 4 (SmolLM2's 16 prompts in 20 s rather than 32
    on one thread), where along their greedy paths the best logit leads the next by
    0.007 or more and another order of fp32 sums moves a logit by ~1e-5."""
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs: dict[int, list[int]] = {}
    for start in range(0, len(prompts), batch_size):
        batch = by_length[start : start + batch_size]
        width = max(len(prompts[i]) for i in batch)
        ids = [[0] * (width - len(prompts[i])) + prompts[i] for i in batch]
        mask = [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch]
        out = model.generate(
            torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **generate_kwargs,
        )
        # A row that ended before the batch did is padded after its end of sequence.
        for i, row in zip(batch, out[:, width:].tolist(), strict=True):
            outputs[i] = until_eos(row, eos)
    return [outputs[i] for i in range(len(prompts))]


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """``tokens`` up to and with the first of ``eos``."""
    end = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    return tokens[:end]


@torch.no_grad()
def transformers_embedding(
    model: torch.nn.Module, prompt: list[int], pooling: str, normalize: bool = True
) -> torch.Tensor:
    """One prompt's final hidden states (after the final norm) from a transformers base
    model (``AutoModel``), pooled ("last" token or "mean" over positions) and scaled to
    unit length where ``normalize``: what /v1/embeddings must return. [hidden]"""
    hidden = model(torch.tensor([prompt])).last_hidden_state[0]  # [len(prompt), hidden]
    vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


# Router scores this close are a tie within fp32 rounding: two correct computations
# (summing in different orders) may pick different experts, and a different token.
ROUTER_TIE = 1e-4
# Next-token logits this close are a tie within fp32 rounding too: the same sums in
# another order (another kernel, or the same tokens in another batch) may pick either.
LOGIT_TIE = 1e-4


def check_same_tokens(
    folder: Any,
    prompt: list[int],
    out: list[int],
    ref: list[int],
    logit_bias: dict[int, float] | None = None,
) -> None:
    """Greedy ``out`` equals transformers' ``ref`` token for token, or parts from it at
    a tie alone: where transformers' two best next-token logits (``logit_bias`` added)
    are within LOGIT_TIE of each other, or a mixture of experts' router chose its last
    expert within ROUTER_TIE of the next. The reference model is loaded from ``folder``
    only where they part."""
    if out == ref:
        return
    at = next(i for i in range(len(ref)) if i == len(out) or out[i] != ref[i])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    context = prompt + ref[:at]
    logit_gap = closest_logit_gap(model, context, logit_bias)
    top_k = getattr(model.config, "num_experts_per_tok", None)
    routing_gap = closest_routing_gap(model, context, top_k) if top_k else None
    assert logit_gap < LOGIT_TIE or (routing_gap is not None and routing_gap < ROUTER_TIE), (
        f"differs at token {at} ({len(prompt)}-token prompt): {out} != {ref}; the best "
        f"logits are {logit_gap:.2e} apart"
        + ("" if routing_gap is None else f", the closest routing gap is {routing_gap:.2e}")
        + ": no tie"
    )


@torch.no_grad()
def closest_logit_gap(
    model: torch.nn.Module, token_ids: list[int], logit_bias: dict[int, float] | None = None
) -> float:
    """The gap between transformers' two best logits for the token after ``token_ids``
    (each token's ``logit_bias`` added)."""
    logits = model(torch.tensor([token_ids])).logits[0, -1].float()
    for token, bias in (logit_bias or {}).items():
        logits[token] += bias
    best, second = logits.topk(2).values.tolist()
    return best - second


@torch.no_grad()
def closest_routing_gap(model: torch.nn.Module, token_ids: list[int], top_k: int) -> float:
    """The smallest gap, over every layer and token of ``token_ids`` in transformers'
    mixture-of-experts ``model``, between the router's last expert chosen and the best
    one left out."""
    gaps: list[float] = []

    def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        scores = output if isinstance(output, torch.Tensor) else output[0]
        top = scores.float().topk(top_k + 1, dim=-1).values
        gaps.append(float((top[..., top_k - 1] - top[..., top_k]).min()))

    routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    assert routers, "no router found: not a mixture-of-experts model"
    hooks = [router.register_forward_hook(record) for router in routers]
    try:
        model(torch.tensor([token_ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return min(gaps)
