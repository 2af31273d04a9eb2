"""The one ISA gate (kernels/cpu_isa.py): what it decides on this machine (the pytest
header prints it: ``CPU features: ...; CPU kernels: ...``) matches the CPU's own flags
and the build; its feature list matches the C++ guards; and on CPUs without the
features it names the ones missing, as the tests' skip reasons and the engine's
default dtype follow it."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hetero_infer.engine.setup import resolve_dtype
from hetero_infer.kernels import cpu_build, cpu_extension, cpu_isa
from hetero_infer.kernels.cpu_extension import load_cpu_kernels

from tests.conftest import cpu_kernels_skip

# Flags of CPUs the kernels meet: one with AVX but not AVX2 (Sandy Bridge), an AVX2-only
# one (Zen 3), one with AVX-VNNI but no AVX-512 (Alder Lake), one with AVX512-VNNI but
# not -BF16 (Ice Lake), and Sapphire Rapids (AMX, AVX512-BF16).
SANDY_BRIDGE = frozenset({"avx"})
ZEN3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi2"})
ALDER_LAKE = ZEN3 | {"avx_vnni"}
ICE_LAKE = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
SAPPHIRE_RAPIDS = ICE_LAKE | {"avx512_bf16", "amx_bf16", "amx_tile"}


def proc_cpuinfo_flags() -> set[str]:
    """Every flag of the first CPU in /proc/cpuinfo, read here on its own."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("/proc/cpuinfo has no flags line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_the_gate_decides_by_this_cpu_and_the_build():
    flags = proc_cpuinfo_flags()
    module = load_cpu_kernels()
    print(f"\n{cpu_isa.describe()}")
    for kernel, features in cpu_isa.KERNEL_FEATURES.items():
        lacking = [f for f in features if f not in flags]
        assert cpu_isa.missing_features(kernel) == lacking
        reason = cpu_isa.kernel_unavailable(kernel)
        print(f"{kernel}: {'runs' if reason is None else 'skipped: ' + reason}")
        if lacking:
            assert reason is not None and all(f in reason for f in lacking), reason
            continue
        # -march=native: a build on a CPU with the features compiles the kernel in.
        assert module is not None, "the CPU kernels did not build here"
        assert getattr(module, f"{kernel}_available")(), kernel
        assert reason is None
    assert cpu_isa.has_bf16_matmul() == bool(flags & {"avx512_bf16", "amx_bf16"})
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == (
        torch.bfloat16 if cpu_isa.has_bf16_matmul() else torch.float32
    )


def guard_macros(kernel: str) -> set[str]:
    """The compiler macros the ``#if`` in ``<kernel>_available()`` tests (through a
    macro the file defines under another ``#if``, as the quantized kernel does)."""
    for path in cpu_build.source_paths():
        source = path.read_text()
        body = re.search(rf"bool {kernel}_available\(\) \{{\n#if ([^\n]*)", source)
        if body is None:
            continue
        names = set(re.findall(r"defined\((\w+)\)", body.group(1)))
        macros = {name for name in names if name.startswith("__")}
        for name in names - macros:
            defined_under = re.search(rf"#if ([^\n]*)\n#define {name}\b", source)
            assert defined_under is not None, f"{path.name}: where {name} is defined"
            macros |= set(re.findall(r"defined\((__\w+__)\)", defined_under.group(1)))
        return macros
    raise AssertionError(f"no {kernel}_available() in kernels/csrc")


@pytest.mark.parametrize("kernel", sorted(cpu_isa.KERNEL_FEATURES))
def test_the_features_are_those_the_cpp_guards_test(kernel):
    features = cpu_isa.KERNEL_FEATURES[kernel]
    assert guard_macros(kernel) == {cpu_isa.FEATURE_MACROS[f] for f in features}
    # Each one is a flag cpu_build reads from /proc/cpuinfo.
    assert all(f.startswith(cpu_build._ISA_PREFIXES) for f in features)


@pytest.mark.parametrize(
    ("flags", "missing"),
    [
        (SANDY_BRIDGE, ["avx2", "fma", "f16c"]),
        (ZEN3, []),
        (ALDER_LAKE, []),
        (ICE_LAKE, []),
        (SAPPHIRE_RAPIDS, []),
    ],
)
def test_the_quantized_kernel_names_what_a_cpu_lacks(flags, missing):
    assert cpu_isa.missing_features("quantized_linear", flags) == missing
    # The bf16 kernels multiply without AVX512-BF16 too: they need AVX-512's -BW only.
    bw = [] if "avx512bw" in flags else ["avx512bw"]
    assert cpu_isa.missing_features("linear_packed", flags) == bw
    assert cpu_isa.missing_features("prefill_attention", flags) == bw
    reason = cpu_isa.kernel_unavailable("quantized_linear", flags)
    if missing:
        assert reason == f"quantized_linear needs {', '.join(missing)}, which this CPU lacks"
        assert reason in cpu_isa.describe(flags)
    assert cpu_isa.has_bf16_matmul(flags) == (flags == SAPPHIRE_RAPIDS)


def test_unknown_flags_leave_the_decision_to_the_build():
    """Where /proc/cpuinfo cannot be read, the extension's own answer decides."""
    assert cpu_isa.missing_features("quantized_linear", frozenset()) == []

    class Built:
        @staticmethod
        def quantized_linear_available() -> bool:
            return False

    reason = cpu_isa.kernel_unavailable("quantized_linear", frozenset(), Built())
    assert reason is not None and "built without it" in reason and "avx2" in reason


def test_the_marker_skips_with_the_gates_reason(monkeypatch):
    """tests/conftest.py's cpu_kernels marker: skipped, naming the missing features,
    where the gate says a kernel does not run; not where they all run."""
    marks = [pytest.mark.cpu_kernels("linear_packed", "quantized_linear").mark]
    reasons = [cpu_isa.kernel_unavailable(k) for k in ("linear_packed", "quantized_linear")]
    assert cpu_kernels_skip(marks) == next((r for r in reasons if r is not None), None)
    # A CPU with the features, and a build that has the kernels (this machine's build
    # may lack them: it was compiled for this CPU).
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: ICE_LAKE)
    built = SimpleNamespace(
        linear_packed_available=lambda: True, quantized_linear_available=lambda: True
    )
    monkeypatch.setattr(cpu_extension, "load_cpu_kernels", lambda: built)
    assert cpu_kernels_skip(marks) is None
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: ZEN3)
    assert cpu_kernels_skip(marks) == "linear_packed needs avx512bw, which this CPU lacks"
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: SANDY_BRIDGE)
    quantized = [pytest.mark.cpu_kernels("quantized_linear").mark]
    assert cpu_kernels_skip(quantized) == (
        "quantized_linear needs avx2, fma, f16c, which this CPU lacks"
    )
    assert cpu_kernels_skip([]) is None
