"""LLMEngine's Python API on a tiny random Llama: requests, steps, aborts, bad input, seeds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.params.sampling_params import RequestOutputKind
from hetero_infer.server import cli

from tests.tiny_models import save_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture
def engine(model_dir):
    return LLMEngine(EngineConfig(model=str(model_dir), max_model_len=256, max_num_blocks=64))


def run_to_end(engine: LLMEngine) -> dict[str, str]:
    """Step until idle; return request_id -> concatenated streamed text."""
    streamed: dict[str, str] = {}
    while engine.has_pending_work():
        for out in engine.step():
            streamed[out.request_id] = streamed.get(out.request_id, "") + out.delta_text
    return streamed


def test_step_api_streams_the_final_text(engine):
    first = engine.add_request("hello world", GREEDY)
    second = engine.add_request([5, 6, 7, 8], GREEDY, request_id="mine")
    assert second == "mine" and engine.has_pending_work()
    streamed = run_to_end(engine)
    for request_id in (first, second):
        out = engine.get_output(request_id)
        assert out.finished and out.finish_reason == "length"
        assert len(out.token_ids) == 12
        # Text continues the prompt (a first word keeps its leading space), as in vLLM.
        prompt_text = engine.tokenizer.decode(out.prompt_token_ids)
        full_text = engine.tokenizer.decode(out.prompt_token_ids + out.token_ids)
        assert streamed[request_id] == out.text == full_text[len(prompt_text) :]
        assert out.metrics.latency > 0 and out.metrics.time_to_first_token > 0
    assert engine.get_output(first).prompt == "hello world"
    assert engine.get_output("mine").prompt_token_ids == [5, 6, 7, 8]
    metrics = engine.metrics.as_dict()
    assert metrics["requests_processed"] == 2 and metrics["tokens_generated"] == 24
    assert metrics["throughput"] > 0 and metrics["average_latency"] > 0
    stats = engine.memory_stats()
    assert stats["used_blocks"] == 0 and stats["free_blocks"] == stats["total_blocks"] == 64


def test_generate_makes_only_the_final_outputs_and_leaves_the_params_as_given(engine):
    """As vLLM's LLM.generate: no output a step (each cumulative one copies the text and
    tokens so far), the same final outputs as the step API's."""
    from hetero_infer.engine.frontend import choice_state

    made = []
    snapshot = choice_state.ChoiceState.snapshot

    def counted(self, *args):
        made.append(self.request_id)
        return snapshot(self, *args)

    prompts = ["hello world", [5, 6, 7, 8]]
    by_steps = [engine.add_request(prompt, GREEDY) for prompt in prompts]
    run_to_end(engine)
    expected = [engine.get_output(request_id) for request_id in by_steps]
    choice_state.ChoiceState.snapshot = counted
    try:
        outputs = engine.generate(prompts, GREEDY, use_tqdm=False)
    finally:
        choice_state.ChoiceState.snapshot = snapshot
    assert len(made) == 2  # one final output each, none a step
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert [o.text for o in outputs] == [o.text for o in expected]
    assert GREEDY.output_kind is RequestOutputKind.CUMULATIVE


def outputs_of(engine: LLMEngine, prompt, params: SamplingParams) -> list:
    """The request's outputs, one a step, run to its end."""
    request_id = engine.add_request(prompt, params)
    outputs = []
    while engine.has_pending_work():
        outputs += [out for out in engine.step() if out.request_id == request_id]
    return outputs


