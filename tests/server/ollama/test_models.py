"""server/ollama/models.py's model_info, as /api/show gives it: an MoE model's experts
under the GGUF names Ollama shows, none for a dense model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.server.ollama.model_facts import parameter_count
from hetero_infer.server.ollama.models import _model_info

from tests.tiny_models import TINY_MODELS


@pytest.mark.parametrize("family", ["qwen3_moe", "llama"])
def test_model_info_names_the_experts(family: str):
    hf = TINY_MODELS[family]()
    config = ModelConfig.from_hf(hf)
    engine = SimpleNamespace(model_config=config, max_model_len=512)
    facts = SimpleNamespace(parameter_count=parameter_count(config))
    info = _model_info(engine, facts)
    assert info["general.parameter_count"] == facts.parameter_count
    assert info[f"{family}.context_length"] == 512
    assert info[f"{family}.block_count"] == hf.num_hidden_layers
    experts = {key: value for key, value in info.items() if ".expert_" in key}
    if family == "llama":
        assert experts == {}
    else:
        assert experts == {
            "qwen3_moe.expert_count": hf.num_experts,
            "qwen3_moe.expert_used_count": hf.num_experts_per_tok,
            "qwen3_moe.expert_feed_forward_length": hf.moe_intermediate_size,
        }
