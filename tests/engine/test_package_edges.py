"""The engine's packages stand in floors, and a module imports only from its own floor
or those below: nothing reaches upward, so each floor can be read (and tested) with
only what is beneath it. The kernels import nothing of the engine or the server, and
the engine nothing of the server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "hetero_infer"

# engine/'s packages and top-level modules, lowest floor first.
FLOORS = [
    # the settings, and what a request asks for
    {"settings", "params"},
    {"models"},  # the model code, and how a checkpoint splits over ranks
    # checkpoints, tokenizers, and images made into a vision model's inputs
    {"loader", "tokenizer", "multimodal"},
    {"setup"},  # a config resolved on this machine
    {"lora"},  # LoRA adapters: read, checked, in slots beside the model's projections
    # scheduling (pure Python): sequences, blocks, speculation's drafts; the prefix
    # cache's tiers as a protocol (core/prefix_tiers.py) the block manager drives
    {"core"},
    # the prefix cache's RAM and disk tiers: the planner that implements that protocol,
    # and the store that moves the bytes, which is the runner's
    {"kv"},
    {"distributed"},  # tensor parallelism's communication
    {"worker"},  # the runner: the model, its KV cache, sampling, drafts' verification
    {"executor"},  # tensor-parallel ranks: started, and serving rank 0's commands
    # the front ends around the core: requests in and outputs out, and the entry points
    {"frontend", "entrypoints"},
]  # fmt: skip
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def engine_part(module: str) -> str | None:
    """hetero_infer.engine.core.scheduler -> core; None outside the engine."""
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "engine"] or len(parts) < 3:
        return None
    return parts[2]


def source_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_engine_part_has_a_floor():
    parts = {
        p.relative_to(ROOT / "engine").parts[0].removesuffix(".py") for p in source_files("engine")
    }
    assert parts - {"__init__"} == set(FLOOR)


@pytest.mark.parametrize("path", source_files("engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_engine_module_imports_upward(path: Path):
    own = path.relative_to(ROOT / "engine").parts[0].removesuffix(".py")
    if own == "__init__":
        return  # the package's facade re-exports the front end
    for line, module in imports_of(path):
        if module.startswith(f"{PACKAGE}.server"):
            pytest.fail(f"{path.relative_to(ROOT)}:{line} imports the server ({module})")
        other = engine_part(module)
        if other is not None and other != own:
            assert FLOOR[other] <= FLOOR[own], (
                f"{path.relative_to(ROOT)}:{line}: {own} (floor {FLOOR[own]}) imports "
                f"{module} (floor {FLOOR[other]})"
            )


@pytest.mark.parametrize("path", source_files("kernels"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_kernels_import_nothing_of_the_engine_or_the_server(path: Path):
    for line, module in imports_of(path):
        assert not module.startswith((f"{PACKAGE}.engine", f"{PACKAGE}.server")), (
            f"{path.relative_to(ROOT)}:{line} imports {module}"
        )


@pytest.mark.parametrize("path", source_files("engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_engine_reaches_the_kernels_through_their_facade(path: Path):
    """The engine imports kernels/__init__.py's names, never a kernel module itself: which
    module implements a kernel is the kernels' own business."""
    for line, module in imports_of(path):
        assert not module.startswith(f"{PACKAGE}.kernels."), (
            f"{path.relative_to(ROOT)}:{line} imports {module}: import it from {PACKAGE}.kernels"
        )
