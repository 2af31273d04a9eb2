"""LLMEngine: the synchronous engine. add_request / step / abort, and generate().

The front end around EngineCore (built by core_builder.py): requests are checked
(frontend/input_processor.py) and fanned out into their choices before the core
steps, and its updates become outputs after (frontend/output_processor.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence as Seq
from typing import Any

from hetero_infer.engine import loader
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.scheduler import Scheduler
from hetero_infer.engine.core.sequence import Sequence, SequenceStatus
from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams
from hetero_infer.engine.entrypoints.beam_search_runner import beam_search
from hetero_infer.engine.entrypoints.core_builder import build_core
from hetero_infer.engine.entrypoints.outputs import RequestOutput, final_only
from hetero_infer.engine.frontend.input_processor import EngineRequest, InputProcessor, Prompt
from hetero_infer.engine.frontend.lora_requests import LoRARequests
from hetero_infer.engine.frontend.output_processor import OutputProcessor
from hetero_infer.engine.frontend.parent_request import ParentRequest, choice_id
from hetero_infer.engine.lora import LoRARequest
from hetero_infer.engine.multimodal.image_prompts import ImagePrompts
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.params.structured_output import StructuredOutput
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ValidationError
from hetero_infer.engine.setup import resolve_setup
from hetero_infer.engine.tokenizer import Tokenizer
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


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
        # Every setting resolved once (engine/setup.py): the model's source and config,
        # the context length, the device, the dtype, the speculative config.
        self.setup = setup = resolve_setup(config)
        source = setup.source
        self.model_config = setup.model_config
        # What a request leaves out gets (the routes, default_sampling_params() apply it)
        self.generation_defaults = setup.generation_defaults
        logger.info("%s", self.generation_defaults.describe())
        self.max_model_len = setup.max_model_len
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = loader.load_tokenizer(
                loader.resolve_model(config.tokenizer) if config.tokenizer else source
            )
        end_of_turn = loader.with_family_chat(tokenizer, self.model_config.architecture)
        self.tokenizer = Tokenizer(tokenizer, (*self.model_config.eos_token_ids, *end_of_turn))
        self.structured_output = StructuredOutput(
            tokenizer, self.model_config.vocab_size, sorted(self.tokenizer.eos_token_ids)
        )
        built = build_core(setup, tokenizer)
        self.core, self.runner, self.workers = built.core, built.runner, built.workers
        self.metrics, self.lora, self.kv_events = built.metrics, built.lora, built.kv_events
        self.adapters = LoRARequests(self.lora, built.core.scheduler)  # loaded by name
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.structured_output,
            self.model_config.vocab_size,
            self.max_model_len,
            config.pooling,
            scheduling_policy=config.scheduling_policy,
            request_timeout=config.request_timeout,
            image_prompts=ImagePrompts.for_model(
                source.folder, setup.model_config, self.tokenizer, config
            ),
        )
        self.output_processor = OutputProcessor(self.tokenizer, self.metrics)
        self._ids = itertools.count()

    # ---- requests ----

    def add_request(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        max_tokens: int | None = None,
        priority: int = 0,
        timeout: float | None = None,
        lora_request: LoRARequest | str | None = None,
    ) -> str:
        """Queue a request; returns its id. Bad input raises ValidationError (a
        ValueError) naming the field. ``max_tokens`` overrides the params' own (the
        mini-infer form: ``add_request(prompt=..., max_tokens=..., sampling_params=...)``).
        ``priority`` (lower first) needs scheduling_policy "priority"; ``timeout``
        (seconds) ends the request early, as request_timeout does. ``lora_request``: the
        LoRA adapter to run with, by name or as adapters.load returned it.
        """
        params = sampling_params or SamplingParams()
        if max_tokens is not None and isinstance(params, SamplingParams):
            params = dataclasses.replace(params, max_tokens=max_tokens)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        lora = self.adapters.resolve(lora_request)
        request = self.input_processor.process(request_id, prompt, params, priority, timeout, lora)
        return self.add_processed(request)

    def add_processed(self, request: EngineRequest) -> str:
        """Queue a request the input processor has checked (the server's routes check
        theirs before they answer, then hand them over here)."""
        parent = ParentRequest(request.request_id, request.params)
        if any(self.output_processor.is_known(i) for i in parent.choice_ids):
            raise ValidationError(
                f"request_id {request.request_id!r} is already in use", param="request_id"
            )
        self.adapters.check(request.lora)  # still loaded: it may have gone since it was named
        seqs = []
        for index, seq_id in enumerate(parent.choice_ids):
            grammar = request.grammar
            if grammar is not None and index > 0:
                grammar = grammar.deep_copy()  # each choice walks the grammar on its own
            params = parent.choice_params(index)
            seqs.append(
                Sequence(
                    seq_id,
                    request.prompt_token_ids,
                    params,
                    self.tokenizer.eos_token_ids,
                    grammar,
                    request.pooling,
                    priority=request.priority,
                    deadline=request.deadline,
                    lora=request.lora,
                    images=request.images,
                )
            )
        self.output_processor.add_request(parent, request.prompt, request.prompt_token_ids)
        self.core.add(seqs, request.deadline)
        self.metrics.prompt_tokens += len(request.prompt_token_ids)
        return request.request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request (every choice) and free its blocks at once; False if not running."""
        seq_ids = self.output_processor.choice_ids(request_id)
        self.core.finish(seq_ids, SequenceStatus.FINISHED_ABORTED)
        return any([self.output_processor.abort(seq_id) for seq_id in seq_ids])

    def default_sampling_params(self, **fields: Any) -> SamplingParams:
        """SamplingParams with the generation config's defaults (see
        generation_config), ``fields`` over them; as vLLM's get_default_sampling_params."""
        return SamplingParams(**{**self.generation_defaults.values, **fields})

    def check_health(self) -> None:
        """ExecutionError when a tensor-parallel rank has died (none in one process)."""
        if self.workers is not None:
            self.workers.check_alive()

    def shutdown(self) -> None:
        """Write the cached blocks the disk tier lacks (kv_offloading_flush_timeout), stop
        the other ranks and the KV events' publisher; the engine cannot step after."""
        self.core.apply_tier_moves(unsaved=True)
        self.runner.kv_cache.close_tiers(self.config.kv_offloading_flush_timeout)
        self.runner.stop_workers()
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        if self.kv_events is not None:
            self.kv_events.close()

    def has_pending_work(self) -> bool:
        return self.core.has_unfinished()

    def get_output(self, request_id: str) -> RequestOutput | None:
        """A finished request's output; None while it runs (or once forgotten)."""
        return self.output_processor.get_finished(request_id)

    def memory_stats(self) -> dict[str, Any]:
        stats = self.block_manager.memory_stats()
        # The prefix cache's tiers: the scheduler's counts and the bytes the runner moved.
        if self.block_manager.tiers is not None:
            stats.update(self.block_manager.tiers.stats())
        if self.runner.kv_cache.tiers is not None:
            stats.update(self.runner.kv_cache.tiers.stats())
        # KV slots held vs tokens stored: paging wastes at most each last block's tail.
        queues = self.scheduler.queues
        allocated = sum(len(s.block_table) for s in queues.running) * self.config.block_size
        filled = sum(seq.num_computed_tokens for seq in queues.running)
        stats.update(
            queues.counts(),
            kv_slots_allocated=allocated,
            kv_slots_filled=filled,
            kv_waste=(allocated - filled) / allocated if allocated else 0.0,
        )
        return stats

    # ---- stepping ----

    def step(self) -> list[RequestOutput]:
        """Run one step (EngineCore.step) and make the outputs of the requests that got
        tokens or finished (with async scheduling, while the model computes the next)."""
        processed = self.output_processor.process(self.core.step())
        # A stop string the output processor found ends its sequence.
        self.core.finish(processed.stopped, SequenceStatus.FINISHED_STOPPED)
        if self.lora is not None and self.lora.has_retiring:
            self.core.wait_for_runner()  # the slots it frees hold the runner's weights
            self.adapters.free_unloaded()
        return processed.outputs

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def block_manager(self) -> BlockManager:
        return self.core.scheduler.block_manager

    # ---- offline batch API ----

    def beam_search(
        self, prompts: Prompt | Seq[Prompt], params: BeamSearchParams
    ) -> list[RequestOutput]:
        """Beam search of each prompt (engine/entrypoints/beam_search.py: transformers' scores and
        early stopping). As generate with n, a prompt gives beam_width outputs next to
        each other, best first."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        token_ids = [self.input_processor.tokenize(p).token_ids for p in prompts]
        return [out for outs in beam_search(self, token_ids, params) for out in outs]

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | str | Seq[LoRARequest | str | None] | None = None,
        **sampling: Any,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs come back in the prompts' order.

        Sampling comes as SamplingParams, or as their fields in keyword form
        (``generate(prompts=[...], max_tokens=100, temperature=0.8, top_p=0.95)``, as
        mini-infer writes it). With n > 1 a prompt gives n outputs, one per choice, next
        to each other. ``lora_request``: one adapter for every prompt, or one per prompt."""
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
                    f"sampling_params: {len(params)} given for {len(prompts)} prompts",
                    param="sampling_params",
                )
        params = final_only(params)  # as vLLM's LLM.generate: only the last output is read
        loras = lora_request
        if lora_request is None or isinstance(lora_request, str | LoRARequest):
            loras = [lora_request] * len(prompts)
        ids: list[str] = []  # every choice of every prompt, in order
        try:
            for prompt, sp, lora in zip(prompts, params, loras, strict=True):
                request_id = self.add_request(prompt, sp, lora_request=lora)
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
        self.core.wait_for_runner()  # async scheduling: no step left computing after
        return [self.output_processor.pop_finished(request_id) for request_id in ids]
