"""`hetero-infer tune`: time the kernel choices a model's first start would, and keep
them, so that the server starts without timing (kernels/linear_choice.py).

    hetero-infer tune --model ./my-bf16-model-folder
    OMP_NUM_THREADS=16 hetero-infer tune --model ./my-bf16-model-folder

It loads the model as an engine with the same settings would, in the same environment
(its threads too: the choice is kept per thread count), times each bf16 projection
shape on our kernel and on oneDNN's, keeps the choice in the cache file, and prints what
runs where.
"""

from __future__ import annotations

import argparse
import sys

from hetero_infer.engine.entrypoints.process_settings import apply_process_settings


def tune_main(argv: list[str]) -> int:
    from hetero_infer.server.cli import add_engine_flags, engine_config_from_args

    parser = argparse.ArgumentParser(prog="hetero-infer tune", description=__doc__.split("\n\n")[0])
    add_engine_flags(parser, serving=False)
    args = parser.parse_args(argv)
    try:
        config = engine_config_from_args(args).replace(cpu_linear_kernel="measure")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
