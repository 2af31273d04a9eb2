"""LLMEngine: the synchronous engine. add_request / step / abort, and generate().

It wires the parts together: the loader builds the model, the scheduler picks
each step's work over the block manager's KV blocks, the model runner executes
it, and each sequence's detokenizer turns new tokens into text.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hetero_infer.engine import host_memory, loader
from hetero_infer.engine.block_manager import BlockManager
from hetero_infer.engine.config import EngineConfig
from hetero_infer.engine.exceptions import ConfigError, OutOfMemoryError, ValidationError
from hetero_infer.engine.metrics import EngineMetrics
from hetero_infer.engine.model_runner import ModelRunner, Sampled
from hetero_infer.engine.models import CausalLM, ModelConfig, build_model
from hetero_infer.engine.outputs import RequestMetrics, RequestOutput
from hetero_infer.engine.sampling_params import SamplingParams
from hetero_infer.engine.scheduler import Scheduler, SchedulerOutput
from hetero_infer.engine.sequence import Sequence, SequenceStatus
from hetero_infer.engine.stop_strings import StopStringMatcher
from hetero_infer.engine.structured_output import StructuredOutput
from hetero_infer.engine.tokenizer import IncrementalDetokenizer, Tokenizer
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

Prompt = str | list[int]
# Finished requests kept for get_output() after they end.
MAX_FINISHED_KEPT = 4096


@dataclass
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    output: RequestOutput
    num_detokenized: int  # tokens already turned into text
    stops: StopStringMatcher | None = None
    decoded: str = ""  # all text decoded so far; output.text is the part sent


class LLMEngine:
    def __init__(
        self, config: EngineConfig | None = None, tokenizer: Any = None, **overrides: Any
    ) -> None:
        """``tokenizer``: a tokenizer path (as the config's field) or a tokenizer object:
        a Hugging Face one, or any object with encode/decode (see engine.tokenizer)."""
        config = config or EngineConfig()
        if isinstance(tokenizer, str):
            overrides["tokenizer"] = tokenizer
        if overrides:
            config = config.replace(**overrides)
        self.config = config
        self.device = _resolve_device(config.device)
        if self.device.type == "cpu":
            host_memory.keep_freed_memory()
        source = loader.resolve_model(config.model)
        self.model_config = ModelConfig.from_hf(loader.load_config(source))
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.model = self._load_model(source)
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = loader.load_tokenizer(
                loader.resolve_model(config.tokenizer) if config.tokenizer else source
            )
        self.tokenizer = Tokenizer(tokenizer, self.model_config.eos_token_ids)
        self.structured_output = StructuredOutput(
            tokenizer, self.model_config.vocab_size, sorted(self.tokenizer.eos_token_ids)
        )
        self.max_model_len = self._resolve_max_model_len()
        self.runner = ModelRunner(config, self.model, self.device, self.dtype)
        capacity = self.runner.num_blocks * config.block_size
        if capacity < self.max_model_len:
            raise OutOfMemoryError(
                f"max_num_blocks: the KV cache holds {capacity} tokens "
                f"({self.runner.num_blocks} blocks of {config.block_size}), fewer than "
                f"max_model_len ({self.max_model_len}); add blocks or lower max_model_len"
            )
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            num_cpu_blocks=config.num_cpu_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            memory_threshold=config.memory_threshold,
            use_swap=config.use_swap,
        )
        self.metrics = EngineMetrics()
        self._requests: dict[str, _Request] = {}
        self._finished: OrderedDict[str, RequestOutput] = OrderedDict()
        self._groups: dict[str, list[str]] = {}  # n > 1: request id -> its choices' ids
        self._ids = itertools.count()
        # overlap_steps: the model pass's thread, and the sequences whose tokens of the
        # last step are not yet in their outputs.
        self._overlap = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-pass")
            if config.overlap_steps
            else None
        )
        self._unsent: list[Sequence] = []
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB), max concurrency %.1f at %d tokens",
            self.runner.num_blocks,
            config.block_size,
            self.runner.num_blocks * self.runner.bytes_per_block / 2**20,
            capacity / self.max_model_len,
            self.max_model_len,
        )

    def _load_model(self, source: loader.ModelSource) -> CausalLM:
        started = time.monotonic()
        # Built without memory, then filled from the checkpoint: no random init.
        with torch.device("meta"):
            model = build_model(self.model_config)
        model = model.to_empty(device=self.device).to(self.dtype)
        model.load_weights(loader.load_state_dict(source, self.dtype))
        model.init_rope(self.device)
        model.eval()
        logger.info("loaded %s in %.1f s", source.path, time.monotonic() - started)
        return model

    def _resolve_max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.config.max_model_len is None:
            return limit
        if self.config.max_model_len > limit:
            raise ConfigError(
                f"max_model_len ({self.config.max_model_len}) is larger than the model's "
                f"max_position_embeddings ({limit})"
            )
        return self.config.max_model_len

    # ---- requests ----

    def add_request(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        max_tokens: int | None = None,
    ) -> str:
        """Queue a request; returns its id. Bad input raises ValidationError (a
        ValueError) naming the field. ``max_tokens`` overrides the params' own (the
        mini-infer form: ``add_request(prompt=..., max_tokens=..., sampling_params=...)``).
        """
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValidationError("sampling_params must be a SamplingParams")
        if max_tokens is not None:
            params = dataclasses.replace(params, max_tokens=max_tokens)
        prompt_text, token_ids = self._tokenize(prompt)
        self.check_params(params)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        choice_ids = [choice_id(request_id, i) for i in range(params.n)]
        if any(i in self._requests or i in self._finished for i in choice_ids):
            raise ValidationError(f"request_id {request_id!r} is already in use")
        seqs = []
        for index, seq_id in enumerate(choice_ids):
            seq = Sequence(
                seq_id,
                prompt_text,
                token_ids,
                choice_params(params, index),
                self.tokenizer.eos_token_ids,
            )
            seq.group_id, seq.index = request_id, index
            if params.json_schema is not None:
                seq.matcher = self.structured_output.matcher(params.json_schema)
            seqs.append(seq)
            output = RequestOutput(
                request_id=seq_id,
                prompt=prompt_text,
                prompt_token_ids=list(token_ids),
                text="",
                token_ids=[],
                finished=False,
                finish_reason=None,
                cumulative_logprob=0.0,
                metrics=RequestMetrics(arrival_time=seq.times.arrival),
                index=index,
                group_id=request_id,
            )
            detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids)
            stops = (
                StopStringMatcher(params.stop, params.include_stop_str_in_output)
                if params.stop
                else None
            )
            self._requests[seq_id] = _Request(seq, detokenizer, output, len(token_ids), stops)
        # Choice 0 computes the prompt; the others fork from it then (Scheduler.postprocess).
        seqs[0].fork_children = seqs[1:]
        if params.n > 1:
            self._groups[request_id] = choice_ids
        self.scheduler.add(seqs[0])
        self.metrics.prompt_tokens += len(token_ids)
        return request_id

    def check_params(self, params: SamplingParams) -> None:
        """What SamplingParams cannot check alone: token ids and the JSON schema."""
        params.check_vocab(self.model_config.vocab_size)
        if params.json_schema is not None:
            self.structured_output.matcher(params.json_schema)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValidationError("prompt must not be empty")
            token_ids = self.tokenizer.encode(prompt)
            text: str | None = prompt
        elif isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            token_ids, text = list(prompt), None
        else:
            raise ValidationError("prompt must be a string or a list of token ids")
        if not token_ids:
            raise ValidationError("prompt must not be empty")
        # (Checked for encoded text too: a plugged-in tokenizer may not fit the model.)
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValidationError(
                f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})"
            )
        if len(token_ids) > self.max_model_len:
            raise ValidationError(
                f"prompt: {len(token_ids)} tokens is longer than max_model_len "
                f"({self.max_model_len})"
            )
        return text, token_ids

    def abort(self, request_id: str) -> bool:
        """Stop a request (all its choices) and free its blocks at once.

        False if it is not running."""
        aborted = False
        for seq_id in self._groups.pop(request_id, [request_id]):
            request = self._requests.get(seq_id)
            if request is not None:
                self.scheduler.finish(request.seq, SequenceStatus.FINISHED_ABORTED)
                self._finish(request)
                aborted = True
        # overlap_steps: an aborted request's last tokens are never sent.
        self._unsent = [seq for seq in self._unsent if seq.request_id in self._requests]
        return aborted

    def has_pending_work(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._unsent)

    def get_output(self, request_id: str) -> RequestOutput | None:
        """A finished request's output; None while it runs (or once forgotten)."""
        return self._finished.get(request_id)

    def memory_stats(self) -> dict[str, Any]:
        stats = self.block_manager.memory_stats()
        # KV slots the running sequences hold vs the tokens stored in them: paging
        # wastes at most the unfilled tail of each sequence's last block.
        allocated = sum(len(seq.block_table) for seq in self.scheduler.running)
        allocated *= self.config.block_size
        filled = sum(seq.num_computed_tokens for seq in self.scheduler.running)
        stats.update(
            num_sequences=self.scheduler.num_unfinished,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_swapped=len(self.scheduler.swapped),
            kv_slots_allocated=allocated,
            kv_slots_filled=filled,
            kv_waste=(allocated - filled) / allocated if allocated else 0.0,
        )
        return stats

    # ---- stepping ----

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return the requests that got tokens or finished.

        With overlap_steps, the model pass of this step runs in a worker thread while
        this thread turns the previous step's tokens into outputs: the outputs returned
        are the previous step's (the last ones come from a step with nothing scheduled).
        """
        started = time.perf_counter()
        out = self.scheduler.schedule()
        self.metrics.num_preemptions += len(out.preempted)
        if self._overlap is None:
            progressed = [] if out.is_empty else self._postprocess(out, self.runner.execute(out))
            outputs = self._outputs(progressed)
        else:
            running = None
            if not out.is_empty:
                running = self._overlap.submit(self.runner.run, out, self.runner.prepare(out))
            # A stop string found here finishes its sequence while the model computes one
            # more token for it, which postprocess then drops.
            unsent, self._unsent = self._unsent, []
            outputs = self._outputs(unsent)
            if running is not None:
                self._unsent = self._postprocess(out, running.result())
        if not out.is_empty:
            self.metrics.busy_time += time.perf_counter() - started
        return outputs

    def _postprocess(self, out: SchedulerOutput, sampled: dict[str, Sampled]) -> list[Sequence]:
        """Append a step's tokens; return the sequences that progressed."""
        progressed = self.scheduler.postprocess(out, sampled)
        for seq in progressed:
            if seq.matcher is not None and seq.request_id in sampled:
                self._advance_grammar(seq)
        self.metrics.num_steps += 1
        self.metrics.tokens_generated += len(sampled)
        self.metrics.max_batch_size = max(self.metrics.max_batch_size, len(out.scheduled))
        return progressed

    def _outputs(self, progressed: list[Sequence]) -> list[RequestOutput]:
        """Detokenize the sequences' new tokens into their requests' outputs."""
        outputs = []
        for seq in progressed:
            request = self._requests.get(seq.request_id)
            if request is None:  # aborted since its step
                continue
            if seq.num_tokens > request.num_detokenized or seq.is_finished:
                outputs.append(self._update_output(request))
        return outputs

    def _advance_grammar(self, seq: Sequence) -> None:
        """Feed the matcher the new token; the output ends where the grammar does."""
        if not seq.matcher.consume_token(seq.token_ids[-1]):
            # The mask allowed only tokens it accepts, so this is a bug, not bad input.
            logger.error("grammar refused token: %s", seq.matcher.get_error())
            self.scheduler.finish(seq, SequenceStatus.FINISHED_FAILED)
        elif seq.matcher.is_stopped() and not seq.is_finished:
            self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)

    def _update_output(self, request: _Request) -> RequestOutput:
        seq, output = request.seq, request.output
        new_ids = seq.token_ids[request.num_detokenized :]
        request.num_detokenized = seq.num_tokens
        # A stop_token_ids token ends the request without its text, as in vLLM.
        text_ids = new_ids
        if seq.stop_reason is not None and not seq.sampling_params.include_stop_str_in_output:
            text_ids = new_ids[:-1]
        old_len = len(request.decoded)
        request.decoded += request.detokenizer.step(text_ids) if text_ids else ""
        if seq.is_finished:
            request.decoded += request.detokenizer.flush()
        now = time.monotonic()
        if new_ids and output.metrics.first_token_time is None:
            output.metrics.first_token_time = now
        output.metrics.first_scheduled_time = seq.times.first_scheduled
        output.metrics.num_preemptions = seq.num_preemptions
        output.token_ids = seq.output_token_ids
        output.cumulative_logprob = seq.cumulative_logprob
        output.delta_token_ids = new_ids
        if seq.logprobs is not None:
            output.logprobs = list(seq.logprobs)  # a new list: callers keep snapshots
        if seq.prompt_logprobs is not None and output.prompt_logprobs is None:
            output.prompt_logprobs = list(seq.prompt_logprobs)
        send_to = self._check_stop_strings(request, old_len)
        if seq.is_finished:
            self._finish(request)
        sent = len(output.text)
        send_to = max(send_to, sent)  # the hold-back never lets a sent char become a stop
        output.delta_text = request.decoded[sent:send_to]
        output.text = request.decoded[:send_to]
        return output

    def _check_stop_strings(self, request: _Request, old_len: int) -> int:
        """Finish the request on a stop string; return how far its text may be sent."""
        seq, stops, text = request.seq, request.stops, request.decoded
        if stops is None:
            return len(text)
        if seq.num_output_tokens >= seq.sampling_params.min_tokens:
            found = stops.find(text, old_len)
            if found is not None:
                end, stop = found
                request.decoded = text[:end]
                seq.stop_reason = stop
                # Over a length finish in the same step too: the stop string came first.
                if seq.is_finished:
                    seq.status = SequenceStatus.FINISHED_STOPPED
                else:
                    self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
                return end
        if seq.is_finished:
            return len(text)
        return len(text) - stops.held_back(text)

    def _finish(self, request: _Request) -> None:
        seq, output = request.seq, request.output
        output.finished = True
        output.finish_reason = seq.status.finish_reason
        output.stop_reason = seq.stop_reason
        output.metrics.finished_time = seq.times.finished or time.monotonic()
        del self._requests[seq.request_id]
        group = self._groups.get(seq.group_id)
        if group is not None and all(i not in self._requests for i in group):
            del self._groups[seq.group_id]
        self._finished[seq.request_id] = output
        while len(self._finished) > MAX_FINISHED_KEPT:
            self._finished.popitem(last=False)
        self.metrics.requests_processed += 1
        self.metrics.total_latency += output.metrics.latency or 0.0

    # ---- offline batch API ----

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        **sampling: Any,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the prompts' order.

        Sampling comes as SamplingParams, or as their fields in keyword form
        (``generate(prompts=[...], max_tokens=100, temperature=0.8, top_p=0.95)``, as
        mini-infer writes it). With n > 1 a prompt gives n outputs, one per choice, next
        to each other."""
        if sampling:
            if sampling_params is not None:
                raise ValidationError(
                    "give sampling_params or their fields as keywords, not both",
                    param="sampling_params",
                )
            try:
                sampling_params = SamplingParams(**sampling)
            except TypeError as exc:
                raise ValidationError(f"generate: {exc}", param="sampling_params") from None
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValidationError(
                    f"sampling_params: {len(params)} given for {len(prompts)} prompts"
                )
        ids: list[str] = []  # every choice of every prompt, in order
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                request_id = self.add_request(prompt, sp)
                ids += [choice_id(request_id, i) for i in range(sp.n)]
        except ValueError:
            for request_id in ids:
                self.abort(request_id)
            raise
        pending = set(ids)
        with tqdm(total=len(ids), disable=not use_tqdm, desc="generate") as bar:
            while pending and self.has_pending_work():
                for output in self.step():
                    if output.finished and output.request_id in pending:
                        pending.discard(output.request_id)
                        bar.update(1)
        return [self._finished.pop(request_id) for request_id in ids]


def choice_id(request_id: str, index: int) -> str:
    """The sequence id of choice ``index`` of a request (choice 0 keeps the request's)."""
    return request_id if index == 0 else f"{request_id}#{index}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index``'s own params: a seeded request seeds choice i with seed + i
    (as vLLM does), so every choice is reproducible and the choices differ."""
    if params.n == 1:
        return params
    seed = None if params.seed is None else (params.seed + index) % 2**63
    return dataclasses.replace(params, n=1, seed=seed)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but no CUDA GPU is available")
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes a decode step reads and doubles matmul throughput where
        # the CPU computes in bf16; elsewhere bf16 is emulated and slower than fp32.
        if device.type == "cpu" and not cpu_has_bf16():
            return torch.float32
        return torch.bfloat16
    return getattr(torch, dtype)


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether the CPU has bf16 matrix instructions (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: assume not
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
