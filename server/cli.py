"""`hetero-infer`: the server, and one-shot generation from the command line.

    hetero-infer serve --port 8000 --api-key secret     (also: hetero-infer --serve)
    hetero-infer serve ./my-model-folder                (the model, as `vllm serve MODEL`)
    hetero-infer --input "Hello" --max-tokens 50
    hetero-infer --input "What is the capital of France? Answer with one word." --chat
    hetero-infer tune --model ./my-bf16-model-folder     (server/tune.py)

Settings come from flags, then HETERO_* environment variables (HETERO_PORT,
HETERO_API_KEY, HETERO_MAX_NUM_SEQS, ...), then LeaderWorkerSet's (LWS_GROUP_SIZE,
LWS_WORKER_INDEX, LWS_LEADER_ADDRESS: the node settings), then the --config file,
then defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.entrypoints.process_settings import (
    apply_process_settings,
    set_openmp_wait_policy,
)
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.seed_layout import read_section
from hetero_infer.server.launchers import (
    lws_settings,
    run_other_node,
    run_torchrun_worker,
    under_torchrun,
)
from hetero_infer.server.listen import bind_socket
from hetero_infer.server.settings import ServerSettings

ENV_PREFIX = "HETERO_"


def json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object (e.g. --override-generation-config '{"temperature": 0.5}')."""
    value = json.loads(text)  # a JSONDecodeError is a ValueError
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


@dataclass(frozen=True)
class EngineSetting:
    """One EngineConfig field on the command line: ``--name-with-dashes`` and
    HETERO_NAME, parsed by ``parse``, documented by the field's help text."""

    name: str
    parse: Callable[[str], Any]
    help: str
    serving: bool = False  # the server's only (see engine.config.setting)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# The seed's names for two limits (EngineConfig's InitVars), kept as flags too.
SEED_ALIAS_SETTINGS = (
    EngineSetting("max_total_tokens", int, "the seed's name for max_num_batched_tokens"),
    EngineSetting("max_batch_size", int, "the seed's cap on max_num_seqs"),
)


def engine_settings() -> list[EngineSetting]:
    """Every EngineConfig field as a flag and a variable, in the fields' order, typed
    by the field's annotation (a field's allowed values are listed in its help)."""
    hints = typing.get_type_hints(EngineConfig)
    settings = []
    for f in dataclasses.fields(EngineConfig):
        help_text = f.metadata["help"]
        if "choices" in f.metadata:
            help_text += f" ({', '.join(f.metadata['choices'])})"
        parse = _parser_for(hints[f.name])
        settings.append(EngineSetting(f.name, parse, help_text, f.metadata["serving"]))
    return settings + list(SEED_ALIAS_SETTINGS)


def _parser_for(annotation: Any) -> Callable[[str], Any]:
    """The text parser for a field of this type (``X | None``: X's)."""
    kinds = [k for k in typing.get_args(annotation) if k is not type(None)] or [annotation]
    kind = typing.get_origin(kinds[0]) or kinds[0]
    return {bool: _parse_bool, int: int, float: float, str: str, dict: json_object}[kind]


def add_engine_flags(parser: argparse.ArgumentParser, serving: bool) -> None:
    """The engine's flags; ``serving``: those of how requests are served too."""
    parser.add_argument("--config", "-c", help="JSON file of engine settings (e.g. config.json)")
    for setting in engine_settings():
        if setting.serving and not serving:
            continue
        if setting.parse is _parse_bool:  # --enforce-eager, or --enforce-eager false
            parser.add_argument(
                setting.flag, dest=setting.name, type=_parse_bool, nargs="?", const=True,
                help=setting.help,
            )  # fmt: skip
        else:
            parser.add_argument(
                setting.flag, dest=setting.name, type=setting.parse, help=setting.help
            )


