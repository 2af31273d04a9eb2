"""TierPlanner is what the scheduling core drives as its PrefixTiers: every method the
protocol names, with the protocol's parameters (the core types against the protocol
alone, so nothing else would catch a method renamed or a parameter added on one side)."""

from __future__ import annotations

import inspect

import pytest
from hetero_infer.engine.core.prefix_tiers import PrefixTiers
from hetero_infer.engine.kv.tier_planner import TierPlanner

PROTOCOL_METHODS = sorted(
    name
    for name, _ in inspect.getmembers(PrefixTiers, inspect.isfunction)
    if not name.startswith("_")
)


def test_the_protocol_names_what_the_core_calls():
    assert len(PROTOCOL_METHODS) >= 10, PROTOCOL_METHODS


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_the_planner_has_each_method_with_the_protocols_parameters(name):
    wanted = inspect.signature(getattr(PrefixTiers, name)).parameters
    has = inspect.signature(getattr(TierPlanner, name)).parameters
    assert list(has) == list(wanted)


def test_forgetting_host_blocks_frees_every_slot():
    planner = TierPlanner(num_groups=2, num_slots=3, block_size=4, disk=None)
    for group in (0, 1):
        for block_hash in (10, 11, 12):
            planner.save(group, block_id=block_hash, block_hash=block_hash, token_ids=(1, 2, 3, 4))
    planner.take_moves()
    assert planner.stats()["kv_tier_ram_blocks"] == 6
    planner.forget_host_blocks()
    assert planner.stats()["kv_tier_ram_blocks"] == 0
    assert planner.find(0, [None], [10], [1, 2, 3, 4], window=False) == [None]
    assert all(index.num_available == 3 for index in planner.indexes)
