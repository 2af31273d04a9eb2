"""How a model's layers share KV cache groups, and what each group keeps.

Layers in one group share block tables (core/kv_cache_group.py); a group's retention
rule says which tokens' KV it keeps: every token's (None), or the last ``window``
tokens' a query still sees. Group 0 keeps every token: its tables are the ones every
sequence has, and the scheduler's accounting counts its blocks.

The rules, in order: layers that attend to the whole context are group 0; where a
model mixes them with sliding-window layers (Gemma 2 and 3), those are group 1, kept
for the widest of their windows. A model whose layers all slide (or none) has one
group, kept whole, its windows applied by the attention's mask: a windowed group needs
a whole one beside it. A new kind of layer (chunked local attention, an encoder's
cache) is a new rule here, and a new group index everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayout:
    # Per group, its retention rule: None keeps every token's KV, a window the last ones.
    group_windows: tuple[int | None, ...]
    # Per layer, its group.
    layer_groups: tuple[int, ...]

    @classmethod
    def of(cls, layer_windows: tuple[int | None, ...]) -> KVLayout:
        """The layout for layers with these attention windows (None: full attention)."""
        windows = [w for w in layer_windows if w is not None]
        if not windows or len(windows) == len(layer_windows):
            return cls((None,), (0,) * len(layer_windows))
        return cls((None, max(windows)), tuple(int(w is not None) for w in layer_windows))

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    def num_layers_in(self, group: int) -> int:
        return self.layer_groups.count(group)
