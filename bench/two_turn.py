"""Time to first token of a chat's second turn against its first: the prefix cache
must keep turn 1's KV, so that turn 2 computes only what is new.

    python -m bench.two_turn                               # SmolLM2 and Gemma-3-270M
    python -m bench.two_turn --models gemma-3-270m --rounds 5

Per model (a packaged model's name, in bf16 with its blocks kept quantized as served),
one engine; per round a new first turn: a user message of about ``--first-turn``
tokens (a document, the round's own, and a question), answered greedily in
``--answer-tokens`` tokens, then a second turn of the whole chat so far, the answer
re-rendered through the chat template, and a short new question. Time to first token
is the time to a one-token answer (prefill and one step) through ``LLMEngine``, with
nothing else running. Gemma 3's sliding layers see only the last 512 tokens and keep
only those blocks (a KV cache group of their own), yet turn 2 finds turn 1's last
window in their pool as it finds every block of the global layers, and hits as
SmolLM2's does (llama.cpp's server re-reads such a model's whole prompt every turn).

Reported per model: each round's turn-1 and turn-2 times, their ratio, the prefix-cache
hit rate of turn 2's prompt, and the median ratio; written to
``--out``/``two-turn.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, portable

SENTENCES = [
    "The river rose after three days of rain and covered the lower fields.",
    "Merchants moved their goods to the upper town before the bridge closed.",
    "A clerk wrote down every cart that crossed, with its owner and its load.",
    "By the fourth day the water had reached the steps of the old granary.",
    "The council met at night and agreed to open the eastern sluice gates.",
    "Farmers downstream were warned by riders sent along both banks.",
]


def first_turn_text(target_tokens: int, round_index: int) -> str:
    """A document of about ``target_tokens`` tokens (15 to a sentence), its sentences in
    an order of the round's own, so that no round hits another's blocks."""
    count = target_tokens // 15
    order = [SENTENCES[(i * (round_index + 1) + i // 6) % len(SENTENCES)] for i in range(count)]
    return " ".join(f"({i}) {s}" for i, s in enumerate(order)) + "\nWhat happened on day four?"


def timed_first_token(engine, prompt: list[int]) -> float:
    from hetero_infer.engine import SamplingParams

    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return time.perf_counter() - started


def measure(model: str, rounds: int, first_turn: int, answer_tokens: int) -> dict:
    from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=model, dtype="bfloat16", max_model_len=4096))
    tokenizer = engine.tokenizer
    # One warm-up chat: first calls pay for allocations that later ones do not.
    timed_first_token(engine, tokenizer.encode(first_turn_text(200, 99)))
    results = []
    for index in range(rounds):
        chat = [{"role": "user", "content": first_turn_text(first_turn, index)}]
        prompt_1 = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        ttft_1 = timed_first_token(engine, prompt_1)
        greedy = SamplingParams(max_tokens=answer_tokens, temperature=0.0)
        answer = engine.generate([prompt_1], greedy, use_tqdm=False)[0].text
        chat += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Say it in one sentence."},
        ]
        prompt_2 = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        hits_before = engine.memory_stats()["prefix_cache_hits"]
        ttft_2 = timed_first_token(engine, prompt_2)
        hit_tokens = engine.memory_stats()["prefix_cache_hits"] - hits_before
        results.append(
            {
                "round": index,
                "turn_1_tokens": len(prompt_1),
                "turn_2_tokens": len(prompt_2),
                "turn_1_ttft_s": ttft_1,
                "turn_2_ttft_s": ttft_2,
                "ratio": ttft_2 / ttft_1,
                "turn_2_cached_fraction": hit_tokens / len(prompt_2),
            }
        )
        print(
            f"{model} round {index}: turn 1 {len(prompt_1)} tokens {ttft_1 * 1e3:.0f} ms, "
            f"turn 2 {len(prompt_2)} tokens {ttft_2 * 1e3:.0f} ms, ratio {ttft_2 / ttft_1:.3f}"
        )
    ratios = [r["ratio"] for r in results]
    return {
        "model": model,
        "rounds": results,
        "median_ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-turn", type=int, default=1500, help="tokens, about")
    parser.add_argument("--answer-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    summary = {
        "settings": vars(args),
        "models": [
            measure(model, args.rounds, args.first_turn, args.answer_tokens)
            for model in args.models.split(",")
        ],
    }
    for entry in summary["models"]:
        low, high = entry["ratio_range"]
        ratio = entry["median_ratio"]
        print(f"{entry['model']}: turn 2 / turn 1 TTFT {ratio:.3f} ({low:.3f}-{high:.3f})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "two-turn.json").write_text(json.dumps(portable(summary), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
