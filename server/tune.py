"""`hetero-infer tune`: time the kernel choices a model's first start would, and keep
them, so that the server starts without timing (kernels/linear_choice.py).

    hetero-infer tune --model ./my-bf16-model-folder
    OMP_NUM_THREADS=16 hetero-infer tune --model ./my-bf16-model-folder

It loads the model as an engine with the same settings would, in the same environment
(its threads too: the choice is kept per thread count), times each bf16 projection
shape on our kernel and on oneDNN's, keeps the choice in the cache file, and prints what
runs where (a shape the file already holds for this machine is printed as cached).
"""

from __future__ import annotations

from hetero_infer.engine.entrypoints.process_settings import apply_process_settings
from hetero_infer.engine.settings.config import EngineConfig


def tune(config: EngineConfig) -> int:
    """Load the model of ``config``, its bf16 projections' choice measured (whatever
    ``cpu_linear_kernel`` says), and print it."""
    config = config.replace(cpu_linear_kernel="measure")
    apply_process_settings(config)
    from hetero_infer.engine.entrypoints.llm_engine import LLMEngine

    engine = LLMEngine(config)
    try:
        chooser = engine.runner.kernels.linear_chooser
        if chooser is None or not chooser.chosen:
            print("nothing to choose: no bf16 projection that both kernels take")
        else:
            print(chooser.table())
            print(f"kept in {chooser.cache_path}")
    finally:
        engine.shutdown()
    return 0
