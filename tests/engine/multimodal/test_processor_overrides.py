"""mm_processor_kwargs (vLLM's --mm-processor-kwargs): the engine's image processor takes
them over its folder's settings, so an image's prompt holds the tokens the settings give
it; settings that would change the vision encoder's input, and any for a model that
takes no images, are refused at start, naming them. (That each processor's overridden
settings give transformers' pixels to the bit is its own test file's.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.multimodal.qwen2_vl_images import Qwen2VLImageProcessor
from hetero_infer.engine.settings.exceptions import ConfigError

from tests.engine.multimodal.test_idefics3_images import noise
from tests.tiny_models import save_tiny_model, save_tiny_qwen2_5_vl

SMALLER = {"max_pixels": 28 * 28 * 4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


def image_tokens(engine: LLMEngine) -> int:
    """How many tokens one 300 x 200 image takes in a prompt."""
    processor = engine.input_processor
    marker = processor.image_prompts.processor.marker
    prompt = processor.tokenize(engine.tokenizer.encode(f"look: {marker}"))
    expanded = processor.with_images(prompt, [noise("RGB", 300, 200)])
    return len(expanded.token_ids) - len(prompt.token_ids)


def test_the_engines_processor_takes_them_over_its_folders(folder: Path) -> None:
    default = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    smaller = LLMEngine(
        EngineConfig(model=str(folder), dtype="float32", mm_processor_kwargs=SMALLER)
    )
    expected = replace(Qwen2VLImageProcessor.from_folder(folder, SMALLER), cpu_kernels=True)
    assert smaller.input_processor.image_prompts.processor == expected
    assert 0 < image_tokens(smaller) < image_tokens(default)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"patch_size": 7}, "patch_size"),  # the encoder's input: the model's own
        ({"max_pixels": 900, "merge_size": 1, "nonsense": 1}, "merge_size, nonsense"),
        ("max_pixels=900", "must be a JSON object"),
    ],
)
def test_what_would_change_the_encoders_input_is_refused(folder: Path, kwargs, named) -> None:
    with pytest.raises(ConfigError, match="mm_processor_kwargs") as refused:
        LLMEngine(EngineConfig(model=str(folder), dtype="float32", mm_processor_kwargs=kwargs))
    assert named in str(refused.value)


def test_a_model_without_images_refuses_them(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path / "llama")
    with pytest.raises(ConfigError, match="mm_processor_kwargs: this model takes no images"):
        LLMEngine(EngineConfig(model=str(folder), mm_processor_kwargs=SMALLER))
    assert LLMEngine(EngineConfig(model=str(folder), mm_processor_kwargs={})).input_processor
