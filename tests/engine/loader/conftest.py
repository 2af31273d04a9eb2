"""Shared set-up of the loader tests: no test may reach the network."""

from __future__ import annotations

import huggingface_hub
import huggingface_hub.constants
import pytest


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE once at import, so patch the constant too:
    # no test may wait on a network that is not there.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
