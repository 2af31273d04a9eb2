"""engine/models/gemma3_vision.py and gemma3_mm.py: Gemma 3's vision tower and projector
give transformers' image features for the same pixel values, and the engine loads the
whole model from its checkpoint under each naming it comes in, its text model as the
text Gemma 3's, on the tiny random Gemma 3 (tests/tiny_models.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine import loader
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.models.architectures import BY_GGUF_ARCH, family_of
from hetero_infer.engine.models.gemma3_mm import Gemma3ForConditionalGeneration
from hetero_infer.engine.models.gemma3_vision import Gemma3Vision, GemmaRMSNorm
from hetero_infer.engine.models.siglip import SiglipVisionConfig
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.worker.model_loader import load_model
from hetero_infer.kernels import select_kernels
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.tiny_models import GEMMA3_TOKENS_PER_IMAGE, pil_processor, save_tiny_gemma3_vision


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_gemma3_vision(tmp_path_factory.mktemp("gemma3_vision"))


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> transformers.Gemma3ForConditionalGeneration:
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def state_dict(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def pixel_values(folder: Path) -> torch.Tensor:
    """Two images through the folder's own processor: [2, 3, 32, 32]."""
    processor = pil_processor(folder)
    gradient = torch.linspace(0, 255, 40 * 30).view(30, 40).to(torch.uint8)
    images = [
        Image.new("RGB", (40, 30), (200, 10, 90)),
        Image.fromarray(torch.stack([gradient, gradient.flip(0), gradient.flip(1)], -1).numpy()),
    ]
    return processor.image_processor(images, return_tensors="pt")["pixel_values"]


def build(folder: Path, state_dict: dict[str, torch.Tensor]) -> Gemma3Vision:
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):  # as the engine builds its models: no memory until loaded
        vision = Gemma3Vision.from_hf(config)
    vision.load_weights(state_dict)
    return vision


def hf_features(model: transformers.PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # [images, 3, S, S] -> [images, tokens, hidden]
        return model.get_image_features(pixel_values=pixel_values).pooler_output.flatten(0, 1)


def test_encode_matches_transformers(
    folder: Path,
    hf_model: transformers.PreTrainedModel,
    state_dict: dict[str, torch.Tensor],
    pixel_values: torch.Tensor,
) -> None:
    assert pixel_values.shape == (2, 3, 32, 32)
    vision = build(folder, state_dict)
    assert vision.mm_tokens_per_image == GEMMA3_TOKENS_PER_IMAGE
    ours = vision.encode(pixel_values)
    assert ours.shape == (2 * GEMMA3_TOKENS_PER_IMAGE, 64) and ours.dtype == torch.float32
    expected = hf_features(hf_model, pixel_values)
    # Peaked random weights: features of size ~1-10, so 1e-5 relative is tight; the two
    # images' features differ.
    assert expected.abs().max() > 1
    assert not torch.allclose(expected[:16], expected[16:], atol=0.1)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_encode_matches_transformers_on_unnatural_pixels(
    folder: Path, hf_model: transformers.PreTrainedModel, state_dict: dict[str, torch.Tensor]
) -> None:
    """Values beyond [-1, 1], three images: nothing in the path relies on real images."""
    pixel_values = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2
    vision = build(folder, state_dict)
    expected = hf_features(hf_model, pixel_values)
    torch.testing.assert_close(vision.encode(pixel_values), expected, rtol=1e-5, atol=1e-5)


def test_encode_in_the_weights_dtype(folder: Path, state_dict: dict[str, torch.Tensor]) -> None:
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    full = build(folder, state_dict).encode(pixel_values)
    bf16 = build(folder, {name: t.to(torch.bfloat16) for name, t in state_dict.items()})
    half = bf16.encode(pixel_values)
    assert half.dtype == torch.bfloat16
    # bf16 keeps 8 bits: a few percent of the features' spread, through 2 layers
    torch.testing.assert_close(half.float(), full, rtol=0.1, atol=0.1 * full.std().item())


@pytest.mark.parametrize(
    "config",
    [{"vision_config": {"image_size": 256}}, {"mm_tokens_per_image": 49}],
    ids=["image size", "tokens per image"],
)
def test_a_config_without_vision_keys_takes_transformers_defaults(config: dict) -> None:
    """transformers saves only what differs from its defaults: a config.json without them
    builds what Gemma3Config's defaults build. (Not all of them: SigLIP's 224 pixels make
    14 x 14 patches, which Gemma 3's 256 tokens do not pool.)"""
    with torch.device("meta"):
        vision = Gemma3Vision.from_hf(config)
    hf = transformers.Gemma3Config(**config)
    assert vision.vision_model.config == SiglipVisionConfig.from_hf(hf.vision_config.to_dict())
    with torch.device("meta"):  # a config object is read as its dict
        assert Gemma3Vision.from_hf(hf).vision_model.config == vision.vision_model.config
    assert vision.mm_tokens_per_image == hf.mm_tokens_per_image
    projection = vision.multi_modal_projector.mm_input_projection_weight
    assert projection.shape == (hf.vision_config.hidden_size, hf.text_config.hidden_size)


def test_the_projector_norm_is_gemmas_where_its_epsilon_counts() -> None:
    """Features near zero, where the epsilon under the root is most of the mean square."""
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)) * 1e-3
    ours = GemmaRMSNorm(8, eps=1e-6)
    theirs = transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(generator=torch.Generator().manual_seed(1))
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=0)
    without = GemmaRMSNorm(8, eps=0.0)
    without.load_state_dict(ours.state_dict())
    assert not torch.allclose(ours(x), without(x), rtol=0.1)  # the epsilon counts here


