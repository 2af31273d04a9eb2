"""The fields OpenAI or vLLM (or SGLang, for its router) define for each route that this
server does not implement (request_body.Unsupported): a body that sets one to anything
but null, or a value that changes nothing, gets a 400 naming it, never silently
different behaviour.

Fields that change nothing here at all (``user``, ``store``, ``metadata``...) are not
listed: the request bodies declare them, and they are accepted as they are.
"""

from __future__ import annotations

from hetero_infer.server.serving.request_body import Unsupported

_NO = Unsupported()

# vLLM's sampling extras both completion routes share; the harmless values are vLLM's
# defaults (what a client that sends every field sends).
_SAMPLING = {
    "logits_processors": _NO,
    "kv_transfer_params": _NO,
    "vllm_xargs": _NO,
    "top_p_min": Unsupported((0.0, 0)),
    # SGLang's, which its cache-aware router (sglang-router: "Replicas behind a router"
    # in docs/deployment.md) fills into every body it forwards, at these defaults.
    "no_stop_trim": Unsupported((False,)),
    "return_hidden_states": Unsupported((False,)),
    "separate_reasoning": Unsupported((True,)),
    "stream_reasoning": Unsupported((True,)),
}

COMPLETION = {
    **_SAMPLING,
    "prompt_embeds": _NO,
}

CHAT = {
    **_SAMPLING,
    "functions": Unsupported(
        why="is OpenAI's deprecated form of tool calling: use 'tools' and 'tool_choice'"
    ),
    "function_call": Unsupported(
        why="is OpenAI's deprecated form of tool calling: use 'tools' and 'tool_choice'"
    ),
    "audio": _NO,
    "modalities": Unsupported((["text"],), "may only be ['text']"),
    "prediction": _NO,
    "web_search_options": _NO,
    "verbosity": _NO,
    # vLLM's chat template controls: the template is the server's (--chat-template).
    "documents": _NO,
    "chat_template": Unsupported(why="is not accepted: the server's template is used"),
    "media_io_kwargs": _NO,
}

EMBEDDING: dict[str, Unsupported] = {}

SCORE = {
    "mm_processor_kwargs": _NO,
    "activation": _NO,
    "use_activation": _NO,
    "softmax": _NO,
}

TOKENIZE = {
    "chat_template": Unsupported(why="is not accepted: the server's template is used"),
}
