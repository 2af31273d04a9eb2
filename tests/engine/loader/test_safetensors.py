"""engine/loader/safetensors.py and metadata.py on safetensors checkpoints: weights and
config match what transformers saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine.loader import ModelSource, load_config, load_state_dict, resolve_model

from tests.engine.loader.tiny_configs import tiny_llama, tiny_qwen2


@pytest.mark.parametrize(
    ("make_config", "tie", "shard"),
    [(tiny_llama, False, False), (tiny_llama, True, True), (tiny_qwen2, True, False)],
    ids=["llama-untied", "llama-tied-sharded", "qwen2-tied"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_safetensors_round_trip(
    tmp_path: Path, make_config, tie: bool, shard: bool, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    config = make_config(tie)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path, max_shard_size="40KB" if shard else "5GB")
    if shard:
        assert (tmp_path / "model.safetensors.index.json").is_file()

    source = resolve_model(str(tmp_path))
    assert source == ModelSource(tmp_path)
    assert load_config(source).architectures == [type(model).__name__]

    ours = load_state_dict(source, dtype)
    expected = model.state_dict()
    # A tied lm_head is not saved; the model runner ties it to the embedding.
    want_keys = set(expected) - ({"lm_head.weight"} if tie else set())
    assert set(ours) == want_keys
    for name, tensor in ours.items():
        assert tensor.dtype == dtype and tensor.device.type == "cpu"
        assert torch.equal(tensor, expected[name].to(dtype)), name
    if make_config is tiny_qwen2:
        assert "model.layers.0.self_attn.q_proj.bias" in ours


def test_stray_safetensors_outside_the_index_are_ignored(tmp_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_config(tiny_llama(tie=False))
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    # Mistral repos carry a second, mistral-native copy of the weights like this.
    (tmp_path / "consolidated.safetensors").write_bytes(b"not read")
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    ours = load_state_dict(resolve_model(str(tmp_path)), torch.float32)
    assert set(ours) == set(weight_map["weight_map"])


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_config(resolve_model(str(tmp_path)))