def engine_config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> EngineConfig:
    flags = [(s.name, s.parse) for s in engine_settings()]
    # LeaderWorkerSet's variables under HETERO_*'s, as the flags are over both.
    overrides = lws_settings(environ) | _from_env(flags, environ)
    given = {n: getattr(args, n, None) for n, _ in flags}
    overrides.update({n: v for n, v in given.items() if v is not None})
    if (positional := getattr(args, "model_tag", None)) is not None:
        if args.model is not None and args.model != positional:
            raise ValueError(
                f"the model is given twice, as {positional!r} and as --model {args.model!r}: "
                "give it once"
            )
        overrides["model"] = positional
    config_file = _config_file(args, environ)
    if config_file:
        return EngineConfig.from_file(config_file, **overrides)
    return EngineConfig.from_dict(overrides, "flags")


def _config_file(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    return args.config or environ.get(f"{ENV_PREFIX}CONFIG")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _from_env(fields: list[tuple[str, type]], environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, kind in fields:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        try:
            values[name] = kind(raw)
        except ValueError as exc:
            raise ValueError(f"{ENV_PREFIX}{name.upper()}: {exc}") from exc
    return values


# The seed's config.json "serving" keys -> ServerSettings fields.
SEED_SERVING_KEYS = {"host": "host", "port": "port", "model_name": "served_model_name"}

# Server flags: (flag, ServerSettings field, type).
SERVER_FLAGS: list[tuple[str, str, type]] = [
    ("--host", "host", str),
    ("--port", "port", int),
    ("--api-key", "api_key", str),
    ("--allowed-origins", "allowed_origins", str),
    ("--max-waiting-requests", "max_waiting_requests", int),
    ("--max-body-bytes", "max_body_bytes", int),
    ("--shutdown-timeout", "shutdown_timeout", float),
    ("--chat-template", "chat_template", str),
    ("--tool-call-parser", "tool_call_parser", str),
    ("--reasoning-parser", "reasoning_parser", str),
]
# Images in requests, as vLLM's flags: (flag, ServerSettings field, type, help).
MEDIA_FLAGS: list[tuple[str, str, type, str]] = [
    ("--allowed-local-media-path", "allowed_local_media_path", str,
     "a folder whose files requests may name as file:// image URLs (default: none may)"),
    ("--media-fetch-timeout", "media_fetch_timeout", float,
     "seconds an image URL's fetch may take, redirects included (default: 10)"),
    ("--max-image-bytes", "max_image_bytes", int,
     "the largest image a request may send or name, in bytes (default: 20 MiB; beyond: 413)"),
    ("--limit-mm-per-prompt", "limit_mm_per_prompt", str,
     'the most images a prompt may hold, as vLLM\'s JSON \'{"image": 2}\' ("video" and '
     '"audio" are taken too; default: 999 each; beyond: 400)'),
]  # fmt: skip


def build_serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-infer serve", description="Serve the OpenAI-compatible API."
    )
    parser.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="the model, as `vllm serve MODEL` (or --model): a folder, a .gguf file or a "
        "hub id; none: the embedded SmolLM2",
    )
    for flag, name, kind in SERVER_FLAGS:
        parser.add_argument(flag, dest=name, type=kind)
    for flag, name, kind, help_text in MEDIA_FLAGS:
        parser.add_argument(flag, dest=name, type=kind, help=help_text)
    parser.add_argument(
        "--allowed-media-domains",
        nargs="+",
        help="the only hosts image URLs may name, fetched even at private addresses "
        "(default: any host at a public address)",
    )
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        help="names the model answers to in requests; the first is reported (default: the "
        "model's name and hetero-infer)",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=None,
        help='allow tool_choice "auto": the model\'s calls are read by --tool-call-parser',
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        default=None,
        help="give usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix "
        "cache held",
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        help="LoRA adapters to load at start, as vLLM's: name=path or JSON "
        '\'{"name": ..., "path": ...}\' (needs --enable-lora)',
    )
    parser.add_argument("--log-level", default="INFO")
    add_engine_flags(parser, serving=True)
    return parser


