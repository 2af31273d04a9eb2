"""Image input: time to first token with one image against transformers' ``generate``,
a second question about the same image against the first, and 8 users each sending an
image at once, on SmolVLM's architecture (Idefics3) in fp32.

    python -m bench.vision                        # the tiny random checkpoint, 10 rounds
    python -m bench.vision --rounds 5 --threads 1 --input decoded --json out.json

The checkpoint is tests/tiny_models.py's tiny random Idefics3 (a SigLIP tower of 2
layers, a Llama of 2 layers, 64-pixel tiles), built into a temporary folder. Both
sides run in this process on the same ``--threads`` torch threads, the server's OpenMP
and malloc settings applied (the engine's, which transformers then shares).

A time to first token covers all the work from a chat and its image to one greedy
token, so both sides count the same steps. The image comes (``--input``) as a client
sends it to the server, a file's bytes (``jpeg``, the default, or ``png``), or decoded
already, as a Python caller may hand it over (``decoded``: a PIL image). On the engine:
the chat template, the image as the server takes a request's
(``chat_images.prepared_image``: the bytes' digest, then decoding, hashing and
preprocessing, or the recent image those bytes gave; a decoded image is hashed and
preprocessed, or found by its hash) and placeholder expansion
(``InputProcessor.with_images``), then ``add_processed`` and ``step`` until the
one-token request is done. On transformers: the file decoded with PIL, the processor
call (template text and image) and ``generate(max_new_tokens=1, do_sample=False)``.
The engine's time is also split into its preparation (template and image) and its
steps.

Per round, the order of the two sides alternating (drift falls on both):

- first question: a fresh random ``--width`` x ``--height`` image each round and side
  (its own seed), so that neither the prefix cache nor the encoder cache can hit;
- second question: right after the engine's first, the chat so far (the same image,
  the question, the one-token answer) and a new question, which hits the prefix cache
  up to the new text, and the recent images on the file's bytes (a chat client sends
  them again each turn) or on the decoded pixels' hash; its ratio to the first is the
  figure. Transformers' second question (no cache kept between calls) is beside it;
- 8 users: 8 chats, each with its own fresh image, all added to the engine before it
  steps, against transformers' ``generate`` on the 8 as one left-padded batch and as
  8 calls one after another; wall time to all 8 first tokens.

Reported: each round's figures, each series' median and range, and the ratios
(transformers / engine for speed-ups, second / first for the cache); the engine's
first token is checked against transformers' on the first question. Results go to
``bench/results/vision-<cpu>-<input>.json`` by default.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, apply_engine_thread_settings, save_result, spread

# The server's OpenMP wait policy must be in the environment before torch loads.
apply_engine_thread_settings()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

FIRST_QUESTION = "What is in this picture?"
SECOND_QUESTION = "And what colour is it mostly?"
EOS = 2  # the tiny tokenizer's end of sequence
USERS = 8
REQUEST_IDS = itertools.count()
# How each image file is written: JPEG at a camera's usual quality.
FILE_FORMATS: dict[str, dict[str, Any]] = {"jpeg": {"quality": 90}, "png": {}}
INPUTS = (*FILE_FORMATS, "decoded")
# Where the image part sits in the request, as the server names it in errors.
IMAGE_PARAM = "messages.0.content.0"


def noise_image(seed: int, width: int, height: int, kind: str) -> bytes | Image.Image:
    """A random image as ``kind`` of INPUTS (a file's bytes, or decoded from a JPEG):
    its pixels differ by seed, so no cache keyed on content or bytes hits."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    file_format = "jpeg" if kind == "decoded" else kind
    Image.fromarray(pixels).save(out, format=file_format, **FILE_FORMATS[file_format])
    return decoded(out.getvalue()) if kind == "decoded" else out.getvalue()


def decoded(image: bytes | Image.Image) -> Image.Image:
    """The image as a PIL image in RGB, as transformers' users decode a file."""
    return image if isinstance(image, Image.Image) else Image.open(io.BytesIO(image)).convert("RGB")


def first_chat() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": FIRST_QUESTION}]}
    ]


