"""bench/roofline.py: the decode-step byte and FLOP arithmetic, checked by hand on a
tiny shape, and one real step timing on a tiny random model."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hetero_infer.kernels.quantized import QuantizedWeight

from bench.roofline import (
    ModelShape,
    StepCost,
    blocks_needed,
    build_engine,
    check_targets,
    matmul_only_seconds,
    measure_projections,
    quantized_bytes_saved,
    roofline_bound,
    step_cost,
    step_rows,
    time_decode_step,
    time_engine_steps,
)
from tests.tiny_models import save_tiny_model

# 2 layers, hidden 8, 2 heads of 4 (q: 8), 1 KV head (kv: 4), MLP 16, vocab 32.
TINY = ModelShape(
    num_layers=2,
    hidden_size=8,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    vocab_size=32,
    tie_word_embeddings=False,
)


def test_projections_by_hand() -> None:
    assert TINY.layer_projections() == {
        "qkv": (8, 8 + 4 + 4),
        "o": (8, 8),
        "gate_up": (8, 32),
        "down": (16, 8),
    }
    assert TINY.projections()["lm_head"] == (8, 32)
    # qkv 128 + o 64 + gate_up 256 + down 128 = 576; norms 2 * 8
    assert TINY.layer_matmul_params == 576
    assert TINY.layer_params == 592
    # layers 1184 + final norm 8 + embedding 256 + lm_head 256
    assert TINY.num_params == 1704


def test_step_cost_by_hand() -> None:
    # batch 3, 10 positions, bf16 (2 bytes)
    cost = step_cost(TINY, batch=3, kv_positions=10, element_size=2)
    # weights: layers 1184 + norm 8 + lm_head 256 + the batch's embedding rows 3 * 8
    assert cost.weight_bytes == (1184 + 8 + 256 + 24) * 2 == 2944
    # K and V: 2 * layers 2 * kv heads 1 * head dim 4 * positions 10 * batch 3 * 2 bytes
    assert cost.kv_bytes == 960
    assert cost.bytes == 3904
    # 2 * (layers 2 * 576 + lm_head 256) * batch 3
    assert cost.matmul_flops == 8448
    # 4 * layers 2 * heads 2 * head dim 4 * positions 10 * batch 3
    assert cost.attention_flops == 1920
    assert cost.flops == 10368


def test_tied_embedding_is_read_once() -> None:
    tied = ModelShape(**{**TINY.__dict__, "tie_word_embeddings": True})
    assert tied.num_params == 1704 - 256
    one = step_cost(tied, batch=1, kv_positions=10, element_size=4)
    many = step_cost(tied, batch=64, kv_positions=10, element_size=4)
    # No per-token embedding rows: the weights cost the same at any batch.
    assert one.weight_bytes == many.weight_bytes == (1184 + 8 + 256) * 4
    assert many.matmul_flops == 64 * one.matmul_flops


def test_bound_is_the_larger_roof() -> None:
    cost = StepCost(weight_bytes=6_000_000_000, kv_bytes=0, matmul_flops=10**12, attention_flops=0)
    # 6 GB at 12 GB/s: 0.5 s; 1 TFLOP at 0.1 TFLOP/s: 10 s
    bound = roofline_bound(cost, read_gbps=12.0, matmul_tflops=0.1)
    assert bound["bandwidth_s"] == pytest.approx(0.5)
    assert bound["compute_s"] == pytest.approx(10.0)
    assert bound["bound_s"] == pytest.approx(10.0)
    assert roofline_bound(cost, 12.0, 100.0)["bound_s"] == pytest.approx(0.5)


def test_rows_and_targets() -> None:
    element_size = 2
    times = {1: [0.002, 0.001, 0.003], 64: [0.5]}
    rows = step_rows(TINY, [1, 64], 10, element_size, 1e-6, 1e-9, times)
    one, big = rows
    assert one["step_s"] == 0.002 and one["step_min_s"] == 0.001
    assert one["tokens_per_s"] == pytest.approx(500.0)
    assert big["tokens_per_s"] == pytest.approx(128.0)
    cost = step_cost(TINY, 1, 10, element_size)
    assert one["bandwidth_s"] == pytest.approx(cost.bytes / 1e3)
    assert one["achieved_gbps"] == pytest.approx(cost.bytes / 0.002 / 1e9)
    assert one["step_over_bound"] == pytest.approx(0.002 / one["bound_s"])
    # Made-up figures: batch 1 at 1.5x the bandwidth bound (the limit itself), batch 64
    # at 41% of the bf16 matmul throughput, then just under the limits' other sides.
    one["step_over_bandwidth_bound"] = 1.5
    big["achieved_tflops"] = 0.041
    targets = check_targets(rows, bf16_tflops=0.1)
    assert targets["batch1_bandwidth"]["met"]
    assert targets["batch64_matmul"]["fraction_of_bf16_matmul"] == pytest.approx(0.41)
    assert targets["batch64_matmul"]["met"]
    one["step_over_bandwidth_bound"] = 1.51
    assert not check_targets(rows, bf16_tflops=0.1)["batch1_bandwidth"]["met"]
    big["achieved_tflops"] = 0.039
    assert not check_targets(rows, bf16_tflops=0.1)["batch64_matmul"]["met"]
    assert check_targets(rows[:1], 0.1).keys() == {"batch1_bandwidth"}


def test_blocks_needed() -> None:
    # context 256 + the new token: 17 blocks of 16 per sequence
    assert blocks_needed(batch=4, context=256, block_size=16) == 68
    assert blocks_needed(batch=1, context=15, block_size=16) == 1


def test_matmul_only_seconds() -> None:
    projections = [
        {"projection": name, "batch": 1, "seconds": s}
        for name, s in [("qkv", 1.0), ("o", 2.0), ("gate_up", 3.0), ("down", 4.0), ("lm_head", 5.0)]
    ]
    assert matmul_only_seconds(TINY, projections, 1) == 2 * 10.0 + 5.0


def test_measure_projections_runs() -> None:
    rows = measure_projections(
        TINY, [1, 2], torch.float32, torch.device("cpu"), repeats=1, flush_bytes=4096
    )
    assert {(r["projection"], r["batch"]) for r in rows} == {
        (name, b) for name in TINY.projections() for b in (1, 2)
    }
    assert all(r["seconds"] > 0 and math.isfinite(r["tflops"]) for r in rows)


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory):
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return build_engine(str(folder), "float32", max_batch=3, context=20, device="cpu")


def test_shape_matches_the_engine_model(tiny_engine) -> None:
    shape = ModelShape.from_config(tiny_engine.model_config)
    params = sum(p.numel() for p in tiny_engine.runner.model.parameters())
    assert shape.num_params == params
    # Tied embeddings: every parameter is read once by a decode step.
    assert step_cost(shape, 3, 21, 4).weight_bytes == params * 4
    proj = shape.layer_projections()
    attn = tiny_engine.runner.model.layers[0].self_attn
    assert proj["qkv"] == (attn.qkv_proj.in_features, attn.qkv_proj.out_features)


def test_time_decode_step_on_a_tiny_model(tiny_engine) -> None:
    runner = tiny_engine.runner
    assert runner.num_blocks >= blocks_needed(3, 20, runner.block_size)
    for batch in (1, 3):
        times = time_decode_step(runner, batch, context=20, repeats=2, warmup=1)
        assert len(times) == 2
        assert all(0 < t < 10 for t in times)
    with pytest.raises(ValueError, match="KV blocks"):
        time_decode_step(runner, 4, context=20, repeats=1, warmup=0)


def test_folder_name_is_kept(tmp_path: Path) -> None:
    from bench.roofline import resolve_model

    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_time_engine_steps_leaves_the_engine_empty(tiny_engine) -> None:
    for batch in (1, 3):
        times = time_engine_steps(tiny_engine, batch, context=20, repeats=3, warmup=1)
        assert len(times) == 3 and all(0 < t < 10 for t in times)
        assert not tiny_engine.has_pending_work()
        assert tiny_engine.block_manager.num_free_blocks == tiny_engine.runner.num_blocks


def test_quantized_bytes_saved() -> None:
    q4 = QuantizedWeight("Q4_0", torch.zeros(32, 18, dtype=torch.uint8), (32, 32))  # 576 B
    int8 = QuantizedWeight("I8", torch.zeros(16, 32, dtype=torch.int8), (16, 32), torch.ones(16))

    def model(lm_head: object, embed: QuantizedWeight | None) -> SimpleNamespace:
        layers = [SimpleNamespace(quantized=q4), SimpleNamespace(quantized=None), SimpleNamespace()]
        return SimpleNamespace(modules=lambda: layers, lm_head=lm_head, embed_quantized=embed)

    # bf16: 32 x 32 x 2 = 2048 bytes in the dtype, 576 stored.
    assert quantized_bytes_saved(model(object(), None), 2) == 2048 - 576
    # A tied quantized embedding is read whole by the lm_head; an untied one is not.
    assert quantized_bytes_saved(model(None, int8), 2) == 2048 - 576 + 1024 - (512 + 64)
    assert quantized_bytes_saved(model(object(), int8), 2) == 2048 - 576
    shape_cost = step_cost(TINY, 1, 10, 2)
    assert step_cost(TINY, 1, 10, 2, bytes_saved=100).weight_bytes == shape_cost.weight_bytes - 100
