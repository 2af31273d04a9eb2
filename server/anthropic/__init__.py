"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on the same engine
as the OpenAI routes: a request is translated into the serving layer's chat request (a
ChatPlan) and built as every chat is (serving/chat_run.py: template, tools, grammar,
parsers); only the body, the answer, the event stream and the error shape are
Anthropic's own."""
