"""engine/loader/gguf.py: GGUF tensors kept quantized are the dequantized ones (which are
exactly what transformers loads: tests/engine/test_smollm2.py, beside its one load of
the file), and the file's metadata converts to its config and tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from hetero_infer.engine.loader import (
    ModelSource,
    load_config,
    load_state_dict,
    load_tokenizer,
    resolve_model,
)
from hetero_infer.engine.loader.gguf import gguf_hf_name, unpermute_rows
from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder, own_tokenizer_type
from hetero_infer.kernels.quantized import QuantizedWeight
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES


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
        assert np.array_equal(unpermute_rows(llama_cpp_permute(w, n_head), n_head), w)


def test_unexpected_gguf_tensor_is_an_error() -> None:
    assert gguf_hf_name("blk.7.ffn_up.weight") == "model.layers.7.mlp.up_proj.weight"
    assert gguf_hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ffn_gate_exps.weight"):
        gguf_hf_name("blk.0.ffn_gate_exps.weight")


@pytest.fixture(scope="module")
def smollm2() -> ModelSource:
    return resolve_model(None)


@pytest.fixture(scope="module")
def smollm2_ours(smollm2: ModelSource) -> dict[str, torch.Tensor]:
    return load_state_dict(smollm2, torch.float32)


@pytest.mark.slow
def test_gguf_kept_quantized_dequantizes_to_the_same_tensors(
    smollm2: ModelSource, smollm2_ours: dict[str, torch.Tensor]
) -> None:
    kept = load_state_dict(smollm2, torch.float32, keep_quantized=True)
    assert set(kept) == set(smollm2_ours)
    qtypes = {name: t.qtype for name, t in kept.items() if isinstance(t, QuantizedWeight)}
    # Every matrix of the file stays in its blocks (the norms are F32 in the file).
    assert qtypes["model.embed_tokens.weight"] == "Q8_0"
    assert qtypes["model.layers.0.self_attn.q_proj.weight"] == "Q4_1"
    assert len(qtypes) == 1 + 30 * 7
    for name, tensor in kept.items():
        # Quantized q/k rows were reordered as bytes: their values must be the
        # un-permuted rows that the dequantizing load gives.
        values = tensor.dequantize() if isinstance(tensor, QuantizedWeight) else tensor
        assert torch.equal(values, smollm2_ours[name]), name
    bytes_kept = sum(t.nbytes for t in kept.values() if isinstance(t, QuantizedWeight))
    assert bytes_kept < 0.3 * sum(smollm2_ours[name].nbytes for name in qtypes)


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


def test_a_family_tokenizer_is_named_and_a_generic_one_left_to_auto_tokenizer() -> None:
    def type_of(model_type: str) -> str | None:
        return own_tokenizer_type(transformers.AutoConfig.for_model(model_type))

    assert type_of("gemma3_text") == "gemma3_text" and type_of("qwen2") == "qwen2"
    # Llama's class is chosen by AutoTokenizer's checks; Mistral's is the generic backend.
    assert type_of("llama") is None and type_of("mistral") is None


@pytest.mark.slow
def test_the_named_tokenizer_is_the_one_auto_tokenizer_picks_by_the_config() -> None:
    """Gemma 3's file, converted with its tokenizer class named (own_tokenizer_type):
    AutoTokenizer, given the converted config, takes the same class, and the tokenizer
    keeps the file's special tokens."""
    folder = gguf_metadata_folder(resolve_model("gemma-3-270m"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    assert own_tokenizer_type(config) == config.model_type
    assert type(tokenizer).__name__ == TOKENIZER_MAPPING_NAMES[config.model_type]
    assert tokenizer.bos_token == "<bos>" and tokenizer.eos_token == "<eos>"
