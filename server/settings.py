"""ServerSettings: the HTTP side's settings (the engine's are in EngineConfig)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.serving.reasoning import REASONING_PARSERS
from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The name the project's own examples send, answered by default beside the model's.
PROJECT_MODEL_NAME = "hetero-infer"
# vLLM's --limit-mm-per-prompt: the modalities it knows (this server reads images only)
# and its limit for a modality the flag leaves out.
MM_MODALITIES = ("image", "video", "audio")
DEFAULT_MM_LIMIT = 999


@dataclass(frozen=True)
class ServerSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    # The names clients may use in "model" (as vLLM's --served-model-name: the first is
    # the one responses report). Empty: the model path's last part and "hetero-infer".
    served_model_name: tuple[str, ...] | str = ()
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    # Requests accepted but not yet finished, beyond which new ones get 503.
    max_waiting_requests: int = 1024
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds in-flight requests get to finish after SIGTERM.
    shutdown_timeout: float = 30.0
    # Chat, as vLLM's flags: a Jinja template (a file, or the text itself) in place of
    # the tokenizer's; tool_choice "auto" (which needs a parser of the model's call
    # format); the parser of <think> reasoning.
    chat_template: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # The usage of chat and completions answers gives prompt_tokens_details (the prompt
    # tokens the prefix cache held), as vLLM's --enable-prompt-tokens-details.
    enable_prompt_tokens_details: bool = False
    # LoRA adapters loaded at start, as vLLM's --lora-modules: (name, folder) pairs
    # (needs the engine's enable_lora).
    lora_modules: tuple[tuple[str, str], ...] = ()
    # Images a request names by URL, as vLLM's flags: the only hosts an http(s) URL may
    # name, trusted even at a private address (empty: any host at a public address); the
    # folder file:// URLs may read under (None: none); a fetch's time limit (seconds, its
    # redirects included) and an image's size limit (a data URL's too), beyond which 413.
    allowed_media_domains: tuple[str, ...] | str = ()
    allowed_local_media_path: str | None = None
    media_fetch_timeout: float = 10.0
    max_image_bytes: int = 20 * 1024 * 1024
    # The most items of each modality one prompt may hold, as vLLM's --limit-mm-per-prompt
    # (a dict or its JSON, '{"image": 2}'); a modality left out gets DEFAULT_MM_LIMIT.
    limit_mm_per_prompt: dict[str, int] | str = field(default_factory=dict)
    # The template's text, read once from chat_template.
    chat_template_text: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        names = self.served_model_name
        if isinstance(names, str):
            names = tuple(n for n in names.replace(",", " ").split() if n)
        object.__setattr__(self, "served_model_name", tuple(names))
        domains = self.allowed_media_domains
        if isinstance(domains, str):
            domains = domains.replace(",", " ").split()
        object.__setattr__(self, "allowed_media_domains", tuple(d.lower() for d in domains))
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        for name in ("max_waiting_requests", "max_body_bytes", "max_image_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
        if not self.media_fetch_timeout > 0:
            raise ValueError("media_fetch_timeout must be > 0")
        folder = self.allowed_local_media_path
        if folder is not None and not Path(folder).is_dir():
            raise ValueError(f"allowed_local_media_path: {folder} is not a folder")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(TOOL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs a tool_call_parser")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                f"got {self.reasoning_parser!r}"
            )
        object.__setattr__(
            self, "limit_mm_per_prompt", parse_limit_mm_per_prompt(self.limit_mm_per_prompt)
        )
        if self.chat_template is not None:
            object.__setattr__(self, "chat_template_text", read_chat_template(self.chat_template))
        self._check_lora_modules()

    def _check_lora_modules(self) -> None:
        modules = self.lora_modules
        if isinstance(modules, str | list):
            modules = parse_lora_modules(modules.split() if isinstance(modules, str) else modules)
            object.__setattr__(self, "lora_modules", modules)
        if modules and not self.engine.enable_lora:
            raise ValueError("lora_modules needs --enable-lora")
        names = [name for name, _ in modules]
        for name in names:
            if names.count(name) > 1 or name in self.model_names:
                raise ValueError(f"lora_modules: the name {name!r} is given twice")

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name the server answers to, the reported one first."""
        if self.served_model_name:
            return self.served_model_name
        if self.engine.model is None:
            own = DEFAULT_MODEL_NAME
        else:
            own = self.engine.model.rstrip("/").split("/")[-1]
        return (own, PROJECT_MODEL_NAME) if own != PROJECT_MODEL_NAME else (own,)

    @property
    def model_name(self) -> str:
        """The name responses and metrics report."""
        return self.model_names[0]

    def redacted(self) -> dict:
        """The settings as a dict for the startup log, with secrets hidden."""
        values = {
            k: v for k, v in self.__dict__.items() if k not in ("engine", "chat_template_text")
        }
        values["api_key"] = "***" if self.api_key else None
        return {"server": values, "engine": self.engine.to_dict()}


def parse_limit_mm_per_prompt(value: Mapping[str, object] | str) -> dict[str, int]:
    """vLLM's --limit-mm-per-prompt (a JSON object, '{"image": 2}', or a dict): each
    modality's limit, a non-negative integer, every modality of MM_MODALITIES given one
    (DEFAULT_MM_LIMIT where the value leaves it out)."""
    name = "limit_mm_per_prompt"
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ValueError(f"{name}: {value!r} is not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f'{name}: expected a JSON object such as {{"image": 2}}, got {value!r}')
    limits = dict.fromkeys(MM_MODALITIES, DEFAULT_MM_LIMIT)
    for modality, limit in value.items():
        if modality not in MM_MODALITIES:
            raise ValueError(
                f"{name}: unknown modality {modality!r} (one of {', '.join(MM_MODALITIES)})"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"{name}: {modality}'s limit must be a non-negative integer, got {limit!r}"
            )
        limits[modality] = limit
    return limits


def parse_lora_modules(items: list[str]) -> tuple[tuple[str, str], ...]:
    """vLLM's --lora-modules values: ``name=path``, or a JSON object with "name" and
    "path" (its "base_model_name" is not needed: every adapter is on the one model)."""
    modules = []
    for item in items:
        if item.lstrip().startswith("{"):
            try:
                value = json.loads(item)
                modules.append((str(value["name"]), str(value["path"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"lora_modules: {item!r} is not a JSON object with name and path: {exc}"
                ) from None
            continue
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules: {item!r} is not name=path")
        modules.append((name, path))
    return tuple(modules)


def read_chat_template(value: str) -> str:
    """A chat template given as a file's path, or (as vLLM also takes it) as the Jinja
    text itself."""
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError as exc:  # a long template's text is no valid path
        if "{" not in value:
            raise ValueError(f"chat_template: cannot read {value}: {exc}") from exc
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"chat_template: no such file: {value}")
