"""The host's share of an engine step, and what a device's latency adds to it.

    python -m bench.host_step                      # embedded SmolLM2 Q4_1's tokenizer
    python -m bench.host_step --batch-sizes 1,256 --device-ms 0,5,20

The engine's own loop (``LLMEngine.step``: schedule, hand the step to the runner,
apply its tokens, detokenize, check stops, make the outputs) over ``--batch-size``
decoding requests, with the model runner replaced by one that computes nothing:
it answers every sampling sequence with a word token (so that detokenizing does a
real token's work) after sleeping ``--device-ms``, a device's fixed step latency.

- ``host ms``: a decode step's median time with no device time, the host's whole cost
  of a step above the runner (input building and sampling live in the runner, so they
  are not in it).
- With device time D: the step period, against host + D (steps in sequence) and
  max(host, D) (the host's work for step N+1 done while the device runs step N).
  ``x serial`` near 1 means no overlap, ``x overlapped`` near 1 a full one.

Each with async scheduling off and on (``--async-scheduling``): on, the runner's
sleep is the device computing step N while the host schedules step N+1.

Rounds alternate the settings; written to ``--out``/``host-step.json`` with the
command and the machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, align, column_widths, portable

PROMPT_TOKENS = 16


class IdleRunner:
    """A model runner that computes nothing: each sampling sequence gets ``token_id``
    after ``device_s`` seconds, the device's step."""

    def __init__(self, token_id: int, device_s: float) -> None:
        self.token_id = token_id
        self.device_s = device_s

    def execute(self, out: Any) -> Any:
        from hetero_infer.engine.core.step_data import ModelRunnerOutput, SampledToken

        if self.device_s:
            time.sleep(self.device_s)
        token = [SampledToken(self.token_id, float("nan"))]
        return ModelRunnerOutput(sampled={s.request_id: token for s in out.scheduled if s.samples})


def step_times(
    engine: Any, batch: int, steps: int, first_token: int = 100, final_only: bool = False
) -> list[float]:
    """Seconds of every step of ``batch`` requests (prompts of PROMPT_TOKENS ids from
    ``first_token`` on) run to ``steps + 4`` tokens each. ``final_only``: their outputs
    made only at the end, as offline runs (LLMEngine.generate) and the server's answers
    sent whole ask; else one a step, as a stream's."""
    from hetero_infer.engine import SamplingParams
    from hetero_infer.engine.params.sampling_params import RequestOutputKind

    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.CUMULATIVE
    params = SamplingParams(
        max_tokens=steps + 4, ignore_eos=True, temperature=0.0, output_kind=kind
    )
    for i in range(batch):
        engine.add_request([first_token + i % 50] * PROMPT_TOKENS, params)
    times = []
    while engine.has_pending_work():
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return times


def decode_step_times(
    engine: Any, runner: IdleRunner, batch: int, steps: int, final_only: bool = False
) -> list[float]:
    """Seconds of each step once every request decodes (prefill steps left out)."""
    engine.core.runner = runner
    # The prompts' step, then decodes.
    return step_times(engine, batch, steps, final_only=final_only)[2 : 2 + steps]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2 Q4_1")
    parser.add_argument("--batch-sizes", default="1,256")
    parser.add_argument("--device-ms", default="0,5,20")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    device_ms = [float(d) for d in args.device_ms.split(",")]
    if 0.0 not in device_ms:
        parser.error("--device-ms must include 0 (the host's own time)")

    from hetero_infer.engine import EngineConfig, LLMEngine

    from bench.throughput import machine_info

    modes = {"sync": False, "async": True}
    engines = {
        mode: LLMEngine(
            EngineConfig(model=args.model, max_num_seqs=max(batches), async_scheduling=on)
        )
        for mode, on in modes.items()
    }
    token_id = engines["sync"].tokenizer.encode(" the")[-1]
    keys = [(m, b, d) for m in modes for b in batches for d in device_ms]
    samples: dict[tuple[str, int, float], list[float]] = {key: [] for key in keys}
    for _ in range(args.rounds):
        for key in samples:
            mode, batch, ms = key
            runner = IdleRunner(token_id, ms / 1000)
            times = decode_step_times(engines[mode], runner, batch, args.steps)
            samples[key].append(statistics.median(times) * 1000)
    rows: dict[str, Any] = {}
    for mode, batch, ms in keys:
        host = statistics.median(samples[(mode, batch, 0.0)])
        period = statistics.median(samples[(mode, batch, ms)])
        rows[f"{mode}/{batch}/{ms:g}"] = {
            "async_scheduling": modes[mode],
            "batch": batch,
            "device_ms": ms,
            "step_ms_per_round": samples[(mode, batch, ms)],
            "step_ms": period,
            "host_ms": host,
            "x_serial": period / (host + ms),
            "x_overlapped": period / max(host, ms),
        }
    result = {
        "benchmark": "host_step",
        "command": "python -m bench.host_step "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "model": args.model or "embedded SmolLM2-135M-Instruct Q4_1 (its tokenizer)",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "rows": rows,
    }
    table = [["scheduling", "batch", "device ms", "step ms", "host ms", "x serial", "x overlapped"]]
    for key, row in rows.items():
        table.append(
            [
                key.split("/")[0],
                str(row["batch"]),
                f"{row['device_ms']:g}",
                f"{row['step_ms']:.2f}",
                f"{row['host_ms']:.2f}",
                f"{row['x_serial']:.2f}",
                f"{row['x_overlapped']:.2f}",
            ]
        )
    widths = column_widths(table)
    print("\n".join("  ".join(align(r, widths)) for r in table))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "host-step.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    print(f"written: {path}")
    return result


if __name__ == "__main__":
    main()
