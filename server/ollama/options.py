"""``options``: Ollama's per-request model parameters, and what each becomes here.

- Sampling options map onto the serving layer's sampling fields (sampling_fields.py):
  temperature, top_p, top_k, min_p, seed (a negative seed: a random draw, as Ollama),
  stop, repeat_penalty (vLLM's repetition_penalty over the prompt and the output, which
  is llama.cpp's with repeat_last_n -1), presence_penalty, frequency_penalty.
- num_predict is the output's limit (-1 and -2: what the context has left).
- Options that set how the model is loaded or run, not what it outputs (num_ctx,
  num_thread, num_gpu, ...), are accepted and change nothing: the engine's own
  settings hold. num_ctx larger than the server's context is clamped, as Ollama does.
- Samplers we do not have are accepted only at the value that turns them off
  (typical_p 1, tfs_z 1, mirostat 0); repeat_last_n is honoured as -1 (everything)
  and 0 (no penalty); penalize_newline false only without a repeat penalty.
Any other key is refused with a 400 naming it: a client must never get silently
different output.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

# Ollama's option -> the sampling field (sampling_fields.py) it sets.
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# Loading and runtime settings: they change speed and memory, never the output.
INERT = {
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "num_thread", "numa", "num_keep",
    "embedding_only",
}  # fmt: skip
# Samplers we do not have: the value that turns each off (mirostat's tau and eta only
# matter with mirostat on).
OFF_VALUES = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
KNOWN = {
    *SAMPLING_FIELDS, *INERT, *OFF_VALUES, "num_predict", "repeat_last_n",
    "penalize_newline", "mirostat_tau", "mirostat_eta",
}  # fmt: skip


class OllamaOptions(BaseModel):
    """The options a request may set; each is typed so that a wrong type is a 400
    naming ``options.<key>``."""

    model_config = ConfigDict(extra="allow")

    num_predict: int | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_last_n: int | None = None
    penalize_newline: StrictBool | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    low_vram: StrictBool | None = None
    f16_kv: StrictBool | None = None
    logits_all: StrictBool | None = None
    vocab_only: StrictBool | None = None
    use_mmap: StrictBool | None = None
    use_mlock: StrictBool | None = None
    numa: StrictBool | None = None
    embedding_only: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in KNOWN)
            if unknown:
                shown = ", ".join(repr(key[:64]) for key in unknown[:8])
                raise ValueError(f"unknown option(s) {shown}")
        return data

    @model_validator(mode="after")
    def _off_samplers(self) -> OllamaOptions:
        for name, off in OFF_VALUES.items():
            value = getattr(self, name)
            if value is not None and value != off:
                raise ValueError(f"{name} {value} is not supported (only {off}: off)")
        if self.num_predict is not None and (self.num_predict == 0 or self.num_predict < -2):
            raise ValueError("num_predict must be -1 or -2 (no limit) or a positive count")
        penalized = self.repeat_penalty not in (None, 1.0) and self.repeat_last_n != 0
        if penalized and self.repeat_last_n not in (None, -1):
            raise ValueError(
                f"repeat_last_n {self.repeat_last_n} is not supported with a repeat_penalty: "
                "the penalty covers the whole prompt and output (-1), or none (0)"
            )
        if penalized and self.penalize_newline is False:
            raise ValueError("penalize_newline false is not supported with a repeat_penalty")
        return self

    def sampling_fields(self) -> dict[str, Any]:
        """The set sampling options, as the serving layer's sampling fields."""
        fields = {}
        for option, field in SAMPLING_FIELDS.items():
            value = getattr(self, option)
            if value is not None:
                fields[field] = value
        if fields.get("seed", 0) < 0:
            del fields["seed"]  # Ollama's -1: a random draw
        if self.repeat_last_n == 0:
            fields.pop("repetition_penalty", None)  # llama.cpp's 0: no penalty
        return fields

    def max_tokens(self) -> int | None:
        """num_predict as a limit; None: what the context has left."""
        return self.num_predict if self.num_predict is not None and self.num_predict > 0 else None


def option_name(field: str) -> str:
    """The Ollama option a sampling field came from."""
    reverse = {field: option for option, field in SAMPLING_FIELDS.items()}
    return reverse.get(field, field)
