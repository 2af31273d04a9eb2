"""engine/models/qwen2_5_vl_vision.py and qwen2_5_vl.py: Qwen2.5-VL's vision transformer
gives transformers' image features for the same patches, images of different grids in
one call (window attention splitting them), and the engine loads the whole model under
each naming it comes in, its text model as Qwen2's, on the tiny random Qwen2.5-VL
(tests/tiny_models.py)."""

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
from hetero_infer.engine.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from hetero_infer.engine.models.qwen2_5_vl_vision import Qwen2_5_VLVision
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.worker.model_loader import load_model
from hetero_infer.kernels import select_kernels
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.tiny_models import (
    QWEN2_5_VL_MROPE_SECTION,
    pil_image_processor,
    qwen2_5_vl_processor,
    save_tiny_qwen2_5_vl,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> transformers.Qwen2_5_VLForConditionalGeneration:
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def state_dict(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def images() -> list[Image.Image]:
    gradient = torch.linspace(0, 255, 50 * 70).view(50, 70).to(torch.uint8)
    return [
        Image.new("RGB", (48, 32), (200, 10, 90)),
        Image.fromarray(torch.stack([gradient, gradient.flip(0), gradient.flip(1)], -1).numpy()),
        Image.new("RGB", (20, 60), (1, 100, 200)),
    ]


@pytest.fixture(scope="module")
def processed(folder: Path) -> transformers.BatchFeature:
    """Three images through the folder's own image processor."""
    image_processor = pil_image_processor(folder)
    return image_processor(images(), return_tensors="pt")


def per_image(processed: transformers.BatchFeature) -> list[torch.Tensor]:
    """The processor's patches, each image's as [grid_h, grid_w, patch values]."""
    out, offset = [], 0
    for _, h, w in processed["image_grid_thw"].tolist():
        out.append(processed["pixel_values"][offset : offset + h * w].view(h, w, -1))
        offset += h * w
    return out


def build(folder: Path, state_dict: dict[str, torch.Tensor]) -> Qwen2_5_VLVision:
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):  # as the engine builds its models: no memory until loaded
        vision = Qwen2_5_VLVision.from_hf(config)
    vision.load_weights(state_dict)
    return vision


def hf_features(
    model: transformers.PreTrainedModel, processed: transformers.BatchFeature
) -> torch.Tensor:
    with torch.no_grad():
        out = model.model.get_image_features(processed["pixel_values"], processed["image_grid_thw"])
    return torch.cat(out.pooler_output)


def test_encode_matches_transformers(
    folder: Path,
    hf_model: transformers.PreTrainedModel,
    state_dict: dict[str, torch.Tensor],
    processed: transformers.BatchFeature,
) -> None:
    grids = processed["image_grid_thw"].tolist()
    assert grids == [[1, 8, 12], [1, 12, 18], [1, 16, 4]]
    vision = build(folder, state_dict)
    # Windows of 2 x 2 merged patches: 6, 15 (some partial) and 4 windows.
    windows = [len(vision.window_order(h, w)[1]) for _, h, w in grids]
    assert windows == [6, 15, 4]
    ours = vision.encode(per_image(processed))
    tokens = sum(h * w for _, h, w in grids) // 4
    assert ours.shape == (tokens, 64) and ours.dtype == torch.float32
    expected = hf_features(hf_model, processed)
    assert expected.abs().max() > 1
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    # One image alone gives its rows of the three.
    torch.testing.assert_close(vision.encode(per_image(processed)[1:2]), expected[24:78])


def test_a_window_of_one_merged_patch_matches_transformers(
    folder: Path, hf_model: transformers.PreTrainedModel, state_dict: dict[str, torch.Tensor]
) -> None:
    """A 40 x 24 image: 3 x 5 merged patches in windows of 2 x 2, the last of them one
    merged patch alone."""
    image = Image.new("RGB", (40, 24), (9, 99, 199))
    processed = pil_image_processor(folder)([image], return_tensors="pt")
    assert processed["image_grid_thw"].tolist() == [[1, 6, 10]]
    vision = build(folder, state_dict)
    assert vision.window_order(6, 10)[1] == [16, 16, 8, 8, 8, 4]
    expected = hf_features(hf_model, processed)
    torch.testing.assert_close(vision.encode(per_image(processed)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grid", [(5, 4), (4, 5)])
def test_a_grid_that_does_not_merge_is_refused(
    folder: Path, state_dict: dict[str, torch.Tensor], grid: tuple[int, int]
) -> None:
    vision = build(folder, state_dict)
    patch_values = 3 * 2 * 4 * 4  # channels x temporal patch x patch side squared
    with pytest.raises(ValueError, match=f"a {grid[0]} x {grid[1]} patch grid does not merge"):
        vision.encode([torch.zeros(*grid, patch_values)])


@pytest.mark.parametrize("act", ["gelu", "quick_gelu"])
def test_other_activations_and_rope_bases_match_transformers(
    folder: Path,
    tmp_path: Path,
    state_dict: dict[str, torch.Tensor],
    processed: transformers.BatchFeature,
    act: str,
) -> None:
    """The tiny tower's weights under another MLP activation and RoPE base (the tiny
    model has silu and 10,000), as transformers reads them from a config.json."""
    variant = tmp_path / "variant"
    shutil.copytree(folder, variant)
    config = json.loads((folder / "config.json").read_text())
    rope = {"rope_type": "axial", "rope_theta": 50.0}
    config["vision_config"] |= {"hidden_act": act, "rope_parameters": rope}
    (variant / "config.json").write_text(json.dumps(config))
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        variant, dtype=torch.float32
    ).eval()
    expected = hf_features(hf_model, processed)
    ours = build(variant, state_dict).encode(per_image(processed))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, build(folder, state_dict).encode(per_image(processed)))


@pytest.mark.parametrize(
    ("vision_config", "message"),
    [
        ({"hidden_size": 30, "num_heads": 4}, "4 heads of 30 dims"),
        ({"hidden_size": 24, "num_heads": 4}, "4 heads of 24 dims"),  # 6 each
        ({"window_size": 27}, "window_size 27 too small"),
    ],
    ids=["heads do not divide", "not 4k dims a head", "window under a merged patch"],
)
def test_towers_it_cannot_build_are_refused(vision_config: dict, message: str) -> None:
    """Each axis of the 2D RoPE takes a quarter of a head's dims in pairs; a window of
    fewer pixels than a merged patch (2 x 14) holds none."""
    with torch.device("meta"), pytest.raises(ConfigError, match=message):
        Qwen2_5_VLVision.from_hf({"vision_config": vision_config})
    edges = {"hidden_size": 16, "num_heads": 4, "window_size": 28}  # 4 dims, a window of 1
    with torch.device("meta"):
        assert Qwen2_5_VLVision.from_hf({"vision_config": edges}).window == 1


def test_encode_in_the_weights_dtype(
    folder: Path, state_dict: dict[str, torch.Tensor], processed: transformers.BatchFeature
) -> None:
    full = build(folder, state_dict).encode(per_image(processed))
    bf16 = build(folder, {name: t.to(torch.bfloat16) for name, t in state_dict.items()})
    half = bf16.encode(per_image(processed))
    assert half.dtype == torch.bfloat16
    # bf16 keeps 8 bits, through 2 blocks of large random weights: a few percent overall
    # (a rare value, near a cancellation, further off)
    assert (half.float() - full).norm() / full.norm() < 0.05


def test_load_weights_names_what_is_missing(
    folder: Path, state_dict: dict[str, torch.Tensor]
) -> None:
    config = json.loads((folder / "config.json").read_text())
    vision = Qwen2_5_VLVision.from_hf(config)
    partial = {k: v for k, v in state_dict.items() if "merger.ln_q" not in k}
    with pytest.raises(ValueError, match="ln_q"):
        vision.load_weights(partial)


def described(config: dict | transformers.PretrainedConfig) -> tuple:
    """What a tower built from ``config`` is made of: its tensors' shapes, its patch and
    window sizes, its full-attention blocks and RoPE's share of a head."""
    with torch.device("meta"):
        vision = Qwen2_5_VLVision.from_hf(config)
    shapes = {name: t.shape for name, t in vision.state_dict().items()}
    return shapes, vision.patch_size, vision.window, vision.fullatt_blocks, vision.rope_dim


def test_a_config_without_vision_keys_takes_transformers_defaults() -> None:
    """transformers saves only what differs from its defaults: a config.json that leaves
    out every vision key builds the tower Qwen2_5_VLConfig's defaults describe."""
    defaults = transformers.Qwen2_5_VLConfig().vision_config.to_dict()
    assert described({}) == described({"vision_config": defaults})


def test_the_hubs_other_names_and_a_config_object_build_the_same_tower() -> None:
    """The Hub's first configs name heads, layers and channels as other ViTs do; a
    transformers Qwen2_5_VLConfig is read as its dict."""
    sizes = {"hidden_size": 64, "intermediate_size": 48, "out_hidden_size": 64}
    ours = {"num_heads": 4, "depth": 2, "in_channels": 1, **sizes}
    hubs = {"num_attention_heads": 4, "num_hidden_layers": 2, "in_chans": 1, **sizes}
    tower = described({"vision_config": ours})
    assert tower != described({"vision_config": sizes})  # each name changes the tower
    assert described({"vision_config": hubs}) == tower
    assert described(transformers.Qwen2_5_VLConfig(vision_config=ours)) == tower


def test_tiny_folder(folder: Path, hf_model: transformers.PreTrainedModel) -> None:
    """The folder's tokenizer, template and image processor make Qwen2_5_VLProcessor's
    inputs (AutoProcessor's where torchvision is installed), on which its model generates."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    names = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|im_end|>")
    assert [tokenizer.convert_tokens_to_ids(t) for t in names] == [386, 388, 387, 385]
    assert len(tokenizer) == 390
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    processor = qwen2_5_vl_processor(folder)
    inputs = processor(text=[text], images=images()[:1], return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 12]]
    assert (inputs["input_ids"] == 388).sum() == 24  # 8 x 12 patches merged 2 x 2
    assert torch.equal(inputs["mm_token_type_ids"].bool(), inputs["input_ids"] == 388)
    out = hf_model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 4)


# Qwen2.5-VL-3B-Instruct's config.json (its text model's settings at the top level).
HUB_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "max_window_layers": 70,
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}


def text_fields(config: ModelConfig) -> ModelConfig:
    return dataclasses.replace(config, architecture="", vision=None, mrope_section=None)


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "3b"])
def test_model_config_is_the_text_models(folder: Path, tiny: bool) -> None:
    """The decoder's settings from a Qwen2_5_VLConfig equal those from its text config
    read as Qwen2's: q/k/v biases, no sliding window, plain RoPE, M-RoPE's sections."""
    hf = (
        transformers.AutoConfig.from_pretrained(folder)
        if tiny
        else transformers.Qwen2_5_VLConfig(**HUB_3B)
    )
    config = ModelConfig.from_hf(hf)
    text_config = hf.get_text_config()
    text_config.architectures = ["Qwen2ForCausalLM"]
    text_config.tie_word_embeddings = hf.tie_word_embeddings
    text = ModelConfig.from_hf(text_config)
    assert config.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert text_fields(config) == text_fields(text)
    assert text.mrope_section == config.mrope_section
    assert config.qkv_bias and not config.o_bias and config.rope_scaling is None
    assert config.sliding_windows == (None,) * config.num_layers
    assert config.rope_theta == 1_000_000.0
    assert config.vision is not None and config.vision.image_token_id == hf.image_token_id
    assert not config.vision.bidirectional
    if tiny:
        assert config.mrope_section == QWEN2_5_VL_MROPE_SECTION
        assert not config.tie_word_embeddings and config.eos_token_ids == (2, 385)
        assert config.vision.image_token_id == 388 and config.vocab_size == 390
    else:
        assert config.mrope_section == (16, 24, 24) and config.tie_word_embeddings
        assert config.head_dim == 128 and config.vision.image_token_id == 151655
        with torch.device("meta"):
            vision = Qwen2_5_VLVision.from_hf(config.vision.hf_config)
        assert len(vision.blocks) == 32 and vision.fullatt_blocks == {7, 15, 23, 31}
        assert vision.window == 4 and vision.merger.mlp[2].out_features == 2048


def test_families_and_other_models() -> None:
    """ "qwen2" GGUF files stay Qwen2's; a config naming no architecture finds the
    family by its model_type; other models have no M-RoPE."""
    assert BY_GGUF_ARCH["qwen2"].architecture == "Qwen2ForCausalLM"
    assert BY_GGUF_ARCH["qwen2vl"].architecture == "Qwen2_5_VLForConditionalGeneration"
    bare = transformers.Qwen2_5_VLConfig()
    bare.architectures = None
    assert family_of(bare).architecture == "Qwen2_5_VLForConditionalGeneration"
    qwen2 = transformers.Qwen2Config(architectures=["Qwen2ForCausalLM"])
    assert ModelConfig.from_hf(qwen2).mrope_section is None


def renamed_copy(folder: Path, out: Path) -> Path:
    """The checkpoint in ``folder`` (as the Hub's files and transformers 5's save_pretrained
    name it) under a model's own state dict's names (model.language_model.*,
    model.visual.*)."""
    shutil.copytree(folder, out)
    tensors = load_file(folder / "model.safetensors")
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith("model."):
            name = "model.language_model." + name.removeprefix("model.")
        elif name.startswith("visual."):
            name = "model." + name
        renamed[name] = tensor
    save_file(renamed, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def text_only(folder: Path, hf_model: transformers.PreTrainedModel, tmp_path_factory) -> Path:
    """The same text model as a Qwen2ForCausalLM checkpoint."""
    text_config = hf_model.config.get_text_config()
    qwen2 = transformers.Qwen2Config(**{**text_config.to_dict(), "model_type": "qwen2"})
    qwen2.rope_parameters = {"rope_type": "default", "rope_theta": 1_000_000.0}
    text = transformers.Qwen2ForCausalLM(qwen2).eval()
    weights = {f"model.{k}": v for k, v in hf_model.model.language_model.state_dict().items()}
    weights["lm_head.weight"] = hf_model.lm_head.weight
    text.load_state_dict(weights)
    out = tmp_path_factory.mktemp("qwen2_text")
    text.save_pretrained(out)
    return out


@pytest.mark.parametrize("naming", ["transformers", "module"])
def test_engine_loads_the_model(
    naming: str,
    folder: Path,
    text_only: Path,
    hf_model: transformers.PreTrainedModel,
    processed: transformers.BatchFeature,
    tmp_path: Path,
) -> None:
    """Under each naming: the vision side gives transformers' features, and the decoder
    holds what the engine loads from the text model alone as Qwen2ForCausalLM."""
    if naming == "module":
        folder = renamed_copy(folder, tmp_path / naming)
    source = loader.resolve_model(str(folder))
    config = ModelConfig.from_hf(loader.load_config(source))
    kernels = select_kernels("auto", torch.device("cpu"))
    model = load_model(source, config, kernels, torch.device("cpu"), torch.float32)
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    ours = model.encode_images(per_image(processed))
    torch.testing.assert_close(ours, hf_features(hf_model, processed), rtol=1e-5, atol=1e-5)
    source = loader.resolve_model(str(text_only))
    text_config = ModelConfig.from_hf(loader.load_config(source))
    assert text_config.architecture == "Qwen2ForCausalLM"
    text = load_model(source, text_config, kernels, torch.device("cpu"), torch.float32)
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("vision.")}
    theirs = text.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
