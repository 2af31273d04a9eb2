"""The OpenAI family of routes: router, request bodies, completions, chat, logprobs."""
