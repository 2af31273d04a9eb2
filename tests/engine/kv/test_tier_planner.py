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
