"""The serving layer under every API family (server/openai, server/anthropic,
server/ollama): a request's context on its way to the engine (request_context.py); what
a request asks for, whichever family's body it came in: the sampling fields
(sampling_fields.py, guided_fields.py) and the chat request (chat_plan.py, with its
messages, tools and tool_use.py); its images, fetched under the rules on what a URL may
reach and decoded (chat_images.py, media_fetch.py, http_get.py, image_decode.py); a
chat request made an engine request (chat_run.py), and messages made a prompt where
nothing is generated (messages_prompt.py); the generic tool prompt for templates that
render no tools, and the parsing of a choice's output into reasoning, content and tool
calls (chat_output.py, reasoning.py, tool_parsers/). Each family translates its wire
format into and out of these, and no module here imports a family's."""
