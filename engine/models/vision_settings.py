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
    # scale_factor; Gemma 3: vision_config and mm_tokens_per_image), which the family's
    # vision module reads.
    hf_config: dict[str, Any]
    # Gemma 3's: the tokens of one image, which attend to each other both ways, so that
    # one step computes them all (ImageInput.bidirectional). 0: images attend causally.
    bidirectional_tokens: int = 0

    @property
    def bidirectional(self) -> bool:
        return self.bidirectional_tokens > 0


def vision_settings(config: Any) -> VisionSettings | None:
    """A transformers config's vision settings; None for a text-only model."""
    vision_config = getattr(config, "vision_config", None)
    if vision_config is None:
        return None
    hf = config.to_dict()
    # Gemma3Config names it image_token_index.
    image_token_id = hf.get("image_token_id", hf.get("image_token_index"))
    # transformers' Gemma 3 lets an image's tokens see each other whatever their order.
    both_ways = hf.get("mm_tokens_per_image", 256) if hf.get("model_type") == "gemma3" else 0
    return VisionSettings(image_token_id, hf, bidirectional_tokens=both_ways)
