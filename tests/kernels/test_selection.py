"""How the kernels are chosen: once, from the engine's settings and device, with errors
for a choice that cannot run here, and no state left behind for the next choice."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from hetero_infer import kernels
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import selection
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.rms_norm import rms_norm_ref

from tests.tiny_models import save_tiny_model

CPU = torch.device("cpu")
triton_installed = pytest.mark.skipif(not kernels.triton_available(), reason="needs triton")


def test_backend_switch():
    # auto and torch on the CPU: the C++ kernels (torch's code where they did not build)
    expected = "cpu" if load_cpu_kernels() is not None else "torch"
    for name in ("auto", "torch"):
        assert kernels.select_kernels(name, CPU).attention.name == expected
    # the setting turns the C++ kernels off: the torch code, linear layers still packed
    chosen = kernels.select_kernels("auto", CPU, cpu_kernels=False)
    assert chosen.attention.name == "torch"
    assert chosen.ops.rms_norm is rms_norm_ref
    with pytest.raises(ValueError, match="backend"):
        kernels.select_kernels("cuda", CPU)


@triton_installed
def test_triton_choice_leaves_no_state_behind():
    from hetero_infer.kernels.rms_norm_triton import rms_norm_triton

    chosen = kernels.select_kernels("triton", CPU)  # the interpreter: tests/conftest.py
    assert chosen.attention.name == "triton" and chosen.attention.supports_cuda_graphs
    assert chosen.ops.rms_norm is rms_norm_triton
    assert kernels.select_kernels("auto", CPU).attention.name != "triton"


@triton_installed
def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch, tmp_path):
    from hetero_infer.kernels import triton_utils

    monkeypatch.setattr(triton_utils, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="interpreter"):
        kernels.select_kernels("triton", CPU)
    folder = save_tiny_model("llama", tmp_path)
    # The engine says so as a ConfigError, before it loads any weight.
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        LLMEngine(EngineConfig(model=str(folder), attention_backend="triton", device="cpu"))


def test_engine_without_the_cpu_kernels_gives_the_same_tokens(tmp_path):
    """cpu_kernels=False reaches the kernels: the torch code runs, and in fp32 greedy
    decoding gives the same tokens."""
    folder = save_tiny_model("llama", tmp_path)
    prompts = [[5, 9, 33, 7], list(range(3, 40))]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    outputs = []
    for cpu_kernels in (True, False):
        config = EngineConfig(
            model=str(folder),
            dtype="float32",
            max_num_blocks=16,
            max_model_len=256,
            cpu_kernels=cpu_kernels,
        )
        engine = LLMEngine(config)
        assert engine.runner.model.kernels.attention.name == ("cpu" if cpu_kernels else "torch")
        outputs.append([out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)])
    assert outputs[0] == outputs[1]


def test_cpu_path_works_without_triton():
    """With triton unimportable, kernels imports and its CPU path runs; choosing the
    Triton backend says what is missing."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # any import of triton now fails
        import torch
        from hetero_infer import kernels
        assert not kernels.triton_available()
        x = torch.randn(3, 8)
        ops = kernels.select_kernels("auto", torch.device("cpu")).ops
        ops.rms_norm(x, torch.ones(8), 1e-5)
        ops.silu_and_mul(x)
        try:
            kernels.select_kernels("triton", torch.device("cpu"))
        except ValueError as exc:
            assert "triton" in str(exc)
        else:
            raise AssertionError("expected an error")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


class FakeKernels:
    """The AMX switch of a built extension: whether the tiles are there, and the wish."""

    def __init__(self, available: bool) -> None:
        self.available, self.wanted = available, True

    def amx_tiles_available(self) -> bool:
        return self.available

    def set_amx_tiles(self, wanted: bool) -> bool:
        before, self.wanted = self.wanted, wanted
        return before


@pytest.mark.parametrize(
    ("available", "wanted", "flags", "said"),
    [
        (True, True, {"amx_tile"}, "AMX tiles: in use"),
        (True, False, {"amx_tile"}, "AMX tiles: not used (cpu_amx is off)"),
        # The CPU has them, the process was refused them (or the build lacks them).
        (False, True, {"amx_tile"}, "the kernels cannot use them"),
        (False, True, set(), None),  # a CPU without them: nothing to say
    ],
)
def test_the_amx_switch_follows_cpu_amx_and_says_so(
    monkeypatch, caplog, available, wanted, flags, said
):
    kernels = FakeKernels(available)
    monkeypatch.setattr(selection, "cpu_flags", lambda: frozenset(flags))
    with caplog.at_level(logging.INFO, logger=selection.__name__):
        selection.use_amx_tiles(kernels, wanted)
    assert kernels.wanted is wanted
    if said is None:
        assert not caplog.records
    else:
        assert said in caplog.text
        warned = any(r.levelno == logging.WARNING for r in caplog.records)
        assert warned is (not available)
