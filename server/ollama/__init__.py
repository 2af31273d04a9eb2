"""Ollama's native API (/api/*) on the same engine as the OpenAI routes."""
