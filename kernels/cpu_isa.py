"""The CPU's instruction-set features, and which CPU kernels they let run: one answer
for the engine (engine/setup.py's default dtype) and the tests (tests/conftest.py's
``cpu_kernels`` marker), so that both decide the same way and say why.

The C++ kernels (kernels/csrc) are compiled with -march=native. Those that need an
extension of AVX2 or AVX-512 (or AMX) are compiled only where the compiler targets it:
each sits inside an ``#if defined(...)`` of its macros (the bf16 linear layer and prefill
attention: ``__AVX512BW__``; the quantized linear layer: ``__AVX2__``, ``__FMA__`` and
``__F16C__``, its faster tiles ``__AVX512VNNI__`` and ``__AVX512BW__`` too; AMX's tiles:
``__AMX_TILE__``, ``__AMX_INT8__`` and ``__AMX_BF16__``) and reports it through
``<name>_available()``.
Elsewhere the engine runs other code for them, with the same results: oneDNN or torch
for the bf16 linear layers, the weights dequantized at load for the quantized ones, the
per-token kernel for bf16 prefill attention, AVX-512 code for what AMX's tiles do.
(Without AVX512-BF16, the bf16 kernels widen each pair of bf16 values to fp32 and
multiply with FMAs.) KERNEL_FEATURES names each one's extensions by their /proc/cpuinfo
flags (tests/kernels/test_cpu_isa.py holds it to the guards in the C++ source).
"""

from __future__ import annotations

import functools
from types import ModuleType

from hetero_infer.kernels import cpu_build

# Per kernel of the extension that needs ISA extensions: their /proc/cpuinfo flags.
KERNEL_FEATURES: dict[str, tuple[str, ...]] = {
    # VPMADDUBSW on 256-bit registers, fp16 scales widened by F16C; VPDPBUSD on 512-bit
    # ones where the CPU has AVX512-VNNI and -BW (a bf16 result is rounded by
    # VCVTNEPS2BF16 where there is one, else by integer arithmetic)
    "quantized_linear": ("avx2", "fma", "f16c"),
    # bf16 pairs multiplied and summed in fp32: by VDPBF16PS where there is one, else
    # widened to fp32 by shifts and masks and multiplied by FMAs
    "linear_packed": ("avx512bw",),
    "prefill_attention": ("avx512bw",),
    "encoder_attention": ("avx512bw",),
    # AMX's int8 and bf16 tiles: the quantized linear kernel's calls of many rows and
    # bf16 prefill attention (the same kernels' AVX-512 code elsewhere)
    "amx_tiles": ("amx_tile", "amx_int8", "amx_bf16"),
}
# The compiler's macro for each flag (what the C++ guards test).
FEATURE_MACROS = {
    "avx2": "__AVX2__",
    "fma": "__FMA__",
    "f16c": "__F16C__",
    "avx512bw": "__AVX512BW__",
    "avx512_vnni": "__AVX512VNNI__",
    "avx512_bf16": "__AVX512BF16__",
    "amx_tile": "__AMX_TILE__",
    "amx_int8": "__AMX_INT8__",
    "amx_bf16": "__AMX_BF16__",
}
# Instructions that compute in bf16 (AVX512-BF16, or AMX's tiles): without one, bf16 is
# emulated and slower than fp32.
BF16_MATMUL_FEATURES = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags, as /proc/cpuinfo names them (empty where it
    cannot be read: not Linux)."""
    return frozenset(cpu_build.cpu_features())


@functools.cache
def cpu_model() -> str:
    """This CPU's model name, as /proc/cpuinfo gives it ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def has_bf16_matmul(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU (``flags``: this one's) computes in bf16."""
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in BF16_MATMUL_FEATURES)


def missing_features(kernel: str, flags: frozenset[str] | None = None) -> list[str]:
    """The features ``kernel`` needs that the CPU (``flags``: this one's) lacks; none
    where its flags are unknown (then the build alone decides)."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return []
    return [feature for feature in KERNEL_FEATURES[kernel] if feature not in flags]


def kernel_unavailable(
    kernel: str, flags: frozenset[str] | None = None, module: ModuleType | None = None
) -> str | None:
    """Why ``kernel`` (a key of KERNEL_FEATURES) does not run here, naming what is
    missing; None where it runs. ``flags`` and ``module`` (the CPU's flags, the loaded
    extension) are this machine's unless given."""
    missing = missing_features(kernel, flags)
    if missing:
        return f"{kernel} needs {', '.join(missing)}, which this CPU lacks"
    if module is None:
        from hetero_infer.kernels.cpu_extension import load_cpu_kernels

        module = load_cpu_kernels()
    if module is None:
        return f"{kernel}: the C++ CPU kernels did not build or load here"
    if not getattr(module, f"{kernel}_available")():
        needs = ", ".join(KERNEL_FEATURES[kernel])
        return f"{kernel}: the C++ CPU kernels were built without it (not compiled for {needs})"
    return None


def describe(flags: frozenset[str] | None = None) -> str:
    """One line: the features the kernels look for, and what runs here (and why not)."""
    flags = cpu_flags() if flags is None else flags
    wanted = sorted({f for features in KERNEL_FEATURES.values() for f in features})
    wanted += [f for f in BF16_MATMUL_FEATURES if f not in wanted]
    found = [f for f in wanted if f in flags]
    kernels = []
    for kernel in KERNEL_FEATURES:
        reason = kernel_unavailable(kernel, flags)
        kernels.append(f"{kernel} runs" if reason is None else reason)
    return (
        f"CPU features: {', '.join(found) or 'none of ' + ', '.join(wanted)}; "
        f"CPU kernels: {'; '.join(kernels)}"
    )
