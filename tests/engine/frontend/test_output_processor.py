"""OutputProcessor: a step's sequence updates, each to its own choice's output. Updates
made by hand, over a tiny tokenizer whose letters are each a token."""

from __future__ import annotations

from hetero_infer.engine.core.step_data import SampledToken, SequenceUpdate
from hetero_infer.engine.entrypoints.metrics import EngineMetrics
from hetero_infer.engine.frontend import output_processor
from hetero_infer.engine.frontend.output_processor import OutputProcessor
from hetero_infer.engine.frontend.parent_request import ParentRequest
from hetero_infer.engine.params.sampling_params import RequestOutputKind, SamplingParams
from hetero_infer.engine.tokenizer import Tokenizer

from tests.engine.tokenizer.common import word_piece
from tests.helpers import BOS_TOKEN_ID, EOS_TOKEN_ID, make_byte_fallback_tokenizer

LETTERS = make_byte_fallback_tokenizer()
TOKENIZER = Tokenizer(LETTERS)


def ids_of(text: str) -> list[int]:
    return LETTERS.convert_tokens_to_ids(list(text))


PROMPT = [BOS_TOKEN_ID, *ids_of("hi")]


def processor_for(**requests: SamplingParams) -> OutputProcessor:
    processor = OutputProcessor(TOKENIZER, EngineMetrics())
    for request_id, params in requests.items():
        processor.add_request(ParentRequest(request_id, params), None, PROMPT)
    return processor


def update(
    request_id: str, token_ids: list[int], num_output_tokens: int, finish_reason: str | None = None
) -> SequenceUpdate:
    """A step's update that brought ``token_ids``."""
    tokens = [SampledToken(token_id, -0.5) for token_id in token_ids]
    return SequenceUpdate(
        request_id, tokens, [], finish_reason, None, num_output_tokens, 0, 1.0, None
    )


def test_each_update_of_a_step_reaches_its_choice() -> None:
    processor = processor_for(gone=SamplingParams(), chunk=SamplingParams(), late=SamplingParams())
    processor.abort("gone")  # while its step ran
    # gone's token (dropped), chunk's prompt chunk (nothing to show), late's token.
    updates = [
        update("gone", ids_of("a"), 1),
        update("chunk", [], 0),
        update("late", ids_of("b"), 1),
    ]
    processed = processor.process(updates)
    assert [(o.request_id, o.text) for o in processed.outputs] == [("late", "b")]
    # A finish without tokens (a time limit before the first) is an output.
    (output,) = processor.process([update("chunk", [], 0, "abort")]).outputs
    assert (output.request_id, output.finished, output.finish_reason) == ("chunk", True, "abort")


def test_a_running_or_kept_request_id_is_known() -> None:
    processor = processor_for(a=SamplingParams())
    assert processor.is_known("a") and not processor.is_known("b")
    processor.process([update("a", ids_of("x"), 1, "length")])
    assert processor.is_known("a")  # finished, kept for get_output


def test_a_stop_string_past_min_tokens_in_one_update_of_several_tokens() -> None:
    """Accepted draft tokens come in one update; each is counted as it is decoded, so
    the stop string completed by the third output token counts with min_tokens=3."""
    processor = processor_for(a=SamplingParams(stop=["yz"], min_tokens=3))
    processed = processor.process([update("a", ids_of("xyzw"), 4)])
    assert processed.stopped == ["a"]
    (output,) = processed.outputs
    assert (output.text, output.finish_reason, output.stop_reason) == ("x", "stop", "yz")
    assert output.token_ids == ids_of("xyz")  # up to the token that completed it


def test_a_finish_without_tokens_sends_the_bytes_held_back() -> None:
    processor = processor_for(a=SamplingParams())
    byte_b = LETTERS.convert_tokens_to_ids("<0x62>")  # a run of bytes may go on: held
    (held,) = processor.process([update("a", [byte_b], 1)]).outputs
    assert held.text == ""
    (output,) = processor.process([update("a", [], 1, "length")]).outputs
    assert (output.text, output.finish_reason) == ("b", "length")


