"""The engine's errors: one base, a class per kind of failure.

The names are both seed APIs' (Hetero-Paged-Infer's ``EngineError`` variants,
mini-infer's ``OutOfMemoryError`` / ``InvalidRequestError`` / ``ModelNotFoundError``).
Errors caused by what a caller passed in (a setting, a request, a model name) are also
``ValueError``s, so code written against ``ValueError`` keeps working; the server maps
each class to an OpenAI-shaped response in one place (server/errors.py).
"""

from __future__ import annotations


class EngineError(Exception):
    """Anything the engine refuses or fails at."""


class ConfigError(EngineError, ValueError):
    """An engine setting is invalid (a bad value, an unknown key, a bad config file)."""


class ModelNotFoundError(ConfigError):
    """The model (or tokenizer) named cannot be found or loaded."""


class ValidationError(EngineError, ValueError):
    """A request is invalid: its prompt, or one of its sampling parameters.

    ``param`` names the field, as OpenAI's error shape reports it: whoever raises it
    knows the field, so it is given, never read back out of the message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(ValidationError):
    """The prompt, with the tokens asked for, does not fit in the model's context."""


# mini-infer's name for the same error.
InvalidRequestError = ValidationError


class OutOfMemoryError(EngineError, MemoryError, ValueError):
    """Not enough KV cache (or device) memory for what was asked: a prompt larger than
    the whole cache, or settings whose cache cannot hold one full-length sequence. A
    ValueError too, since a smaller request or other settings fix it."""


class SchedulerError(EngineError, RuntimeError):
    """The scheduler cannot take the request now (its queue is full); retry later."""


class ExecutionError(EngineError, RuntimeError):
    """A model step failed (a device error, a bug): the engine cannot go on."""
