"""Triton kernels run on CPU tensors in Triton's interpreter.

TRITON_INTERPRET must be set before triton decorates a kernel; other test modules
(through transformers) may already have imported triton, so the knob is set as well.
The kernel modules themselves are imported only by the tests below this folder.

A run that sets TRITON_INTERPRET=0 itself keeps the compiled kernels: the GPU check
(bench/gpu_check.py) runs only the tests marked ``cuda`` that way, on CUDA tensors,
so that they check what the GPU runs rather than the interpreter.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET") != "0":
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        _knobs = getattr(sys.modules["triton"], "knobs", None)
        if _knobs is not None:
            _knobs.runtime.interpret = True
