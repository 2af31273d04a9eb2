"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on the same engine
as the OpenAI routes: a request is translated into a chat completion request and built
by the OpenAI chat route's code (template, tools, grammar, parsers); only the body, the
answer, the event stream and the error shape are Anthropic's own."""