def second_chat(answer: str) -> list[dict[str, Any]]:
    return first_chat() + [
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": [{"type": "text", "text": SECOND_QUESTION}]},
    ]


# ---- the engine ----


class EngineSide:
    def __init__(self, folder: Path) -> None:
        from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

        config = EngineConfig(model=str(folder), dtype="float32")
        apply_process_settings(config)
        self.engine = LLMEngine(config)

    def prompt(self, chat: list[dict[str, Any]], image: bytes | Image.Image) -> Any:
        """The prompt as the server makes it: the chat template, then the image (a
        file's bytes as the server prepares a request's, or a decoded image)."""
        from hetero_infer.server.serving.chat_images import prepared_image

        processor = self.engine.input_processor
        token_ids = self.engine.tokenizer.apply_chat_template(chat, True)
        if isinstance(image, bytes):
            image = prepared_image(processor.image_prompts, image, IMAGE_PARAM)
        return processor.with_images(processor.tokenize(token_ids), [image])

    def first_tokens(self, prompts: list[Any]) -> list[int]:
        """Every prompt added, then steps until all have their one greedy token."""
        from hetero_infer.engine import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0)
        processor = self.engine.input_processor
        ids = [
            self.engine.add_processed(processor.request(f"v{next(REQUEST_IDS)}", p, params))
            for p in prompts
        ]
        while self.engine.has_pending_work():
            self.engine.step()
        return [self.engine.get_output(i).token_ids[0] for i in ids]

    def ttft(self, chat: list[dict[str, Any]], image: bytes | Image.Image) -> dict[str, Any]:
        hits_before = self.engine.memory_stats()["prefix_cache_hits"]
        started = time.perf_counter()
        prompt = self.prompt(chat, image)
        prepared = time.perf_counter()
        (token,) = self.first_tokens([prompt])
        done = time.perf_counter()
        return {
            "ttft_s": done - started,
            "prepare_s": prepared - started,
            "steps_s": done - prepared,
            "prompt_tokens": len(prompt.token_ids),
            "prefix_cache_hit_tokens": self.engine.memory_stats()["prefix_cache_hits"]
            - hits_before,
            "token": token,
        }

    def users(self, images: list[Any]) -> tuple[float, float]:
        """(wall time to all first tokens, the part of it spent preparing prompts)."""
        started = time.perf_counter()
        prompts = [self.prompt(first_chat(), image) for image in images]
        prepared = time.perf_counter()
        self.first_tokens(prompts)
        return time.perf_counter() - started, prepared - started

    def decode(self, token: int) -> str:
        return self.engine.tokenizer.decode([token])


# ---- transformers ----


class TransformersSide:
    def __init__(self, folder: Path) -> None:
        self.processor = transformers.AutoProcessor.from_pretrained(folder)
        # Left padding: a batch's prompts must end where generation starts.
        self.processor.tokenizer.padding_side = "left"
        if self.processor.tokenizer.pad_token is None:  # the tiny tokenizer names none
            self.processor.tokenizer.pad_token_id = EOS
        self.model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32
        ).eval()

    def first_tokens(self, chats: list[list[dict[str, Any]]], images: list[Any]) -> list:
        pictures = [decoded(image) for image in images]
        texts = [self.processor.apply_chat_template(c, add_generation_prompt=True) for c in chats]
        # The template writes the BOS: no special tokens of the tokenizer's own.
        inputs = self.processor(
            text=texts,
            images=[[picture] for picture in pictures],
            return_tensors="pt",
            padding=len(texts) > 1,
            add_special_tokens=False,
        )
        with torch.inference_mode():
            out = self.model.generate(
                **inputs, max_new_tokens=1, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
            )
        return out[:, -1].tolist()

    def ttft(self, chat: list[dict[str, Any]], image: bytes | Image.Image) -> dict[str, Any]:
        started = time.perf_counter()
        (token,) = self.first_tokens([chat], [image])
        return {"ttft_s": time.perf_counter() - started, "token": token}

    def users_batched(self, images: list[Any]) -> float:
        started = time.perf_counter()
        self.first_tokens([first_chat()] * len(images), images)
        return time.perf_counter() - started

    def users_sequential(self, images: list[Any]) -> float:
        started = time.perf_counter()
        for image in images:
            self.first_tokens([first_chat()], [image])
        return time.perf_counter() - started


