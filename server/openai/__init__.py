"""The OpenAI family of routes: router, request bodies, completions, chat, logprobs, the
Responses API (its parts common to every family are in server/serving)."""
