"""The vision encoder in bf16 at a real model's size: SmolVLM-256M's SigLIP tower (768
wide, 12 heads, 512-pixel tiles of 16-pixel patches: 1024 patches a tile) and its
connector, on random weights, against transformers' own Idefics3 tower on the same
weights and threads.

    python -m bench.vision_encoder                 # 2 layers, 4 tiles, 10 rounds
    python -m bench.vision_encoder --layers 12 --tiles 1 --rounds 5

Four sides encode the same tiles, in interleaved rounds (the order rotating, so that
drift falls on all): transformers (``get_image_features``), the engine's tower with
torch's F.linear and GELU in place of the kernels (``KernelOps()``, as it ran before it
took the text model's kernels), and the engine's tower on the kernels the
engine selects for this CPU (``select_kernels``: the C++ GELU, and the projections on
our AMX or AVX-512 bf16 kernel, packed), with the projections' kernel as the engine's
default has it (``cpu_linear_kernel="kernel"``: ours at every row count) and as measured
on this CPU (``"measure"``: ours or oneDNN's by rows, kernels/linear_choice.py).
Reported: each side's median time and range, the speed-ups over transformers, and how
far each side's features are from transformers' (relative to their spread). Results go
to ``bench/results/vision-encoder-<cpu>.json`` by default.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, apply_engine_thread_settings, save_result, spread

# The server's OpenMP wait policy must be in the environment before torch loads.
apply_engine_thread_settings()

import torch  # noqa: E402
import transformers  # noqa: E402

# SmolVLM-256M-Instruct's vision side (its config.json), and a text model just wide
# enough for the connector's output: the text model is not run here.
VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "image_size": 512,
    "patch_size": 16,
}
SCALE_FACTOR = 4
TEXT_HIDDEN = 576


def hf_model(layers: int, image_size: int) -> transformers.Idefics3ForConditionalGeneration:
    vision = transformers.Idefics3VisionConfig(
        **{**VISION, "image_size": image_size}, num_hidden_layers=layers
    )
    text = transformers.LlamaConfig(
        hidden_size=TEXT_HIDDEN,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=256,
    )
    config = transformers.Idefics3Config(
        vision_config=vision, text_config=text, scale_factor=SCALE_FACTOR
    )
    torch.manual_seed(0)
    return transformers.Idefics3ForConditionalGeneration(config).to(torch.bfloat16).eval()


def engine_tower(model: transformers.PreTrainedModel, ops: Any) -> Any:
    from hetero_infer.engine.models.idefics3_vision import Idefics3Vision

    with torch.device("meta"):  # as the engine builds it: no memory until loaded
        tower = Idefics3Vision.from_hf(model.config.to_dict(), ops)
    tower.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()})
    return tower


def with_rounds(values: list[float]) -> dict[str, Any]:
    return {**spread(values), "rounds": values}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hetero_infer.engine.entrypoints.process_settings import apply_process_settings
    from hetero_infer.engine.settings.config import EngineConfig
    from hetero_infer.kernels import KernelOps, select_kernels
    from hetero_infer.kernels.linear_choice import LinearChooser

    torch.set_num_threads(args.threads)
    apply_process_settings(EngineConfig())
    model = hf_model(args.layers, args.image_size)
    cpu = torch.device("cpu")
    kernels = select_kernels("auto", cpu)
    measured = select_kernels("auto", cpu, linear_chooser=LinearChooser("measure", None))
    sides = {
        "transformers": lambda tiles: model.model.get_image_features(
            pixel_values=tiles[None]
        ).pooler_output[0],
        "engine_torch_linear": engine_tower(model, KernelOps()).encode,
        "engine_kernels": engine_tower(model, kernels.ops).encode,
        "engine_kernels_measured": engine_tower(model, measured.ops).encode,
    }
    size = args.image_size
    generator = torch.Generator().manual_seed(1)
    tiles = (torch.rand(args.tiles, 3, size, size, generator=generator) * 2 - 1).bfloat16()
    times: dict[str, list[float]] = {name: [] for name in sides}
    features = {}
    with torch.inference_mode():
        for name, encode in sides.items():  # warm-up, and each side's features
            features[name] = encode(tiles).float()
        names = list(sides)
        for number in range(args.rounds):
            for name in names[number % len(names) :] + names[: number % len(names)]:
                started = time.perf_counter()
                sides[name](tiles)
                times[name].append(time.perf_counter() - started)
    reference = features["transformers"]
    scale = reference.std().item()
    return {
        "seconds": {name: with_rounds(t) for name, t in times.items()},
        "speedup_over_transformers": {
            name: with_rounds([h / e for h, e in zip(times["transformers"], t, strict=True)])
            for name, t in times.items()
            if name != "transformers"
        },
        "max_difference_from_transformers_over_its_std": {
            name: (f - reference).abs().max().item() / scale
            for name, f in features.items()
            if name != "transformers"
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--layers", type=int, default=2, help="of the tower (SmolVLM: 12)")
    parser.add_argument("--tiles", type=int, default=4, help="encoded at once")
    parser.add_argument(
        "--image-size",
        type=int,
        default=VISION["image_size"],
        help="a tile's side in pixels, a multiple of 64 (SmolVLM: 512)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from bench.gpu_check import device_slug
    from bench.throughput import machine_info

    results = run(args)
    for name, seconds in results["seconds"].items():
        print(
            f"{name}: {seconds['median'] * 1e3:.1f} ms "
            f"({seconds['min'] * 1e3:.1f}-{seconds['max'] * 1e3:.1f})"
        )
    for name, speedup in results["speedup_over_transformers"].items():
        print(
            f"{name}: {speedup['median']:.2f}x transformers "
            f"({speedup['min']:.2f}-{speedup['max']:.2f})"
        )
    machine = machine_info()
    path = args.json or RESULTS_DIR / f"vision-encoder-{device_slug(machine['cpu'])}.json"
    settings = {
        **{k: getattr(args, k) for k in ("rounds", "threads", "layers", "tiles", "image_size")},
        "model": "SmolVLM-256M's vision tower and connector (random weights), bf16",
        "vision_config": VISION,
        "scale_factor": SCALE_FACTOR,
    }
    save_result(path, settings, machine, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