def test_load_weights_names_what_is_missing(
    folder: Path, state_dict: dict[str, torch.Tensor]
) -> None:
    config = json.loads((folder / "config.json").read_text())
    vision = Gemma3Vision.from_hf(config)
    partial = {k: v for k, v in state_dict.items() if "mm_soft_emb_norm" not in k}
    with pytest.raises(ValueError, match="mm_soft_emb_norm"):
        vision.load_weights(partial)


def test_a_layer_missing_one_of_its_projections_is_named(
    folder: Path, state_dict: dict[str, torch.Tensor]
) -> None:
    """q, k and v join into one product at load only where all three are there."""
    config = json.loads((folder / "config.json").read_text())
    vision = Gemma3Vision.from_hf(config)
    partial = {k: v for k, v in state_dict.items() if not k.endswith("0.self_attn.k_proj.bias")}
    assert len(partial) == len(state_dict) - 1
    with pytest.raises(ConfigError, match=r"missing \[.*layers\.0\.self_attn\.qkv_proj\.bias"):
        vision.load_weights(partial)


@pytest.mark.parametrize(
    ("tokens", "image_size"), [(50, 256), (36, 256)], ids=["not a square", "not a divisor"]
)
def test_tokens_per_image_that_do_not_pool_the_patches_are_refused(
    tokens: int, image_size: int
) -> None:
    """16 x 16 patches pool into 4, 16, 64 or 256 tokens, not 50 (no square) nor 36."""
    config = {"mm_tokens_per_image": tokens, "vision_config": {"image_size": image_size}}
    with torch.device("meta"), pytest.raises(ConfigError, match=f"mm_tokens_per_image {tokens}"):
        Gemma3Vision.from_hf(config)


def text_fields(config: ModelConfig) -> ModelConfig:
    return dataclasses.replace(config, architecture="", vision=None)


# Gemma 3 4B's vision tower (its text model is Gemma3TextConfig's defaults).
GEMMA3_4B_VISION = dict(
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=27,
    num_attention_heads=16,
    image_size=896,
    patch_size=14,
    vision_use_head=False,
)


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "4b"])
def test_model_config_is_the_text_models(folder: Path, tiny: bool) -> None:
    """The decoder's settings from a Gemma3Config equal those from its text config alone
    (as Gemma3ForCausalLM): sliding windows, both RoPE bases, the norms' offset ..."""
    if tiny:
        hf = transformers.AutoConfig.from_pretrained(folder)
    else:
        hf = transformers.Gemma3Config(vision_config=GEMMA3_4B_VISION)
    config = ModelConfig.from_hf(hf)
    text = ModelConfig.from_hf(hf.get_text_config())
    assert config.architecture == "Gemma3ForConditionalGeneration"
    assert text.architecture == "Gemma3ForCausalLM"
    assert text_fields(config) == text_fields(text)
    assert config.vision is not None and config.vision.image_token_id == hf.image_token_index
    if tiny:
        assert config.sliding_windows == (24, None, 24)
        assert config.sliding_rope_theta == 10_000.0 and config.rope_theta == 1_000_000.0
        assert config.vision.image_token_id == 388 and config.vocab_size == 389
    else:  # 64 x 64 patches pooled 4 x 4 into 256 tokens
        assert config.vision.image_token_id == 262_144
        with torch.device("meta"):
            vision = Gemma3Vision.from_hf(config.vision.hf_config)
        assert vision.mm_tokens_per_image == 256
        assert vision.multi_modal_projector.kernel_size == 4
        assert len(vision.vision_model.encoder.layers) == 27


