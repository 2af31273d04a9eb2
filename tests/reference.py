"""The reference our engine is measured against: transformers' greedy generate and
final hidden states, fp32."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from hetero_infer.engine.loader import ModelSource
from hetero_infer.engine.loader.gguf import gguf_metadata_folder


def transformers_from_gguf(source: ModelSource) -> tuple[Any, torch.nn.Module]:
    """transformers' tokenizer and fp32 model of a GGUF file. transformers reads the
    weights from the file itself; the config and tokenizer are its own conversion of the
    file's metadata as the engine keeps it (gguf_metadata_folder), as each conversion
    reads every field of the file through gguf-py: 6 s on SmolLM2's, 20-30 on Gemma 3's."""
    metadata = gguf_metadata_folder(source)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source.folder,
        config=transformers.AutoConfig.from_pretrained(metadata),
        dtype=torch.float32,
        gguf_file=source.gguf_file,
    ).eval()
    return transformers.AutoTokenizer.from_pretrained(metadata), model


@torch.no_grad()
def transformers_greedy(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, **generate_kwargs
) -> list[list[int]]:
    """Each prompt's greedy continuation, one prompt at a time (no padding effects)."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **generate_kwargs,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@torch.no_grad()
def transformers_embedding(model: torch.nn.Module, prompt: list[int], pooling: str) -> torch.Tensor:
    """One prompt's final hidden states (after the final norm) from a transformers base
    model (``AutoModel``), pooled ("last" token or "mean" over positions) and scaled to
    unit length: what /v1/embeddings must return. [hidden]"""
    hidden = model(torch.tensor([prompt])).last_hidden_state[0]  # [len(prompt), hidden]
    vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    return torch.nn.functional.normalize(vector, dim=0)
