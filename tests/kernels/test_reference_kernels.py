"""The torch kernels against Hugging Face's Llama layers and a dense attention; and the
kernels the engine selects on the CPU, which in fp32 must match them as exactly."""

from __future__ import annotations

import pytest
import torch
import transformers
from hetero_infer import kernels
from hetero_infer.kernels import AttentionInputs
from hetero_infer.kernels.paged_attention import torch_attention
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

CPU_KERNELS = kernels.select_kernels("auto", torch.device("cpu"))
OPS = {"torch": kernels.KernelOps(), "cpu": CPU_KERNELS.ops}
ATTENTION = {"torch": torch_attention(), "cpu": CPU_KERNELS.attention}


@pytest.fixture(params=sorted(OPS))
def ops(request) -> kernels.KernelOps:
    return OPS[request.param]


@pytest.fixture(params=sorted(ATTENTION))
def attention(request) -> kernels.AttentionBackend:
    return ATTENTION[request.param]


def test_rms_norm_matches_transformers_exactly(ops):
    torch.manual_seed(0)
    hf = LlamaRMSNorm(64, eps=1e-5)
    hf.weight.data.normal_()
    x = torch.randn(7, 64)
    assert torch.equal(ops.rms_norm(x, hf.weight, 1e-5), hf(x))
    residual = torch.randn(7, 64)
    out, new_residual = ops.fused_add_rms_norm(x, residual, hf.weight, 1e-5)
    assert torch.equal(new_residual, residual + x)
    assert torch.equal(out, hf(residual + x))


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rotary_matches_transformers_exactly(ops, rope_parameters):
    config = transformers.LlamaConfig(
        hidden_size=96,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=512,
        rope_parameters=rope_parameters,
    )
    head_dim = 32
    inv_freq = kernels.rope_inv_freq(head_dim, rope_parameters["rope_theta"], rope_parameters)
    cos, sin = kernels.rope_cos_sin(inv_freq, 512)
    hf_rope = LlamaRotaryEmbedding(config)
    positions = torch.tensor([0, 1, 5, 63, 64, 200, 511])
    q = torch.randn(7, 3, head_dim)
    k = torch.randn(7, 1, head_dim)
    hf_cos, hf_sin = hf_rope(q, positions[None])
    # transformers wants [batch, heads, seq, head_dim]
    hf_q, hf_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin
    )
    our_q, our_k = ops.rotary(positions, q, k, cos, sin)
    assert torch.equal(our_q, hf_q[0].transpose(0, 1))
    assert torch.equal(our_k, hf_k[0].transpose(0, 1))