@pytest.mark.parametrize(
    ("fields", "drops_last"),
    [
        (dict(ignore_eos=True), False),
        # A stop token's text is left out, unless asked for, special tokens shown or not.
        (dict(stop_token_ids=["fifth"]), True),
        (dict(stop_token_ids=["fifth"], include_stop_str_in_output=True), False),
        (dict(skip_special_tokens=False, stop_token_ids=["fifth"]), True),
        (dict(skip_special_tokens=False, ignore_eos=True), False),
    ],
)
def test_a_final_only_answer_decodes_its_text_once_and_as_the_steps_do(engine, fields, drops_last):
    """FINAL_ONLY without stop strings reads no text before its end: its ids are decoded
    at once there, into the text a token-at-a-time decode makes."""
    from hetero_infer.engine.frontend import choice_state

    prompt = [5, 6, 7, 8]
    fifth = engine.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids[4]
    fields = {k: [fifth] if v == ["fifth"] else v for k, v in fields.items()}
    params = SamplingParams(max_tokens=12, temperature=0.0, **fields)
    by_steps = outputs_of(engine, prompt, params)[-1]
    waiting = []
    finish_text = choice_state.ChoiceState.finish_text

    def counted(self):
        waiting.append(list(self.undecoded or []))
        finish_text(self)

    choice_state.ChoiceState.finish_text = counted
    try:
        final = replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
        outputs = outputs_of(engine, prompt, final)
    finally:
        choice_state.ChoiceState.finish_text = finish_text
    (out,) = outputs
    assert out.finished and out.text
    assert (out.text, out.token_ids) == (by_steps.text, by_steps.token_ids)
    assert (out.finish_reason, out.stop_reason) == (by_steps.finish_reason, by_steps.stop_reason)
    # Decoded in one go at the end: every id waited for it, but a stop token left out.
    assert waiting == [out.token_ids[: len(out.token_ids) - drops_last]]


def test_an_aborted_final_only_answer_has_its_text_so_far(engine):
    prompt = [5, 6, 7, 8]
    texts = []
    for kind in (RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY):
        request_id = engine.add_request(prompt, replace(GREEDY, output_kind=kind))
        for _ in range(6):
            engine.step()
        assert engine.abort(request_id)
        out = engine.get_output(request_id)
        assert out.finish_reason == "abort" and len(out.token_ids) == 6
        texts.append(out.text)
    assert texts[0] == texts[1] != ""


def test_kv_waste_is_the_unfilled_tail_of_each_last_block(model_dir):
    engine = LLMEngine(
        EngineConfig(model=str(model_dir), max_model_len=256, max_num_blocks=64, block_size=8)
    )
    assert engine.memory_stats()["kv_waste"] == 0.0  # nothing allocated
    prompts = [[5] * 20, [6] * 9, [7] * 16]
    for prompt in prompts:
        engine.add_request(prompt, GREEDY)
    for _ in range(3):
        engine.step()
    stats = engine.memory_stats()
    # After 3 steps (prefill + 2 decodes) each sequence holds len + 2 tokens; its
    # blocks cover len + 3 (the slot of the token sampled last, stored next step).
    stored = [len(p) + 2 for p in prompts]
    slots = [-(-(n + 1) // 8) * 8 for n in stored]
    assert stats["kv_slots_filled"] == sum(stored)
    assert stats["kv_slots_allocated"] == sum(slots)
    assert stats["kv_waste"] == pytest.approx(1 - sum(stored) / sum(slots))
    run_to_end(engine)
    assert engine.memory_stats()["kv_slots_allocated"] == 0


def test_abort_frees_blocks_and_spares_the_others(engine):
    expected = engine.generate(["keep going"], GREEDY, use_tqdm=False)[0].token_ids
    keep = engine.add_request("keep going", GREEDY)
    drop = engine.add_request("stop me " * 20, GREEDY)
    engine.step()
    engine.step()
    assert engine.memory_stats()["used_blocks"] > 0
    assert engine.abort(drop) and not engine.abort(drop)
    assert engine.get_output(drop).finish_reason == "abort"
    run_to_end(engine)
    assert engine.get_output(keep).token_ids == expected
    assert engine.memory_stats()["used_blocks"] == 0


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ("", GREEDY, "prompt"),
        ([], GREEDY, "prompt"),
        ([1, 2, 10**6], GREEDY, "prompt"),
        ([1, -1], GREEDY, "prompt"),
        ([1, 2.0], GREEDY, "prompt"),
        ([1, "2"], GREEDY, "prompt"),
        ([True], GREEDY, "prompt"),
        ([1] * 300, GREEDY, "max_model_len"),
        (123, GREEDY, "prompt"),
    ],
)
def test_bad_input_names_the_field_and_others_keep_running(engine, prompt, params, field):
    good = engine.add_request("fine", GREEDY)
    with pytest.raises(ValueError, match=field):
        engine.add_request(prompt, params)
    run_to_end(engine)
    assert engine.get_output(good).finish_reason == "length"
    assert engine.memory_stats()["num_sequences"] == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_the_vocabulary_and_the_context_are_open_at_their_ends(engine):
    vocab = engine.model_config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, vocab], GREEDY)
    ids = [engine.add_request([0, vocab - 1], GREEDY), engine.add_request([1] * 256, GREEDY)]
    run_to_end(engine)
    assert [engine.get_output(i).finish_reason for i in ids] == ["length", "length"]
    assert len(engine.get_output(ids[1]).token_ids) == 1  # a prompt of max_model_len


