"""The values each engine setting with a fixed set of them may take: EngineConfig's
fields list them, and the speculative config reads the quantizations from here too.
A leaf module (nothing of the engine, no torch), so anything may import it."""

from hetero_infer.kernels import BACKENDS as ATTENTION_BACKENDS

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
PREEMPTION_MODES = ("auto", "recompute", "swap")
QUANTIZATIONS = ("auto", "none", "gguf", "int8", "compressed-tensors")
POOLINGS = ("last", "mean")
# auto: the model's dtype; int8: rows with a scale each; fp8: e4m3, CUDA only
# (kernels/kv_quant.py, whose KV_CACHE_DTYPES this repeats: torch is not loaded here).
KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCHEDULING_POLICIES = ("fcfs", "priority")
# vLLM's names: "mp", the engine starts the other ranks as local processes;
# "external_launcher", torchrun did (its RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "external_launcher")
# Which kernel runs a bf16 projection's rows on the CPU (kernels/linear_choice.py, whose
# MODES this repeats: torch is not loaded here)
CPU_LINEAR_KERNELS = ("measure", "rule", "kernel", "onednn")
# The prefix cache's block hashes (engine/core/block_hashing.py): ours, keyed per replica;
# vLLM's sha256_cbor, which routers recompute
PREFIX_CACHING_HASH_ALGOS = ("keyed", "sha256_cbor")

__all__ = [
    "ATTENTION_BACKENDS",
    "CPU_LINEAR_KERNELS",
    "DEVICES",
    "DISTRIBUTED_EXECUTOR_BACKENDS",
    "DTYPES",
    "KV_CACHE_DTYPES",
    "POOLINGS",
    "PREFIX_CACHING_HASH_ALGOS",
    "PREEMPTION_MODES",
    "QUANTIZATIONS",
    "SCHEDULING_POLICIES",
]
