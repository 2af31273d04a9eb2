"""Async scheduling on the real engine (core/pending_tokens.py, core/engine_core.py):
each decode step carries every running sequence, a step's blocks are found while it is
in flight, the runner forgets finished sequences; and the features whose next step needs
a sequence's tokens (``needs_known_tokens``): penalties, a grammar, multi-token bad
words, a thinking budget, n > 1's forks and prompt logprobs.

Each feature runs beside plain requests (so steps are handed over while it waits) and
must give what steps one at a time give: the same tokens and logprobs. A schedule made before the
step in flight is applied would count a pending token as a seen one, build a grammar's
mask a token late, miss a bad word's start, count a thinking section short, fork a
choice before its prompt ran or cut prompt logprobs: each changes the output.
"""

from __future__ import annotations

import dataclasses

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.params.thinking_budget import ThinkingBudget

from tests.engine.test_json_schema import SMALL
from tests.engine.worker.test_cuda_graphs import skip_unless_compiled_triton
from tests.tiny_models import save_tiny_model

# The first, the feature's, in chunks over three steps (the budget's 24 tokens a step).
PROMPTS = [[5 + (7 * i + 3 * j) % 90 for j in range(n)] for i, n in enumerate((50, 10, 13, 16))]
# The thinking section starts at the prompt's last token; past 3 tokens the end mark is
# forced.
THINKING = ThinkingBudget(3, (PROMPTS[0][-1],), (40, 41))
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def make_engine(model_dir, async_scheduling: bool, device: str = "cpu") -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device=device,
            dtype="float32",
            max_model_len=256,
            max_num_blocks=64,
            max_num_batched_tokens=24,  # prompts in chunks beside other requests' decodes
            async_scheduling=async_scheduling,
        )
    )


def outputs(engine: LLMEngine, params: SamplingParams) -> list[tuple]:
    """Each answer of ``params`` (on the first prompt) and of plain greedy requests on
    the others, in one batch: tokens, logprobs and prompt logprobs."""
    outs = engine.generate(PROMPTS, [params] + [GREEDY] * (len(PROMPTS) - 1), use_tqdm=False)
    assert engine.memory_stats()["used_blocks"] == 0
    return [(o.token_ids, o.logprobs, o.prompt_logprobs, o.finish_reason) for o in outs]


def bad_words_of(model_dir, device: str) -> list[list[int]]:
    """Two-token words the first prompt's greedy answer holds: banned, it must change."""
    engine = make_engine(model_dir, False, device)
    out = engine.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    return [out.token_ids[2:4], out.token_ids[5:7]]


FEATURES = {
    "penalties": dict(repetition_penalty=1.6, presence_penalty=0.7, frequency_penalty=0.4),
    "grammar": dict(temperature=1.0, seed=3, max_tokens=60, json_schema=SMALL),
    "bad words": {},  # bad_words_token_ids, from the model's own answer
    "thinking budget": dict(thinking_budget=THINKING, max_tokens=12),
    "forks": dict(n=3, temperature=1.0, seed=11),
    "prompt logprobs": dict(prompt_logprobs=2, logprobs=2),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_async_scheduling_gives_what_steps_one_at_a_time_give(model_dir, feature):
    check_feature(model_dir, feature, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("feature", FEATURES)
def test_async_scheduling_on_cuda_gives_what_steps_one_at_a_time_give(model_dir, feature):
    """The same with CUDA's kernels: the sampler's on the GPU, graphs for the decodes."""
    skip_unless_compiled_triton()
    check_feature(model_dir, feature, "cuda")


def check_feature(model_dir, feature: str, device: str) -> None:
    settings = dict(FEATURES[feature])
    if feature == "bad words":
        settings["bad_words_token_ids"] = bad_words_of(model_dir, device)
    params = SamplingParams(**{**vars(GREEDY), "ignore_eos": False, **settings})
    expected = outputs(make_engine(model_dir, False, device), params)
    actual = outputs(make_engine(model_dir, True, device), params)
    assert actual == expected
    first = expected[0][0]
    if feature == "thinking budget":  # the end mark was forced after 3 thought tokens
        assert first[3:5] == [40, 41], first
    if feature == "bad words":  # they were in its way
        without = dataclasses.replace(params, bad_words_token_ids=[])
        assert first != outputs(make_engine(model_dir, False, device), without)[0][0]


def test_async_steps_carry_every_running_sequence(model_dir):
    """A sequence whose pending token were lost would sit out every other step: the
    same tokens, in more steps."""
    steps = []
    for async_scheduling in (False, True):
        engine = make_engine(model_dir, async_scheduling)
        engine.generate(PROMPTS, GREEDY, use_tqdm=False)
        steps.append(engine.core.counters.num_steps)
    assert steps[1] == steps[0]


def test_a_prompt_s_blocks_are_found_while_its_step_is_in_flight(model_dir):
    """Registered when the step is handed over: a request that comes right after it
    takes them from the prefix cache, as with steps one at a time."""
    engine = make_engine(model_dir, async_scheduling=True)
    prompt = PROMPTS[0][:24] + PROMPTS[1]  # the budget's 24 tokens: one full block
    engine.add_request(prompt, GREEDY)
    engine.step()  # hands over the prompt's first chunk
    engine.add_request(prompt, GREEDY)
    while engine.has_pending_work():
        engine.step()
    assert engine.memory_stats()["prefix_cache_hits"] > 0


def test_the_runner_forgets_finished_sequences(model_dir):
    engine = make_engine(model_dir, async_scheduling=True)
    for _ in range(3):
        outs = engine.generate(PROMPTS, GREEDY, use_tqdm=False)
    # Those that ended in the last step are forgotten with the next one.
    assert set(engine.core.runner.last_sampled) <= {o.request_id for o in outs}
