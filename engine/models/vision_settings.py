"""VisionSettings: what a vision-language model's config says beyond its text model's
(whose settings ModelConfig reads as for any decoder): the token its images' embeddings
replace, and its vision tower's and connector's config as the checkpoint keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VisionSettings:
    # The placeholder token whose embeddings an image's replace, in order.
    image_token_id: int
    # The HF config's vision parts as it stores them (e.g. Idefics3: vision_config and
    # scale_factor), which the family's vision module reads.
    hf_config: dict[str, Any]


def vision_settings(config: Any) -> VisionSettings | None:
    """A transformers config's vision settings; None for a text-only model."""
    vision_config = getattr(config, "vision_config", None)
    if vision_config is None:
        return None
    hf = config.to_dict()
    return VisionSettings(image_token_id=hf["image_token_id"], hf_config=hf)