# ---- the rounds ----


def with_spread(values: list[float]) -> dict[str, Any]:
    return {**spread(values), "rounds": values}


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    engine, hf = EngineSide(folder), TransformersSide(folder)
    seeds = itertools.count(1000)

    def image() -> bytes | Image.Image:
        return noise_image(next(seeds), args.width, args.height, args.input)

    # Warm-up: first calls pay for allocations and lazy set-up that later ones do not.
    for _ in range(2):
        warm = image()
        first = engine.ttft(first_chat(), warm)
        engine.ttft(second_chat(engine.decode(first["token"])), warm)
        hf.ttft(first_chat(), warm)
    engine.users([image() for _ in range(USERS)])
    hf.users_batched([image() for _ in range(USERS)])

    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        engine_first = number % 2 == 0
        record: dict[str, Any] = {"round": number, "engine_first": engine_first}
        # First and second question: the engine's pair stays back to back, as a chat's.
        for side in ("engine", "transformers") if engine_first else ("transformers", "engine"):
            shown = image()
            if side == "engine":
                first = engine.ttft(first_chat(), shown)
                second = engine.ttft(second_chat(engine.decode(first["token"])), shown)
                record["engine_first_question"] = first
                record["engine_second_question"] = second
                record["engine_reference_token"] = hf.ttft(first_chat(), shown)["token"]
            else:
                first = hf.ttft(first_chat(), shown)
                answer = engine.decode(first["token"])
                record["transformers_first_question"] = first
                record["transformers_second_question"] = hf.ttft(second_chat(answer), shown)
        order = ("engine", "batched", "sequential")
        for side in order if engine_first else order[::-1]:
            images = [image() for _ in range(USERS)]
            if side == "engine":
                wall, prepare = engine.users(images)
                record["engine_8_users_s"], record["engine_8_users_prepare_s"] = wall, prepare
            elif side == "batched":
                record["transformers_8_users_batched_s"] = hf.users_batched(images)
            else:
                record["transformers_8_users_sequential_s"] = hf.users_sequential(images)
        rounds.append(record)
        e1, e2 = record["engine_first_question"], record["engine_second_question"]
        h1 = record["transformers_first_question"]
        print(
            f"round {number}: first question engine {e1['ttft_s'] * 1e3:.1f} ms "
            f"(prepare {e1['prepare_s'] * 1e3:.1f}), transformers {h1['ttft_s'] * 1e3:.1f} ms; "
            f"second {e2['ttft_s'] * 1e3:.1f} ms ({e2['ttft_s'] / e1['ttft_s']:.2f}x); "
            f"8 users engine {record['engine_8_users_s'] * 1e3:.0f} ms, transformers "
            f"{record['transformers_8_users_batched_s'] * 1e3:.0f} ms batched, "
            f"{record['transformers_8_users_sequential_s'] * 1e3:.0f} ms sequential"
        )
    return summarize(rounds)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def series(key: str, field: str | None = None) -> list[float]:
        return [r[key][field] if field else r[key] for r in rounds]

    def ratio(a: list[float], b: list[float]) -> dict[str, Any]:
        return with_spread([x / y for x, y in zip(a, b, strict=True)])

    def question(which: str, engine: list[float]) -> dict[str, Any]:
        """One question's times: the engine's (whole, preparing, stepping), transformers'."""
        return {
            "engine": with_spread(engine),
            "engine_prepare": with_spread(series(f"engine_{which}_question", "prepare_s")),
            "engine_steps": with_spread(series(f"engine_{which}_question", "steps_s")),
            "transformers": with_spread(series(f"transformers_{which}_question", "ttft_s")),
        }

    e1, e2 = series("engine_first_question", "ttft_s"), series("engine_second_question", "ttft_s")
    h1 = series("transformers_first_question", "ttft_s")
    e8, h8b = series("engine_8_users_s"), series("transformers_8_users_batched_s")
    h8s = series("transformers_8_users_sequential_s")
    return {
        "first_question_ttft_s": {
            **question("first", e1),
            "speedup_transformers_over_engine": ratio(h1, e1),
            "same_first_token_as_transformers": all(
                r["engine_first_question"]["token"] == r["engine_reference_token"] for r in rounds
            ),
        },
        "second_question_ttft_s": {
            **question("second", e2),
            "ratio_engine_second_over_first": ratio(e2, e1),
            "engine_cached_fraction": with_spread(
                [
                    r["engine_second_question"]["prefix_cache_hit_tokens"]
                    / r["engine_second_question"]["prompt_tokens"]
                    for r in rounds
                ]
            ),
        },
        "users_8_wall_s": {
            "engine": with_spread(e8),
            "engine_prepare": with_spread(series("engine_8_users_prepare_s")),
            "transformers_batched": with_spread(h8b),
            "transformers_sequential": with_spread(h8s),
            "speedup_transformers_batched_over_engine": ratio(h8b, e8),
            "speedup_transformers_sequential_over_engine": ratio(h8s, e8),
        },
        "prompt_tokens": {
            "first_question": rounds[0]["engine_first_question"]["prompt_tokens"],
            "second_question": rounds[0]["engine_second_question"]["prompt_tokens"],
        },
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--width", type=int, default=640, help="of each image, in pixels")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--input", choices=INPUTS, default="jpeg", help="how images come")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    # tests/ is a sibling of bench/ in the repository, not an installed package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.gpu_check import device_slug
    from bench.throughput import machine_info
    from tests.tiny_models import save_tiny_idefics3

    # The load others put on the machine: a shared CPU slows both sides, and its
    # spinning OpenMP threads more than a quiet one's.
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        folder = save_tiny_idefics3(Path(tmp) / "idefics3")
        results = run(args, folder)
    load_after = os.getloadavg()
    first, second = results["first_question_ttft_s"], results["second_question_ttft_s"]
    users = results["users_8_wall_s"]
    speedup, ratio = (
        first["speedup_transformers_over_engine"],
        second["ratio_engine_second_over_first"],
    )
    print(
        f"first question: engine {first['engine']['median'] * 1e3:.1f} ms, transformers "
        f"{first['transformers']['median'] * 1e3:.1f} ms: {speedup['median']:.2f}x "
        f"({speedup['min']:.2f}-{speedup['max']:.2f}); same token: "
        f"{first['same_first_token_as_transformers']}"
    )
    print(
        f"second question: engine {second['engine']['median'] * 1e3:.1f} ms, "
        f"{ratio['median']:.2f}x the first ({ratio['min']:.2f}-{ratio['max']:.2f})"
    )
    print(
        f"8 users: engine {users['engine']['median'] * 1e3:.0f} ms, transformers batched "
        f"{users['transformers_batched']['median'] * 1e3:.0f} ms "
        f"({users['speedup_transformers_batched_over_engine']['median']:.2f}x), sequential "
        f"{users['transformers_sequential']['median'] * 1e3:.0f} ms "
        f"({users['speedup_transformers_sequential_over_engine']['median']:.2f}x)"
    )
    machine = {**machine_info(), "load_avg_1m_before_after": [load_before[0], load_after[0]]}
    path = args.json or RESULTS_DIR / f"vision-{device_slug(machine['cpu'])}-{args.input}.json"
    settings = {
        **{k: getattr(args, k) for k in ("rounds", "threads", "width", "height", "input")},
        "model": "tests.tiny_models.save_tiny_idefics3 (random, fp32)",
        "dtype": "float32",
        "users": USERS,
        "questions": [FIRST_QUESTION, SECOND_QUESTION],
        "max_new_tokens": 1,
    }
    save_result(path, settings, machine, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
