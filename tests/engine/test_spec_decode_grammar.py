"""Grammar-constrained requests in the same steps as requests with n-gram drafts.

A constrained request (a JSON schema, a regex, a choice) takes one token at a time,
since its grammar's mask at each position depends on the tokens before; the requests
beside it in a step keep their drafts. Greedy fp32 output is the same, token for token,
as an engine without speculation, the constrained outputs still follow their grammar,
and every block is given back.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.core.speculator import Speculator
from hetero_infer.engine.params.guided_decoding import StructuredOutputsParams

from tests.engine.test_json_schema import SMALL
from tests.engine.test_spec_decode import LOOPING_BIAS, SPEC, repeated_span_prompts
from tests.tiny_models import TINY_MODELS, save_tiny_model

MAX_TOKENS = 40
REGEX = r"[a-c]{2,6}-[0-9]{1,3}"
CHOICES = ["alpha", "beta", "gamma"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def requests(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Repeating prompts with LOOPING_BIAS (drafted for, mostly accepted), and among
    them the constrained ones, on prompts that repeat too: n-gram drafts would be
    found for them were they not constrained."""
    prompts = repeated_span_prompts(7, vocab)
    free = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=LOOPING_BIAS)
    constrained = [
        SamplingParams(max_tokens=80, temperature=0.0, json_schema=SMALL),
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(regex=REGEX),
        ),
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(choice=CHOICES),
        ),
    ]
    params = [free] * len(prompts) + constrained
    return prompts + prompts[: len(constrained)], params


def test_constrained_requests_get_no_drafts_beside_drafted_ones(folder, monkeypatch):
    prompts, params = requests(TINY_MODELS["llama"]().vocab_size)
    config = EngineConfig(model=str(folder), dtype="float32")
    expected = LLMEngine(config).generate(prompts, params, use_tqdm=False)

    # Each step's drafts, and which of its decoding sequences had a grammar.
    steps: list[tuple[set[str], dict[str, list[int]]]] = []
    schedule_drafts = Speculator.schedule_drafts

    def spy(self, decoding, *args, **kwargs):
        drafts = schedule_drafts(self, decoding, *args, **kwargs)
        constrained = {seq.request_id for seq, _ in decoding if seq.grammar is not None}
        steps.append((constrained, dict(drafts)))
        return drafts

    monkeypatch.setattr(Speculator, "schedule_drafts", spy)
    engine = LLMEngine(config.replace(speculative_config=SPEC))
    got = engine.generate(prompts, params, use_tqdm=False)

    for i, (out, ref) in enumerate(zip(got, expected, strict=True)):
        assert out.token_ids == ref.token_ids, f"request {i} differs"
        assert out.finish_reason == ref.finish_reason, i
    json_out, regex_out, choice_out = got[-3:]
    jsonschema.validate(json.loads(json_out.text), SMALL)
    assert re.fullmatch(REGEX, regex_out.text), regex_out.text
    assert choice_out.text in CHOICES

    for constrained, drafts in steps:
        assert not constrained & drafts.keys(), "a constrained request was given drafts"
    # Steps where constrained requests decoded while others were drafted for.
    shared = [drafts for constrained, drafts in steps if constrained and drafts]
    assert len(shared) >= 3, "no step held both kinds: nothing was tested"
    assert engine.metrics.spec_decode.num_accepted_tokens > 0
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0
