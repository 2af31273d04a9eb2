"""LLMEngine: the synchronous engine. add_request / step / abort, and generate().

It wires the parts together: the loader builds the model, the scheduler picks
each step's work over the block manager's KV blocks, the model runner executes
it, and each sequence's detokenizer turns new tokens into text.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from engine import loader
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.metrics import EngineMetrics
from engine.model_runner import ModelRunner
from engine.models import build_model
from engine.outputs import RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

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


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        config = config or EngineConfig()
        if overrides:
            config = config.replace(**overrides)
        self.config = config
        self.device = _resolve_device(config.device)
        source = loader.resolve_model(config.model)
        self.model_config = loader.load_config(source)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.model = self._load_model(source)
        hf_tokenizer = (
            loader.load_tokenizer(loader.resolve_model(config.tokenizer))
            if config.tokenizer
            else loader.load_tokenizer(source)
        )
        self.tokenizer = Tokenizer(hf_tokenizer, _config_eos_ids(self.model_config))
        self.max_model_len = self._resolve_max_model_len()
        self.runner = ModelRunner(config, self.model, self.device, self.dtype)
        capacity = self.runner.num_blocks * config.block_size
        if capacity < self.max_model_len:
            raise ValueError(
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
        self._ids = itertools.count()
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB), max concurrency %.1f at %d tokens",
            self.runner.num_blocks,
            config.block_size,
            self.runner.num_blocks * self.runner.bytes_per_block / 2**20,
            capacity / self.max_model_len,
            self.max_model_len,
        )

    def _load_model(self, source: loader.ModelSource) -> torch.nn.Module:
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
            raise ValueError(
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
    ) -> str:
        """Queue a request; returns its id. Bad input raises ValueError naming the field."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        prompt_text, token_ids = self._tokenize(prompt)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if request_id in self._requests or request_id in self._finished:
            raise ValueError(f"request_id {request_id!r} is already in use")
        seq = Sequence(request_id, prompt_text, token_ids, params, self.tokenizer.eos_token_ids)
        output = RequestOutput(
            request_id=request_id,
            prompt=prompt_text,
            prompt_token_ids=list(token_ids),
            text="",
            token_ids=[],
            finished=False,
            finish_reason=None,
            cumulative_logprob=0.0,
            metrics=RequestMetrics(arrival_time=seq.times.arrival),
        )
        detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids)
        self._requests[request_id] = _Request(seq, detokenizer, output, len(token_ids))
        self.scheduler.add(seq)
        self.metrics.prompt_tokens += len(token_ids)
        return request_id

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            token_ids = self.tokenizer.encode(prompt)
            text: str | None = prompt
        elif isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            token_ids, text = list(prompt), None
            vocab = self.model_config.vocab_size
            bad = [t for t in token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})"
                )
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        if not token_ids:
            raise ValueError("prompt must not be empty")
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                f"prompt: {len(token_ids)} tokens is longer than max_model_len "
                f"({self.max_model_len})"
            )
        return text, token_ids

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks at once. False if it is not running."""
        request = self._requests.get(request_id)
        if request is None:
            return False
        self.scheduler.finish(request.seq, SequenceStatus.FINISHED_ABORTED)
        self._finish(request)
        return True

    def has_pending_work(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_output(self, request_id: str) -> RequestOutput | None:
        request = self._requests.get(request_id)
        return request.output if request is not None else self._finished.get(request_id)

    def memory_stats(self) -> dict[str, Any]:
        stats = self.block_manager.memory_stats()
        stats.update(
            num_sequences=self.scheduler.num_unfinished,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_swapped=len(self.scheduler.swapped),
        )
        return stats

    # ---- stepping ----

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; return the requests that got tokens or finished."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        self.metrics.num_preemptions += len(out.preempted)
        if out.is_empty:
            return []
        sampled = self.runner.execute(out)
        progressed = self.scheduler.postprocess(out, sampled)
        outputs = []
        for seq in progressed:
            request = self._requests[seq.request_id]
            if seq.num_tokens > request.num_detokenized or seq.is_finished:
                outputs.append(self._update_output(request))
        self.metrics.num_steps += 1
        self.metrics.tokens_generated += len(sampled)
        self.metrics.max_batch_size = max(self.metrics.max_batch_size, len(out.scheduled))
        self.metrics.busy_time += time.perf_counter() - started
        return outputs

    def _update_output(self, request: _Request) -> RequestOutput:
        seq, output = request.seq, request.output
        new_ids = seq.token_ids[request.num_detokenized :]
        request.num_detokenized = seq.num_tokens
        delta = request.detokenizer.step(new_ids) if new_ids else ""
        now = time.monotonic()
        if new_ids and output.metrics.first_token_time is None:
            output.metrics.first_token_time = now
        output.metrics.first_scheduled_time = seq.times.first_scheduled
        output.metrics.num_preemptions = seq.num_preemptions
        output.token_ids = seq.output_token_ids
        output.cumulative_logprob = seq.cumulative_logprob
        output.delta_token_ids = new_ids
        if seq.is_finished:
            delta += request.detokenizer.flush()
            self._finish(request)
        output.delta_text = delta
        output.text += delta
        return output

    def _finish(self, request: _Request) -> None:
        seq, output = request.seq, request.output
        output.finished = True
        output.finish_reason = seq.status.finish_reason
        output.metrics.finished_time = seq.times.finished or time.monotonic()
        del self._requests[seq.request_id]
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
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the prompts' order."""
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
                raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                ids.append(self.add_request(prompt, sp))
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


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but no CUDA GPU is available")
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # fp32 on the CPU keeps results exact against the reference; bf16 on GPUs.
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, dtype)


def _config_eos_ids(model_config: Any) -> list[int]:
    eos = getattr(model_config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
