"""Prometheus metrics with vLLM's names, meanings and buckets (prefix ``vllm:``).

Gauges and engine counters are read from the engine when Prometheus scrapes;
per-request latencies are observed as the routes see each request's outputs.
All times are seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from hetero_infer.engine.core.spec_decode_stats import SpecDecodeStats
from hetero_infer.engine.entrypoints.async_engine import AsyncEngine
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
ITL_BUCKETS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
REQUEST_BUCKETS += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# Token counts: vLLM's 1-2-5 series, which it cuts at max_model_len; here up to 10M
# tokens for every model (buckets past a model's context stay empty).
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5)) + (1e7,)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class _EngineCollector(Collector):
    """Engine state, read at scrape time."""

    def __init__(self, get_engine: Callable[[], AsyncEngine | None], model_name: str) -> None:
        self.get_engine = get_engine
        self.model_name = model_name
        self.started = time.time()
        # vllm:lora_requests_info's labels at the last scrape, and since when they hold
        self.lora_labels: list[str] = ["0", "", ""]
        self.lora_changed = self.started

    def collect(self) -> Iterator:
        engine = self.get_engine()
        if engine is None:
            return
        labels = ["model_name"]
        stats = engine.memory_stats()
        metrics = engine.metrics
        for name, doc, value in (
            ("num_requests_running", "Requests in the running batch.", stats["num_running"]),
            (
                "num_requests_waiting",
                "Requests waiting to be scheduled (including swapped out).",
                stats["num_waiting"] + stats["num_swapped"],
            ),
            ("kv_cache_usage_perc", "KV cache usage (1 = full).", stats["usage"]),
            # vLLM's older name, which llm-d's simulator and older endpoint pickers read
            ("gpu_cache_usage_perc", "KV cache usage (1 = full).", stats["usage"]),
        ):
            gauge = GaugeMetricFamily(f"vllm:{name}", doc, labels=labels)
            gauge.add_metric([self.model_name], value)
            yield gauge
        yield from self._endpoint_picker_info(engine, stats)
        for name, doc, value in (
            ("prompt_tokens", "Prompt tokens processed.", metrics.prompt_tokens),
            ("generation_tokens", "Tokens generated.", metrics.tokens_generated),
            ("num_preemptions", "Preemptions of running requests.", metrics.num_preemptions),
            # Not one of vLLM's (it has no time limit): requests ended by theirs.
            ("request_timeouts", "Requests ended by their time limit.", metrics.num_timeouts),
            ("prefix_cache_queries", "Prompt tokens looked up.", stats["prefix_cache_queries"]),
            ("prefix_cache_hits", "Prompt tokens found cached.", stats["prefix_cache_hits"]),
        ):
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
            counter.add_metric([self.model_name], value)
            yield counter
        # The name vLLM's proposal for admission control gives it (not in a release
        # yet): 503s for a full queue ("queue_full") or a start later than
        # --max-queue-time ("queue_time").
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Requests refused with 503 by admission control, by reason.",
            labels=[*labels, "reason"],
        )
        for reason, count in sorted(engine.rejections.items()):
            rejections.add_metric([self.model_name, reason], count)
        yield rejections
        yield self._step_tokens(metrics.step_tokens)
        yield from self._spec_decode(metrics.spec_decode)
        yield from self._kv_tiers(stats)

    def _step_tokens(self, step_tokens: Mapping[int, int]) -> HistogramMetricFamily:
        """vllm:iteration_tokens_total: the tokens each step ran (prompt chunks, decodes
        and drafts; vLLM counts a prompt whole at its first token instead), from the
        engine's count of steps by size."""
        family = HistogramMetricFamily(
            "vllm:iteration_tokens_total",
            "The tokens of each engine step.",
            labels=["model_name"],
        )
        # One copy (made in C, whole under the GIL): the engine thread adds sizes as it
        # steps, and iterating the live dict could see it change size.
        counts = dict(step_tokens)
        buckets = [
            (str(float(bound)), sum(n for size, n in counts.items() if size <= bound))
            for bound in STEP_TOKEN_BUCKETS
        ]
        buckets.append(("+Inf", sum(counts.values())))
        total = sum(size * n for size, n in counts.items())
        family.add_metric([self.model_name], buckets, total)
        return family

    def _kv_tiers(self, stats: dict) -> Iterator:
        """The prefix cache's RAM and disk tiers (docs/kv-tiers.md), when they are on:
        vLLM's counters of tokens asked of and found in KV kept outside the cache
        (external_prefix_cache_*), and our own per tier (kv_tier_*: vLLM has no
        per-tier names)."""
        if "kv_tier_ram_slots" not in stats:
            return
        model = self.model_name
        for name, doc, key in (
            ("external_prefix_cache_queries", "Tokens looked up in the KV tiers.", "queried"),
            ("external_prefix_cache_hits", "Tokens found in the KV tiers.", "hit"),
        ):
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=["model_name"])
            counter.add_metric([model], stats[f"kv_tier_{key}_tokens"])
            yield counter
        hits = CounterMetricFamily(
            "vllm:kv_tier_hits",
            "KV blocks brought back from a tier.",
            labels=["model_name", "tier"],
        )
        misses = CounterMetricFamily(
            "vllm:kv_tier_misses",
            "KV blocks a lookup wanted that a tier lacked.",
            labels=["model_name", "tier"],
        )
        tiers = ["ram"] + (["disk"] if "kv_tier_disk_bytes_read" in stats else [])
        for tier in tiers:
            hits.add_metric([model, tier], stats[f"kv_tier_{tier}_hits"])
            misses.add_metric([model, tier], stats[f"kv_tier_{tier}_misses"])
        moved = CounterMetricFamily(
            "vllm:kv_tier_bytes",
            "Bytes moved into (in) and out of (out) a KV tier.",
            labels=["model_name", "tier", "direction"],
        )
        moved.add_metric([model, "ram", "in"], stats["kv_tier_ram_bytes_saved"])
        moved.add_metric([model, "ram", "out"], stats["kv_tier_ram_bytes_loaded"])
        if "disk" in tiers:
            moved.add_metric([model, "disk", "in"], stats["kv_tier_disk_bytes_written"])
            moved.add_metric([model, "disk", "out"], stats["kv_tier_disk_bytes_read"])
            errors = CounterMetricFamily(
                "vllm:kv_tier_disk_errors",
                "Disk tier writes refused (write), dropped on a full queue (dropped), and "
                "files refused as corrupt or foreign (corrupt).",
                labels=["model_name", "kind"],
            )
            errors.add_metric([model, "write"], stats["kv_tier_disk_write_errors"])
            errors.add_metric([model, "dropped"], stats["kv_tier_disk_writes_dropped"])
            errors.add_metric([model, "corrupt"], stats["kv_tier_disk_corrupt_files"])
            yield errors
        yield hits
        yield misses
        yield moved

    def _endpoint_picker_info(self, engine: AsyncEngine, stats: dict) -> Iterator:
        """The two info gauges, as vLLM writes them, that the Gateway API Inference
        Extension's endpoint picker reads beside the three gauges above.

        vllm:cache_config_info (value 1) carries the KV block size and count in its
        labels: the picker's prefix-cache scorer sizes its model of each replica's
        cache from them. vllm:lora_requests_info names the LoRA adapters the running
        and the waiting requests use (comma-separated), and max_lora (0 without
        --enable-lora); its value is when those labels last changed. The picker's
        LoRA-affinity scorer reads it, and newer pickers count a replica whose scrape
        lacks it as failing, which would leave them no replica to pick."""
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's configuration, in the labels.",
            labels=["model_name", "block_size", "num_gpu_blocks", "num_cpu_blocks"],
        )
        cache.add_metric(
            [
                self.model_name,
                str(engine.block_size),
                str(stats["total_blocks"]),
                str(stats["cpu_total_blocks"]),
            ],
            1,
        )
        yield cache
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "The LoRA adapters of the running and the waiting requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        running, waiting = engine.lora_requests_info()
        max_lora = 0 if engine.lora is None else engine.lora.max_loras
        labels = [str(max_lora), ",".join(running), ",".join(waiting)]
        if labels != self.lora_labels:
            self.lora_labels, self.lora_changed = labels, time.time()
        lora.add_metric(labels, self.lora_changed)
        yield lora

    def _spec_decode(self, stats: SpecDecodeStats) -> Iterator:
        """Speculative decoding's counters, when it is on."""
        if not stats.num_speculative_tokens:
            return
        labels = ["model_name"]
        for name, doc, value in (
            ("spec_decode_num_drafts", "Drafts verified.", stats.num_drafts),
            ("spec_decode_num_draft_tokens", "Draft tokens verified.", stats.num_draft_tokens),
            (
                "spec_decode_num_accepted_tokens",
                "Draft tokens accepted.",
                stats.num_accepted_tokens,
            ),
        ):
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
            counter.add_metric([self.model_name], value)
            yield counter
        per_position = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by their position in the draft.",
            labels=labels + ["position"],
        )
        accepted = stats.accepted_per_position
        for position in range(stats.num_speculative_tokens):
            value = accepted[position] if position < len(accepted) else 0
            per_position.add_metric([self.model_name, str(position)], value)
        yield per_position


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.model_name = ""
        labels = ["model_name"]
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            labels + ["finished_reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens of a request.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to finish.",
            labels,
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Time from arrival to first being scheduled.",
            labels,
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        # vLLM's older name for the inter-token latency, observed alike
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Time between consecutive output tokens of a request.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.phases = {
            phase: Histogram(
                f"vllm:request_{phase}_time_seconds",
                doc,
                labels,
                buckets=REQUEST_BUCKETS,
                registry=self.registry,
            )
            for phase, doc in (
                ("inference", "Time from first being scheduled to finish."),
                ("prefill", "Time from first being scheduled to the first token."),
                ("decode", "Time from the first token to finish."),
            )
        }
        self.tokens = {
            name: Histogram(
                f"vllm:{name}", doc, labels, buckets=TOKEN_BUCKETS, registry=self.registry
            )
            for name, doc in (
                ("request_prompt_tokens", "Prompt tokens of each finished request."),
                (
                    "request_prefill_kv_computed_tokens",
                    "Prompt tokens each request computed (those the prefix cache lacked).",
                ),
                ("request_generation_tokens", "Tokens generated for each finished request."),
                ("request_params_max_tokens", "The max_tokens each request asked for."),
                ("request_max_num_generation_tokens", "The most tokens a choice made."),
                # llm-d's inference simulator's name for the same
                ("max_num_generation_tokens", "The most tokens a choice made."),
            )
        }
        self.request_tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Each request's decode time over its tokens after the first.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens_cached = Counter(
            "vllm:prompt_tokens_cached",
            "Prompt tokens the prefix cache held when their request was first scheduled.",
            labels,
            registry=self.registry,
        )
        self.params_n = Histogram(
            "vllm:request_params_n",
            "The n (choices) each request asked for.",
            labels,
            buckets=N_BUCKETS,
            registry=self.registry,
        )

    def bind(self, get_engine: Callable[[], AsyncEngine | None], model_name: str) -> None:
        self.model_name = model_name
        self.registry.register(_EngineCollector(get_engine, model_name))