def test_families() -> None:
    """ "gemma3" GGUF files stay the text Gemma 3's; a config naming no architecture finds
    the multimodal family by its model_type."""
    assert BY_GGUF_ARCH["gemma3"].architecture == "Gemma3ForCausalLM"
    bare = transformers.Gemma3Config()
    bare.architectures = None
    assert family_of(bare).architecture == "Gemma3ForConditionalGeneration"


def renamed_copy(folder: Path, out: Path, naming: str) -> Path:
    """The checkpoint in ``folder`` (as transformers 5 saves it) under another naming:
    "hub", the Hub's Gemma 3 files' (the tower under vision_tower.vision_model.), or
    "module", the model's own state dict's (model.language_model.*, lm_head.weight)."""
    shutil.copytree(folder, out)
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, tensor in tensors.items():
        if naming == "hub":
            name = name.replace("vision_tower.", "vision_tower.vision_model.", 1)
        else:
            for old, new in [
                ("language_model.model.", "model.language_model."),
                ("language_model.lm_head.", "lm_head."),
                ("vision_tower.", "model.vision_tower.vision_model."),
                ("multi_modal_projector.", "model.multi_modal_projector."),
            ]:
                if name.startswith(old):
                    name = new + name.removeprefix(old)
                    break
        renamed[name] = tensor
    assert len(renamed) == len(tensors)
    save_file(renamed, out / "model.safetensors", metadata={"format": "pt"})
    return out


def engine_model(folder: Path) -> Gemma3ForConditionalGeneration:
    source = loader.resolve_model(str(folder))
    config = ModelConfig.from_hf(loader.load_config(source))
    kernels = select_kernels("auto", torch.device("cpu"))
    model = load_model(source, config, kernels, torch.device("cpu"), torch.float32)
    assert isinstance(model, Gemma3ForConditionalGeneration)
    return model


@pytest.fixture(scope="module")
def text_only(folder: Path, hf_model: transformers.PreTrainedModel, tmp_path_factory) -> Path:
    """The same text model as a Gemma3ForCausalLM checkpoint."""
    text = transformers.Gemma3ForCausalLM(hf_model.config.get_text_config()).eval()
    weights = {f"model.{k}": v for k, v in hf_model.model.language_model.state_dict().items()}
    weights["lm_head.weight"] = hf_model.lm_head.weight
    text.load_state_dict(weights)
    out = tmp_path_factory.mktemp("gemma3_text")
    text.save_pretrained(out)
    return out


@pytest.mark.parametrize("naming", ["transformers", "hub", "module"])
def test_engine_loads_the_model(
    naming: str,
    folder: Path,
    text_only: Path,
    hf_model: transformers.PreTrainedModel,
    pixel_values: torch.Tensor,
    tmp_path: Path,
) -> None:
    """Under each naming: the vision side gives transformers' features, and the decoder
    holds what the engine loads from the text model alone as Gemma3ForCausalLM."""
    if naming != "transformers":
        folder = renamed_copy(folder, tmp_path / naming, naming)
        if naming == "hub":  # transformers reads it too, as the same model
            same = transformers.Gemma3ForConditionalGeneration.from_pretrained(
                folder, dtype=torch.float32
            )
            torch.testing.assert_close(
                hf_features(same.eval(), pixel_values), hf_features(hf_model, pixel_values)
            )
    model = engine_model(folder)
    expected = hf_features(hf_model, pixel_values)
    ours = model.encode_images(list(pixel_values.split(1)))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    source = loader.resolve_model(str(text_only))
    config = ModelConfig.from_hf(loader.load_config(source))
    assert config.architecture == "Gemma3ForCausalLM"
    kernels = select_kernels("auto", torch.device("cpu"))
    text = load_model(source, config, kernels, torch.device("cpu"), torch.float32)
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("vision.")}
    theirs = text.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
