"""Which layers share a KV cache group, and what each group keeps: one rule
(engine/models/kv_layout.py) that the block manager, the runner and the kernels all
read by group index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hetero_infer.engine.models.kv_layout import KVLayout

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("layer_windows", "group_windows", "layer_groups"),
    [
        ((None, None, None), (None,), (0, 0, 0)),  # Llama: one whole group
        ((64, 64), (None,), (0, 0)),  # every layer slides (Mistral): masks, one group
        ((512, 512, None, 512), (None, 512), (1, 1, 0, 1)),  # Gemma 3: a windowed group
        ((8, None, 16, None), (None, 16), (1, 0, 1, 0)),  # two windows: the widest kept
    ],
)
def test_layers_share_groups_by_the_rule(layer_windows, group_windows, layer_groups):
    layout = KVLayout.of(layer_windows)
    assert layout.group_windows == group_windows
    assert layout.layer_groups == layer_groups
    assert layout.num_groups == len(group_windows)
    assert sum(map(layout.num_layers_in, range(layout.num_groups))) == len(layer_windows)


# What code written for two kinds of group by name would say: the second group's table
# picked by position, or a field for one kind of group.
BY_KIND = re.compile(r"sliding_block_table|block_tables\[1\]|sliding_moves|sliding_cache")


@pytest.mark.parametrize("folder", ["engine", "kernels"])
def test_no_code_picks_a_group_by_its_kind(folder):
    sources = [*(ROOT / folder).rglob("*.py"), *(ROOT / folder).rglob("*.[ch]*")]
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if BY_KIND.search(line)
    ]
    assert not found, f"a KV cache group named by its kind, not its index: {found}"