def server_settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> ServerSettings:
    flags = [(name, kind) for _, name, kind in SERVER_FLAGS]
    flags += [("served_model_name", str), ("enable_auto_tool_choice", _parse_bool)]
    flags += [("enable_prompt_tokens_details", _parse_bool)]
    flags += [("lora_modules", str)]  # HETERO_LORA_MODULES: name=path, split by spaces
    flags += [(name, kind) for _, name, kind, _ in MEDIA_FLAGS]
    flags += [("allowed_media_domains", str)]  # HETERO_ALLOWED_MEDIA_DOMAINS: by commas
    engine = engine_config_from_args(args, environ)
    values: dict[str, Any] = {}
    if config_file := _config_file(args, environ):
        # The seed's config.json layout: {"serving": {"host", "port", "model_name"}}.
        serving = read_section(config_file, "serving")
        if set(serving) - set(SEED_SERVING_KEYS):
            raise ValueError(f"{config_file}: serving takes {', '.join(SEED_SERVING_KEYS)}")
        values.update({SEED_SERVING_KEYS[k]: v for k, v in serving.items() if v is not None})
    values.update(_from_env(flags, environ))  # HETERO_SERVED_MODEL_NAME: names split by commas
    values.update({n: getattr(args, n) for n, _ in flags if getattr(args, n) is not None})
    if isinstance(values.get("allowed_origins"), str):
        origins = values["allowed_origins"].split(",")
        values["allowed_origins"] = tuple(o.strip() for o in origins if o.strip())
    return ServerSettings(engine=engine, **values)


def serve_main(argv: list[str]) -> int:
    args = build_serve_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = server_settings_from_args(args)
        engine_config, rank = under_torchrun(settings.engine)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rank > 0:
        return run_torchrun_worker(engine_config)
    if engine_config.node_rank > 0:  # its ranks only: the server runs on node 0
        return run_other_node(engine_config, settings.shutdown_timeout)
    settings = dataclasses.replace(settings, engine=engine_config)
    try:
        listener = bind_socket(settings.host, settings.port)
    except OSError as exc:
        where = f"{settings.host}:{settings.port}"
        print(f"error: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    apply_process_settings(settings.engine)
    from hetero_infer.server.serve import serve  # uvicorn (and torch) are only needed here

    return serve(settings, listener)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-infer", description="Generate text with Hetero-Paged-Infer."
    )
    parser.add_argument("--input", "-i", required=True, help="the prompt")
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--log-level", default="WARNING")
    add_engine_flags(parser, serving=False)
    return parser


def tune_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="hetero-infer tune", description="time and keep a model's kernel choices"
    )
    add_engine_flags(parser, serving=False)
    try:
        config = engine_config_from_args(parser.parse_args(argv))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from hetero_infer.server.tune import tune  # loads torch

    return tune(config)


def main(argv: list[str] | None = None) -> int:
    # Nothing imported so far loads torch: what must precede it goes first.
    set_openmp_wait_policy()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"] or "--serve" in argv:
        return serve_main([a for a in argv if a not in ("serve", "--serve")])
    if argv[:1] == ["tune"]:
        return tune_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        config, rank = under_torchrun(engine_config_from_args(args))
        if rank > 0:
            return run_torchrun_worker(config)
        if config.node_rank > 0:  # node 0's one-shot run stops the group: no drain
            return run_other_node(config, drain_seconds=0.0)
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed=args.seed,
        )
        apply_process_settings(config)
        from hetero_infer.engine.entrypoints.llm_engine import LLMEngine

        started = time.monotonic()
        engine = LLMEngine(config)
        load_time = time.monotonic() - started
        prompt: str | list[int] = args.input
        try:
            if args.chat:
                messages = [{"role": "user", "content": args.input}]
                prompt = engine.tokenizer.apply_chat_template(messages)
            output = engine.generate(prompt, params, use_tqdm=False)[0]
        finally:
            engine.shutdown()  # the other tensor-parallel ranks, if any, leave too
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stats = {
        "prompt_tokens": len(output.prompt_token_ids),
        "completion_tokens": len(output.token_ids),
        "finish_reason": output.finish_reason,
        "load_seconds": round(load_time, 2),
        "time_to_first_token": round(output.metrics.time_to_first_token or 0.0, 3),
        "latency_seconds": round(output.metrics.latency or 0.0, 3),
        "tokens_per_second": round(len(output.token_ids) / (output.metrics.latency or 1e-9), 1),
    }
    if args.json:
        print(json.dumps({"text": output.text, **stats}))
    else:
        print(output.text)
        print("--", ", ".join(f"{k}: {v}" for k, v in stats.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
