"""Stop strings, stop_token_ids and min_tokens through the engine, streamed and not.

The main check: 200 random (prompt, stops) cases on a tiny model agree with a
reference that generates without stops and cuts the text afterwards, and no
streamed delta ever shows text that the final output does not have.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.frontend.stop_strings import StopStringMatcher
from hetero_infer.engine.tokenizer import IncrementalDetokenizer

from tests.tiny_models import save_tiny_model

MAX_TOKENS = 16
WORDS = ["hello", "world", "the", "a", "cat", "ok", "at", "rld"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return LLMEngine(EngineConfig(model=str(model_dir), max_model_len=256, max_num_blocks=512))


def test_matcher_finds_a_stop_straddling_old_and_new_text():
    matcher = StopStringMatcher(["STOP"], include_in_output=False)
    assert matcher.find("abcST", 3) is None
    assert matcher.find("abcSTOPxyz", 5) == (3, "STOP")
    assert StopStringMatcher(["STOP"], True).find("abcSTOPxyz", 5) == (7, "STOP")


def test_matcher_prefers_the_stop_that_completes_first():
    matcher = StopStringMatcher(["xabc", "ab", "b"], include_in_output=False)
    assert matcher.find("__xabc", 0) == (3, "ab")  # "ab" and "b" end together: longer wins


def test_matcher_holds_back_only_a_possible_start():
    matcher = StopStringMatcher(["STOP", "xy"], include_in_output=False)
    assert matcher.held_back("abcSTO") == 3
    assert matcher.held_back("abcx") == 1
    assert matcher.held_back("abcS T") == 0
    assert matcher.held_back("abcSTOP") == 0  # a whole one is found, not held back
    assert matcher.held_back("") == 0


def expected_cut(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Reference: the whole text, cut at the stop string that ends first."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        at = text.find(stop)
        if at != -1 and (best is None or (at + len(stop), at) < (best[0], best[1])):
            best = (at + len(stop), at, stop)
    if best is None:
        return text, None
    end, at, stop = best
    return text[: end if include else at], stop


def tokens_to_reach(engine: LLMEngine, prompt_ids: list[int], ids: list[int], chars: int) -> int:
    """How many tokens the streaming detokenizer needs before it has sent ``chars`` chars."""
    detokenizer = IncrementalDetokenizer(engine.tokenizer, prompt_ids)
    text = ""
    for k, token_id in enumerate(ids, start=1):
        text += detokenizer.step([token_id])
        if len(text) >= chars:
            return k
    return len(ids)


def random_stops(rng: random.Random, text: str) -> list[str]:
    stops = []
    for _ in range(rng.randint(1, 3)):
        if text and rng.random() < 0.7:  # a piece of the text: likely to hit
            start = rng.randrange(len(text))
            stops.append(text[start : start + rng.randint(1, 5)])
        else:
            stops.append("".join(rng.choice("ab tlo!") for _ in range(rng.randint(1, 4))))
    return stops


def test_200_random_cases_agree_with_cutting_afterwards(engine):
    rng = random.Random(1234)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(200)]
    plain = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    references = engine.generate(prompts, plain, use_tqdm=False)
    cases = []
    for prompt, ref in zip(prompts, references, strict=True):
        stops, include = random_stops(rng, ref.text), rng.random() < 0.3
        params = SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0,
            ignore_eos=True,
            stop=stops,
            include_stop_str_in_output=include,
        )
        cases.append((engine.add_request(prompt, params), ref, stops, include))
    streamed: dict[str, str] = {}
    finals = {}
    while engine.has_pending_work():
        for out in engine.step():
            streamed[out.request_id] = streamed.get(out.request_id, "") + out.delta_text
            # What has been streamed so far is always what the request has sent.
            assert streamed[out.request_id] == out.text
            if out.finished:
                finals[out.request_id] = out
    hits = 0
    for request_id, ref, stops, include in cases:
        out = finals[request_id]
        text, stop = expected_cut(ref.text, stops, include)
        assert out.text == streamed[request_id] == text, (stops, include, ref.text)
        assert out.stop_reason == stop
        assert out.finish_reason == ("stop" if stop else "length")
        if stop is not None:
            hits += 1
            # Generation ends at the token that completed the stop string.
            end = ref.text.find(stop) + len(stop)
            expected_tokens = tokens_to_reach(engine, ref.prompt_token_ids, ref.token_ids, end)
            assert out.token_ids == ref.token_ids[:expected_tokens]
            # Streamed text never showed any of the stop string (unless asked to).
            if not include:
                assert stop not in streamed[request_id]
        else:
            assert out.token_ids == ref.token_ids
    assert hits > 100  # most cases do stop
    assert engine.memory_stats()["used_blocks"] == 0


def test_stop_string_split_across_stream_chunks_is_held_back(engine):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    ref = engine.generate("hello world", params, use_tqdm=False)[0]
    # A stop string spanning several tokens, so several steps.
    stop = ref.text[3:9]
    assert len(stop) == 6
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, stop=[stop])
    request_id = engine.add_request("hello world", params)
    deltas = []
    while engine.has_pending_work():
        deltas += [o.delta_text for o in engine.step() if o.request_id == request_id]
    assert "".join(deltas) == ref.text[:3]
    assert engine.get_output(request_id).stop_reason == stop


def test_stop_token_ids_end_without_their_text(engine):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    ref = engine.generate("the cat", params, use_tqdm=False)[0]
    stop_id = ref.token_ids[4]
    first = ref.token_ids.index(stop_id)
    for include in (False, True):
        out = engine.generate(
            "the cat",
            SamplingParams(
                max_tokens=MAX_TOKENS,
                temperature=0,
                ignore_eos=True,
                stop_token_ids=[stop_id],
                include_stop_str_in_output=include,
            ),
            use_tqdm=False,
        )[0]
        assert out.token_ids == ref.token_ids[: first + 1]
        assert out.finish_reason == "stop" and out.stop_reason == stop_id
        kept = out.token_ids if include else out.token_ids[:-1]
        prompt_text = engine.tokenizer.decode(ref.prompt_token_ids)
        full = engine.tokenizer.decode(ref.prompt_token_ids + kept)
        assert out.text == full[len(prompt_text) :]


def test_min_tokens_delays_stop_strings_and_masks_stop_tokens(engine):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    ref = engine.generate("ok ok", params, use_tqdm=False)[0]
    stop_id = ref.token_ids[0]
    out = engine.generate(
        "ok ok",
        SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0, min_tokens=5, stop_token_ids=[stop_id]
        ),
        use_tqdm=False,
    )[0]
    # Masked while fewer than 5 tokens are out, so the first token differs from ref's.
    assert out.token_ids[0] != stop_id
    assert stop_id not in out.token_ids[:5]
    assert len(out.token_ids) >= 5 or out.finish_reason == "length"


def test_a_stop_string_completed_by_the_min_tokens_th_token_ends_there(engine):
    """min_tokens = k lets the k-th token's text stop the output (vLLM's: stop strings
    count from k tokens out), and k + 1 does not."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    ref = engine.generate("ok ok", params, use_tqdm=False)[0]
    detokenizer = IncrementalDetokenizer(engine.tokenizer, ref.prompt_token_ids)
    pieces = [detokenizer.step([token_id]) for token_id in ref.token_ids]  # as streamed
    # The first token whose text is new (not in the text before it), from the second on.
    k = next(
        k
        for k in range(2, MAX_TOKENS)
        if pieces[k - 1].strip() and pieces[k - 1] not in "".join(pieces[: k - 1])
    )
    piece = pieces[k - 1]
    stopped = engine.generate(
        "ok ok", dataclasses.replace(params, min_tokens=k, stop=[piece]), use_tqdm=False
    )[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == ref.token_ids[:k]
    later = engine.generate(
        "ok ok", dataclasses.replace(params, min_tokens=k + 1, stop=[piece]), use_tqdm=False
    )[0]
    assert later.token_ids[:k] == ref.token_ids[:k] and len(later.token_ids) > k


def test_special_tokens_kept_on_request_but_not_the_eos(engine):
    """skip_special_tokens=False (a tool-call marker may be a special token) shows
    special tokens in the text; the eos that ends the request still is not text."""
    bos = {1: 100.0}  # <s>, a special token: the only pick
    kept = SamplingParams(max_tokens=3, temperature=0, logit_bias=bos, skip_special_tokens=False)
    [out] = engine.generate(["hello"], kept, use_tqdm=False)
    assert out.text == "<s><s><s>"
    [out] = engine.generate(["hello"], SamplingParams(max_tokens=3, temperature=0, logit_bias=bos))
    assert out.text == ""
    eos = {2: 100.0}  # </s>
    for skip in (True, False):
        params = SamplingParams(
            max_tokens=3, temperature=0, logit_bias=eos, skip_special_tokens=skip
        )
        [out] = engine.generate(["hello"], params, use_tqdm=False)
        assert (out.finish_reason, out.text, len(out.token_ids)) == ("stop", "", 1)
