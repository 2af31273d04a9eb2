"""Logprobs and prompt logprobs against transformers' log-softmax of the same logits (fp32).

Greedy tokens' logprobs and their top alternatives must match within 1e-4, with the
prompt computed whole, in chunks, and after a prefix-cache hit (which must not skip
the prompt positions whose logprobs were asked for); on the tiny Llama and Gemma 2,
whose logits are soft-capped (the greedy tokens alone would not show a cap missing).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.tiny_models import save_tiny_model

PROMPT = [5, 17, 42, 99, 7, 250, 31, 64, 8, 120, 77, 3, 200, 14, 9, 60, 33, 41, 150, 12]
TOP = 3


@pytest.fixture(scope="module", params=["llama", "gemma2"])
def model_dir(request, tmp_path_factory):
    return save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def reference_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab]: row p is the log-softmax predicting token p + 1."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_entry(entry: dict[int, float], token_id: int, row: torch.Tensor, k: int) -> None:
    assert abs(entry[token_id] - row[token_id].item()) < 1e-4
    values, ids = row.topk(k)
    for token, value in zip(ids.tolist(), values.tolist(), strict=True):
        assert abs(entry[token] - value) < 1e-4
    assert len(entry) in (k, k + 1)  # the token itself, when it is not among the top k


@pytest.mark.parametrize("budget", [4096, 7], ids=["whole-prompt", "chunked"])
def test_logprobs_match_transformers(model_dir, hf_model, budget):
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",  # compared with transformers in fp32
            max_model_len=128,
            max_num_blocks=64,
            block_size=4,
            max_num_batched_tokens=budget,
        )
    )
    params = SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True, logprobs=TOP, prompt_logprobs=2
    )
    # Twice: the second run hits the prefix cache unless prompt logprobs turn it off.
    for _ in range(2):
        out = engine.generate(PROMPT, params, use_tqdm=False)[0]
        ref = reference_logprobs(hf_model, PROMPT + out.token_ids)
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
        for i, (token_id, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            row = ref[len(PROMPT) - 1 + i]
            assert token_id == int(row.argmax())
            check_entry(entry, token_id, row, TOP)
        assert out.cumulative_logprob == pytest.approx(
            sum(e[t] for t, e in zip(out.token_ids, out.logprobs, strict=True)), abs=1e-4
        )
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(PROMPT)
        assert out.prompt_logprobs[0] is None
        for p in range(1, len(PROMPT)):
            check_entry(out.prompt_logprobs[p], PROMPT[p], ref[p - 1], 2)


def test_logprobs_zero_gives_only_the_chosen_token(model_dir):
    engine = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=128, max_num_blocks=64))
    out = engine.generate(
        PROMPT, SamplingParams(max_tokens=4, temperature=0, logprobs=0), use_tqdm=False
    )[0]
    assert [list(e) for e in out.logprobs] == [[t] for t in out.token_ids]
    assert out.prompt_logprobs is None
