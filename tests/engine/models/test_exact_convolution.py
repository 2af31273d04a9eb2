"""engine/models/exact_convolution.py: Qwen2.5-VL's patch embedding runs its
convolution with cuDNN's TF32 off (which torch allows by default for fp32 on a GPU),
and the setting is as it was afterwards. Checked here by what the convolution sees."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hetero_infer.engine.models.qwen2_5_vl_vision import PatchEmbed


def recording(monkeypatch: pytest.MonkeyPatch, name: str) -> list[bool]:
    """F.<name> records cuDNN's allow_tf32 at each call."""
    seen: list[bool] = []
    convolution = getattr(F, name)

    def recorded(*args, **kwargs):
        seen.append(torch.backends.cudnn.allow_tf32)
        return convolution(*args, **kwargs)

    monkeypatch.setattr(F, name, recorded)
    return seen


def test_qwen2_5_vl_embeds_its_patches_without_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = recording(monkeypatch, "conv3d")
    embed = PatchEmbed(channels=3, temporal=2, patch=2, dim=5)
    torch.nn.init.normal_(embed.proj.weight)
    out = embed(torch.randn(6, 3 * 2 * 2 * 2))
    assert out.shape == (6, 5) and seen == [False] and torch.backends.cudnn.allow_tf32
