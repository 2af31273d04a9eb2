"""LoRA adapters against the base model: decode throughput of a batch of 16 whose
requests use 8 different adapters (two each), and of a single stream on one adapter,
each against the same requests on the base model, in the same process.

    python -m bench.lora                        # SmolLM2 in bf16, rank 8, 5 rounds
    python -m bench.lora --rank 16 --rounds 7 --json out.json
    python -m bench.lora --modules q_proj,v_proj      # PEFT's default targets for Llama

The adapters are random, in PEFT's layout (adapter_config.json and
adapter_model.safetensors), on all seven projections of every layer (``--modules``). Two engines are
built: the base model's (LoRA off) and one with enable_lora and the adapters loaded.
Each round runs every case on both, the order alternating between rounds so that a
drift of the shared machine's load falls on both; a case's figure is generated tokens
per second over its whole generate() call (prefill included, ignore_eos). Reported per
case: the median and range of the rounds' tokens per second on each engine, and of the
rounds' ratios (LoRA / base). Results go to ``bench/results/lora.json`` by default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from bench.common import ab_summary, resolve_model, save_result

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(
    folder: Path, config: Any, rank: int, seed: int, modules: tuple[str, ...] = MODULES
) -> Path:
    """A random LoRA adapter on ``modules`` of every layer of ``config`` (a ModelConfig),
    saved in PEFT's layout."""
    from hetero_infer.engine.lora.adapter import expected_shape
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module in modules:
            in_features, out_features = expected_shape(config, module)
            part = "self_attn" if module in MODULES[:4] else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
            b = torch.randn(out_features, rank, generator=generator) * 0.01
            tensors[f"{key}.lora_A.weight"] = a
            tensors[f"{key}.lora_B.weight"] = b
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}
    adapter_config["target_modules"] = list(modules)
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder


def build_engine(model: str, dtype: str, lora: bool, max_loras: int, rank: int) -> Any:
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

    config = EngineConfig(
        model=model,
        dtype=dtype,
        max_num_seqs=16,
        max_model_len=1024,
        enable_prefix_caching=False,
        enable_lora=lora,
        max_loras=max_loras,
        max_lora_rank=max(rank, 16),
    )
    apply_process_settings(config)
    return LLMEngine(config)


def tokens_per_second(engine: Any, prompts: list[list[int]], loras: list, tokens: int) -> float:
    from hetero_infer.engine import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    kwargs = {"lora_request": loras} if any(loras) else {}
    started = time.perf_counter()
    outputs = engine.generate(prompts, params, use_tqdm=False, **kwargs)
    elapsed = time.perf_counter() - started
    return sum(len(o.token_ids) for o in outputs) / elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    base = build_engine(model, args.dtype, False, 1, args.rank)
    lora = build_engine(model, args.dtype, True, args.adapters, args.rank)
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for i in range(args.adapters):
            modules = tuple(args.modules.split(","))
            folder = write_adapter(Path(tmp) / f"a{i}", lora.model_config, args.rank, i, modules)
            lora.adapters.load(f"a{i}", str(folder))
            names.append(f"a{i}")
    vocab = lora.model_config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def prompt() -> list[int]:
        return torch.randint(3, vocab, (args.prompt_len,), generator=generator).tolist()

    batch = [prompt() for _ in range(16)]
    cases = {
        "batch16_8_adapters": (batch, [names[i % len(names)] for i in range(16)]),
        "single_stream": ([prompt()], [names[0]]),
    }
    rounds: dict[str, dict[str, list[float]]] = {c: {"base": [], "lora": []} for c in cases}
    for prompts, loras in cases.values():  # warm-up
        tokens_per_second(base, prompts, [None] * len(prompts), 4)
        tokens_per_second(lora, prompts, loras, 4)
    for number in range(args.rounds):
        for case, (prompts, loras) in cases.items():
            order = ("base", "lora") if number % 2 == 0 else ("lora", "base")
            for kind in order:
                if kind == "base":
                    speed = tokens_per_second(base, prompts, [None] * len(prompts), args.tokens)
                else:
                    speed = tokens_per_second(lora, prompts, loras, args.tokens)
                rounds[case][kind].append(speed)
    return {
        case: ab_summary(by_kind, "lora", "base", "tokens_per_second")
        for case, by_kind in rounds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument(
        "--modules", default=",".join(MODULES), help="the projections the adapters change"
    )
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="generated per request")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = run(args)
    for case, r in results.items():
        speeds, ratio = r["tokens_per_second"], r["ratio_lora_over_base"]
        print(
            f"{case}: base {speeds['base']['median']:.1f} tok/s, LoRA "
            f"{speeds['lora']['median']:.1f} tok/s; LoRA / base {ratio['median']:.3f} "
            f"({ratio['min']:.3f}-{ratio['max']:.3f})"
        )
    path = args.json or Path(__file__).parent / "results" / "lora.json"
    settings = {k: getattr(args, k) for k in ("model", "dtype", "rank", "adapters", "modules")}
    settings["rounds"] = args.rounds
    settings.update(prompt_len=args.prompt_len, tokens=args.tokens, threads=args.threads)
    from bench.throughput import machine_info

    save_result(path, settings, machine_info(), results)


if __name__ == "__main__":
    main()