def test_partial_rotary_reordered_heads_match_transformers_exactly(ops):
    """Phi-4-mini's RoPE on 96 of 128 dims: the kernels rotate whole heads reordered by
    partial_rotary_order over the widened tables, giving transformers' rotated dims and
    the passed ones untouched, each in its new place."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_apply

    head_dim, rotary_dim = 128, 96
    inv_freq = kernels.rope_inv_freq(rotary_dim, 10000.0, None)
    hf_cos, hf_sin = kernels.rope_cos_sin(inv_freq, 64)  # transformers' [pos, rotary_dim]
    cos, sin = kernels.rope_tables(head_dim, 10000.0, None, 64, rotary_dim)
    assert cos.shape == (64, head_dim)
    order = kernels.partial_rotary_order(head_dim, rotary_dim)
    assert sorted(order.tolist()) == list(range(head_dim))
    positions = torch.tensor([0, 3, 17, 63])
    q, k = torch.randn(4, 2, head_dim), torch.randn(4, 1, head_dim)
    hf_q, hf_k = phi3_apply(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        hf_cos[positions][None],
        hf_sin[positions][None],
    )
    our_q, our_k = ops.rotary(positions, q[..., order], k[..., order], cos, sin)
    assert torch.equal(our_q, hf_q[0].transpose(0, 1)[..., order])
    assert torch.equal(our_k, hf_k[0].transpose(0, 1)[..., order])


def test_rotary_gptj_style_rotates_adjacent_pairs(ops):
    inv_freq = kernels.rope_inv_freq(8, 10000.0, None)
    cos, sin = kernels.rope_cos_sin(inv_freq, 16)
    positions = torch.tensor([3])
    q = torch.randn(1, 1, 8)
    out, _ = ops.rotary(positions, q, q.clone(), cos, sin, is_neox=False)
    angle = 3 * inv_freq  # one frequency per adjacent pair
    x1, x2 = q[0, 0, 0::2], q[0, 0, 1::2]
    expected = torch.stack(
        (x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), -1
    )
    torch.testing.assert_close(out[0, 0], expected.flatten())


def test_silu_and_mul(ops):
    x = torch.randn(4, 10)
    expected = torch.nn.functional.silu(x[:, :5]) * x[:, 5:]
    assert torch.equal(ops.silu_and_mul(x), expected)


def _dense_attention(q, k, v, scale, window=None, softcap=None, ends=None):
    # q [n_q, H, D] for the last n_q positions of k/v [n_ctx, KVH, D]; ends [n_q]: the
    # keys before ends[i] visible to query i besides the causal ones (an image's)
    n_q, n_ctx = q.shape[0], k.shape[0]
    ratio = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(ratio, dim=1)
    v = v.repeat_interleave(ratio, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(n_ctx - n_q, n_ctx)[:, None]
    k_pos = torch.arange(n_ctx)[None, :]
    mask = k_pos <= q_pos
    if ends is not None:
        mask |= k_pos < ends[:, None]
    if window is not None:
        mask &= k_pos > q_pos - window
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


# Two images whose tokens see each other both ways (Gemma 3): positions 2-5 of the
# first chunk, and 14-18 of the chunk after cached context: the step's
# AttentionInputs.bidirectional_ends (none in the decodes).
IMAGE_ENDS = [0] + [0, 0, 6, 6, 6, 6, 0] + [0, 19, 19, 19, 19, 19] + [0, 0]


@pytest.mark.parametrize("images", [False, True])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("window", [None, 5])
def test_paged_attention_mixed_batch_matches_dense(attention, window, softcap, images):
    """Decodes, a first prefill chunk and a chunk with cached context, blocks shuffled;
    the scores soft-capped too (Gemma 2); tokens of an image seeing the whole image
    (Gemma 3), which the kernels hand over to the torch reference."""
    torch.manual_seed(0)
    block_size, num_blocks, kv_heads, heads, head_dim = 4, 40, 2, 6, 24
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    # (context before this step, new tokens this step)
    shapes = [(9, 1), (0, 7), (13, 6), (3, 1), (0, 1)]
    free = torch.randperm(num_blocks).tolist()
    tables, full_k, full_v = [], [], []
    slots, starts, ctx_lens = [], [0], []
    new_k, new_v, queries = [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        k = torch.randn(total, kv_heads, head_dim)
        v = torch.randn(total, kv_heads, head_dim)
        for p in range(cached):  # already in the cache
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
        slots += [
            table[p // block_size] * block_size + p % block_size for p in range(cached, total)
        ]
        new_k.append(k[cached:])
        new_v.append(v[cached:])
        queries.append(torch.randn(new, heads, head_dim))
        tables.append(table)
        full_k.append(k)
        full_v.append(v)
        starts.append(starts[-1] + new)
        ctx_lens.append(total)
    max_blocks = max(len(t) for t in tables)
    inputs = AttentionInputs(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor(
            [t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int32
        ),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        max_query_len=max(n for _, n in shapes),
        max_context_len=max(ctx_lens),
        bidirectional_ends=torch.tensor(IMAGE_ENDS) if images else None,
    )
    attention.store_kv(torch.cat(new_k), torch.cat(new_v), k_cache, v_cache, inputs.slot_mapping)
    meta = (ATTENTION["torch"] if images else attention).prepare(inputs, block_size, {window})
    out = attention.forward(torch.cat(queries), k_cache, v_cache, meta, 0.3, window, softcap)
    ends = torch.tensor(IMAGE_ENDS).split([n for _, n in shapes])
    expected = torch.cat(
        [
            _dense_attention(q, k, v, 0.3, window, softcap, e if images else None)
            for q, k, v, e in zip(queries, full_k, full_v, ends, strict=True)
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_store_kv_skips_padding_slots(attention):
    k_cache = torch.zeros(2, 4, 1, 3)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(3, 1, 3)
    attention.store_kv(key, key * 2, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert k_cache.view(-1, 1, 3)[5].eq(1).all() and k_cache.view(-1, 1, 3)[0].eq(1).all()
    assert k_cache.sum() == 6 and v_cache.sum() == 12
