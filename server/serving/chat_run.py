"""A chat request's way to the engine, whichever family's body it came in (ChatRun):
its ChatPlan through the chat template (the tools as tool_use.py decides), its images
grown into their tokens (loaded before, chat_images.py), truncated, its max_tokens
fitted to the context, its SamplingParams (or beam search's params), the thinking
budget and the tools' grammar, then the engine request; and a parser of each choice's
text (chat_output.py). Each family runs it and writes the answer in its own wire
format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams, num_candidates
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.engine.multimodal.recent_images import PreparedImage
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_output import ChatOutputParser
from hetero_infer.server.serving.chat_plan import ChatPlan, check_template_flags
from hetero_infer.server.serving.reasoning import reasoning_parser
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.tool_use import ToolUse, tool_use


@dataclass(frozen=True)
class ChatRun:
    """One chat request's engine request, and how to read its choices' text."""

    request: EngineRequest
    tools: ToolUse
    # The server's reasoning parser; None where there is none, or where a grammar
    # constrains the output from its first token (no thinking to split off).
    reasoning: str | None = None
    # use_beam_search: the search's params.
    beam: BeamSearchParams | None = None

    @classmethod
    def build(
        cls,
        ctx: RequestContext,
        plan: ChatPlan,
        request_id: str,
        images: Sequence[PreparedImage] = (),
    ) -> ChatRun:
        """The messages and tools through the chat template, checked, then the params
        (max_tokens fits the context; a constrained tool_choice's schema). ``images``:
        the plan's, in order, loaded first (chat_images.load_images: fetching waits)."""
        assert len(images) == plan.image_count(), "the plan's images are loaded first"
        tools = tool_use(plan, ctx.settings)
        check_template_flags(plan.messages, plan.add_generation_prompt, plan.continue_final_message)
        token_ids = ctx.chat_prompt(
            plan.template_messages(),
            tools=tools.template_tools,
            template_kwargs=plan.template_kwargs(),
            add_generation_prompt=plan.add_generation_prompt,
            continue_final_message=plan.continue_final_message,
            add_special_tokens=plan.add_special_tokens,
        )
        processor = ctx.engine.input_processor
        # Each image marker grows into the image's tokens before the prompt is cut or
        # max_tokens fitted: the grown length is what the context holds.
        prompt = processor.with_images(processor.tokenize(token_ids), images)
        prompt = plan.truncated(prompt, processor)
        defaults = ctx.engine.generation_defaults.sampling
        max_tokens = ctx.max_tokens(prompt, plan.requested_max_tokens())
        beam = None
        if plan.use_beam_search:
            if tools.json_schema is not None:
                raise APIError(
                    400, "a constrained 'tool_choice' cannot be used with beam search",
                    param="tool_choice",
                )  # fmt: skip
            params, beam = plan.beam_search_params(max_tokens)
            if tools.keeps_special_tokens:
                beam = dataclasses.replace(beam, skip_special_tokens=False)
            num_candidates(beam, ctx.engine.tokenizer.eos_token_ids)  # n fits: a 400 now
        else:
            params = plan.sampling_params(max_tokens, defaults)
        params = ctx.thinking_budget(params, plan.thinking_token_budget)
        if tools.json_schema is not None:
            params = dataclasses.replace(params, json_schema=tools.json_schema)
        if tools.keeps_special_tokens:
            params = dataclasses.replace(params, skip_special_tokens=False)
        schema_param = "tools" if tools.json_schema is not None else plan.constraint_param()
        request = processor.request(
            request_id, prompt, params, plan.priority, plan.timeout, schema_param
        )
        reasoning = ctx.settings.reasoning_parser if request.grammar is None else None
        return cls(request, tools, reasoning, beam)

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    def output_parser(self) -> ChatOutputParser:
        """A parser of one choice's text."""
        reasoning = reasoning_parser(self.reasoning) if self.reasoning else None
        tools = self.tools.new_parser() if self.tools.new_parser else None
        return ChatOutputParser(reasoning, tools, self.tools.max_calls)
