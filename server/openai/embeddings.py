"""/v1/embeddings: each input becomes an embedding request, which goes through the
engine loop beside generation requests (sharing its steps) and ends with its prefill;
its pooled vector comes back as a list of floats or, as OpenAI encodes it, base64 of
its bytes (little-endian float32 unless vLLM's embed_dtype and endianness say other),
or as vLLM's binary answer: the vectors' bytes one after another, where each lies told
in a JSON header (``metadata``; "bytes_only" leaves it out).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi.responses import JSONResponse, Response
from hetero_infer.engine.frontend.input_processor import EngineRequest
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.embedding_encoding import embedding_bytes
from hetero_infer.server.openai.embedding_request import EmbeddingRequest
from hetero_infer.server.serving.answer_parts import new_id, now
from hetero_infer.server.serving.messages_prompt import messages_prompt
from hetero_infer.server.serving.request_context import RequestContext


class Embeddings:
    """One /v1/embeddings request: an engine request per input, and the answer."""

    def __init__(
        self,
        ctx: RequestContext,
        body: EmbeddingRequest,
        requests: list[EngineRequest],
        answer_id: str,
    ) -> None:
        self.ctx = ctx
        self.requests = requests
        self.encoding_format = body.encoding_format
        self.embed_dtype = body.embed_dtype
        self.endianness = body.endianness
        self.id = answer_id

    @classmethod
    async def build(cls, ctx: RequestContext, body: EmbeddingRequest) -> Embeddings:
        """Tokenize and check every input (or the messages, one input, their images
        loaded): each must fit in the context."""
        size = ctx.engine.model_config.hidden_size
        if body.dimensions is not None and body.dimensions != size:
            raise APIError(
                400,
                f"dimensions: this model's embeddings have {size} dimensions and cannot be "
                f"shortened (the model has no Matryoshka training); omit dimensions or "
                f"give {size}",
                param="dimensions",
            )
        processor = ctx.engine.input_processor
        if body.messages is not None:
            prompts = [await messages_prompt(ctx, body.messages, body)]
        else:
            special = body.add_special_tokens is not False
            prompts = [processor.tokenize(p, "input", special) for p in body.inputs()]
        if body.truncate_prompt_tokens is not None:
            prompts = [processor.truncate(p, body.truncate_prompt_tokens) for p in prompts]
        embedding_id = new_id("embd")
        normalize = body.normalize is not False
        requests = [
            processor.embedding_request(f"{embedding_id}-{i}", prompt, normalize, body.priority)
            for i, prompt in enumerate(prompts)
        ]
        # The answer's id is made of the body's request_id where it has one, as vLLM's;
        # the engine requests' stay unique, so a retry with the same id is a new request.
        answer_id = f"embd-{body.request_id}" if body.request_id else embedding_id
        return cls(ctx, body, requests, answer_id)

    async def response(self) -> Response:
        """The answer: JSON, or (encoding_format "bytes", "bytes_only") binary."""
        finals = await self.ctx.run_to_end(self.requests)
        vectors = []
        for [output] in finals:
            assert output.embedding is not None, "an embedding request ended without one"
            vectors.append(output.embedding)
        num_tokens = sum(len(request.prompt_token_ids) for request in self.requests)
        answer = {
            "id": self.id,
            "created": now(),
            "model": self.ctx.model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
        if self.encoding_format in ("bytes", "bytes_only"):
            return self._binary(vectors, answer)
        data = [
            {"object": "embedding", "index": index, "embedding": self._encode(vector)}
            for index, vector in enumerate(vectors)
        ]
        return JSONResponse({**answer, "object": "list", "data": data})

    def _encode(self, vector: list[float]) -> list[float] | str:
        if self.encoding_format == "float":
            return vector
        raw = embedding_bytes(vector, self.embed_dtype, self.endianness)
        return base64.b64encode(raw).decode("ascii")

    def _binary(self, vectors: list[list[float]], answer: dict[str, Any]) -> Response:
        """vLLM's binary answer: the bytes of each vector in turn; unless "bytes_only",
        a ``metadata`` header of JSON, the answer with where each vector lies."""
        parts = [embedding_bytes(v, self.embed_dtype, self.endianness) for v in vectors]
        headers = None
        if self.encoding_format == "bytes":
            data, start = [], 0
            for index, (vector, part) in enumerate(zip(vectors, parts, strict=True)):
                end = start + len(part)
                data.append({
                    "index": index, "embed_dtype": self.embed_dtype,
                    "endianness": self.endianness, "start": start, "end": end,
                    "shape": [len(vector)],
                })  # fmt: skip
                start = end
            headers = {"metadata": json.dumps({**answer, "data": data})}
        return Response(b"".join(parts), media_type="application/octet-stream", headers=headers)