def test_generate_rejects_a_bad_prompt_without_leaking(engine):
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(["ok", ""], GREEDY, use_tqdm=False)
    assert not engine.has_pending_work()
    assert engine.memory_stats()["used_blocks"] == 0


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    alone = engine.generate(["tell me"], seeded, use_tqdm=False)[0].token_ids
    others = SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True)
    crowd = engine.generate(
        ["abc", "tell me", "a much longer prompt than the others"],
        [others, seeded, others],
        use_tqdm=False,
    )
    assert crowd[1].token_ids == alone
    again = engine.generate(["tell me"], seeded, use_tqdm=False)[0].token_ids
    assert again == alone


def test_max_model_len_ends_with_length(model_dir):
    engine = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=20, max_num_blocks=8))
    out = engine.generate([[5] * 15], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_config_errors_name_the_field(model_dir, tmp_path):
    with pytest.raises(ValueError, match="max_num_blocks"):
        LLMEngine(EngineConfig(model=str(model_dir), max_num_blocks=4, max_model_len=256))
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine(EngineConfig(model=str(model_dir), max_model_len=10**6))
    with pytest.raises(ValueError, match="no-such-model"):
        LLMEngine(EngineConfig(model=str(tmp_path / "no-such-model")))


def test_cli_one_shot_prints_text_and_stats(model_dir, capsys):
    code = cli.main(
        ["--model", str(model_dir), "--input", "hello", "--max-tokens", "5", "--json"]
        + ["--max-model-len", "64", "--max-num-blocks", "16"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["completion_tokens"] <= 5 and result["prompt_tokens"] > 0
    assert result["finish_reason"] in ("stop", "length")


def test_cli_reports_bad_flags_as_errors(model_dir, capsys):
    assert cli.main(["--model", str(model_dir), "--input", "hi", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_gguf_quantization_needs_a_gguf_file(model_dir):
    with pytest.raises(ValueError, match="quantization 'gguf' does not match .* not quantized"):
        LLMEngine(EngineConfig(model=str(model_dir), max_model_len=256, quantization="gguf"))


def test_outputs_count_the_prompt_tokens_the_prefix_cache_held(model_dir):
    """RequestOutput.num_cached_tokens, as vLLM's: 0 for the first to compute a prompt,
    then its full blocks before the last token (which is always computed), on every
    output of every choice."""
    engine = LLMEngine(
        EngineConfig(model=str(model_dir), max_model_len=256, max_num_blocks=64, block_size=8)
    )
    prompt = list(range(5, 25))  # 20 tokens: 2 full blocks before the last one
    params = SamplingParams(max_tokens=3, temperature=1.0, seed=1, n=2, ignore_eos=True)
    first = engine.generate([prompt], params, use_tqdm=False)
    assert [out.num_cached_tokens for out in first] == [0, 0]
    engine.add_request(prompt, params)
    outputs = []
    while engine.has_pending_work():
        outputs += engine.step()
    assert {out.index for out in outputs} == {0, 1}
    assert {out.num_cached_tokens for out in outputs} == {16}
    # Longer than the cached prompt: its blocks, not the new tokens'.
    longer = engine.generate([[*prompt, 30, 31, 32, 33, 34]], params, use_tqdm=False)
    assert [out.num_cached_tokens for out in longer] == [16, 16]