def test_a_request_keeps_its_choices_until_the_last_one_ends() -> None:
    processor = processor_for(p=SamplingParams(n=2))
    first, second = processor.choice_ids("p")
    processor.process([update(first, ids_of("x"), 1, "length")])
    assert processor.choice_ids("p") == [first, second]  # an abort of "p" reaches both
    processor.process([update(second, ids_of("y"), 1, "length")])
    assert processor.choice_ids("p") == ["p"]  # the request forgotten


def test_the_oldest_finished_outputs_go_first(monkeypatch) -> None:
    monkeypatch.setattr(output_processor, "MAX_FINISHED_KEPT", 2)
    processor = processor_for(a=SamplingParams(), b=SamplingParams(), c=SamplingParams())
    for request_id in "abc":
        processor.process([update(request_id, ids_of("x"), 1, "length")])
    kept = [i for i in "abc" if processor.get_finished(i) is not None]
    assert kept == ["b", "c"]


def test_a_cumulative_output_keeps_what_it_had_as_later_steps_come() -> None:
    processor = processor_for(a=SamplingParams(logprobs=0))
    (first,) = processor.process([update("a", ids_of("x"), 1)]).outputs
    (second,) = processor.process([update("a", ids_of("y"), 2)]).outputs
    assert (first.text, first.token_ids, len(first.logprobs)) == ("x", ids_of("x"), 1)
    assert (second.text, second.token_ids, len(second.logprobs)) == ("xy", ids_of("xy"), 2)
    assert second.metrics.token_gaps == ()  # its outputs' own times give the gaps


def test_a_final_only_output_has_the_gaps_between_its_steps() -> None:
    processor = processor_for(a=SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY))
    assert not processor.process([update("a", ids_of("x"), 1)]).outputs
    assert not processor.process([update("a", ids_of("yz"), 3)]).outputs
    (output,) = processor.process([update("a", ids_of("w"), 4, "length")]).outputs
    assert output.text == "xyzw"
    assert [tokens for _, tokens in output.metrics.token_gaps] == [2, 1]
    assert all(0 <= gap < 60 for gap, _ in output.metrics.token_gaps)


def test_a_delta_stream_sends_the_prompt_logprobs_once() -> None:
    params = SamplingParams(prompt_logprobs=0, output_kind=RequestOutputKind.DELTA)
    processor = processor_for(a=params)
    prompt_logprobs = [{token_id: -1.0} for token_id in PROMPT[1:]]
    step = update("a", ids_of("x"), 1)
    step.new_prompt_logprobs = prompt_logprobs
    (first,) = processor.process([step]).outputs
    (second,) = processor.process([update("a", ids_of("y"), 2)]).outputs
    assert first.prompt_logprobs == [None, *prompt_logprobs]
    assert second.prompt_logprobs is None and second.text == "y"


def test_a_constraint_finish_keeps_its_last_tokens_text() -> None:
    """Only eos (unless ignored) and stop_token_ids leave their text out: the token that
    completes a constraint ("stop") keeps it, special tokens shown or not."""
    for skip_special_tokens in (True, False):
        processor = processor_for(a=SamplingParams(skip_special_tokens=skip_special_tokens))
        (output,) = processor.process([update("a", ids_of("x}"), 2, "stop")]).outputs
        assert output.text == "x}"
    eos = EOS_TOKEN_ID
    processor = processor_for(a=SamplingParams(skip_special_tokens=False))
    (output,) = processor.process([update("a", [*ids_of("x"), eos], 2, "stop")]).outputs
    assert output.text == "x"


def test_a_choice_decodes_with_its_requests_special_token_flags() -> None:
    """skip_special_tokens and spaces_between_special_tokens reach each choice's
    detokenizer: WordPiece's [CLS] (1) and [SEP] (2) after "hello" (3)."""
    processor = OutputProcessor(word_piece(), EngineMetrics())
    flags = {
        "shown": SamplingParams(skip_special_tokens=False),
        "written": SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False),
        "skipped": SamplingParams(spaces_between_special_tokens=False),
    }
    for request_id, params in flags.items():
        processor.add_request(ParentRequest(request_id, params), None, [3])
    outputs = processor.process([update(request_id, [1, 2, 3], 3) for request_id in flags])
    texts = {output.request_id: output.text for output in outputs.outputs}
    assert texts == {
        "shown": " [CLS] [SEP] hello",
        "written": " [CLS][SEP] hello",
        "skipped": " hello",
    }
