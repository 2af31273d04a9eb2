"""Triton's KV store: a step's new keys and values written into their slots of the paged
cache (the GPU side of kernels/paged_attention.py's store_kv), quantized as they are
written where the cache is int8 (rows of values and their groups' fp16 scales, keys
rotated: kernels/kv_quant.py) or fp8. paged_attention_triton.py reads what it writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.kv_quant import (
    SCALE_GROUP,
    rotate_groups,
    rotates_keys,
    stored_head_size,
)
from hetero_infer.kernels.triton_utils import (
    check_last_dim_contiguous,
    device_info,
    next_pow2,
    rows_per_program,
)


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    num_tokens,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    QUANT: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
):
    """For each token t with slot = slot_mapping[t] >= 0:

    k_cache[slot // BLOCK_SIZE, slot % BLOCK_SIZE] = key[t]   (and v_cache from value)

    Slots of -1 (padding tokens) are skipped. A bit-exact copy (QUANT=0); QUANT=1
    writes each (token, head) row as int8 values x * (127 / max|x|) rounded per group
    of SCALE_GROUP values (of HEAD_PAD: the whole row), followed by the 2 bytes of each
    group's fp16 scale max|x| * (1 / 127); QUANT=2 converts to fp8, saturated.
    """
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    slot = tl.load(slot_mapping_ptr + tok, mask=tok < num_tokens, other=-1).to(tl.int64)
    keep = slot >= 0
    block = tl.where(keep, slot // BLOCK_SIZE, 0)
    offset = tl.where(keep, slot % BLOCK_SIZE, 0)
    head = tl.arange(0, HEADS_PAD)
    dim = tl.arange(0, HEAD_PAD)
    # [BLOCK_T, HEADS_PAD, HEAD_PAD]
    mask = (
        keep[:, None, None] & (head[None, :, None] < num_kv_heads) & (dim[None, None, :] < head_dim)
    )
    tok3 = tok[:, None, None].to(tl.int64)
    head3 = head[None, :, None]
    dim3 = dim[None, None, :]
    key = tl.load(key_ptr + tok3 * stride_key_tok + head3 * stride_key_head + dim3, mask=mask)
    # [BLOCK_T, HEADS_PAD]: each (token, head) row's start in the cache
    dst = block[:, None] * stride_kc_block + offset[:, None] * stride_kc_slot
    dst += head[None, :] * stride_kc_head
    _store_rows(
        k_cache_ptr,
        dst,
        key,
        dim3,
        head_dim,
        mask,
        QUANT,
        SCALE_GROUP,
        BLOCK_T,
        HEADS_PAD,
        HEAD_PAD,
    )
    value = tl.load(
        value_ptr + tok3 * stride_value_tok + head3 * stride_value_head + dim3, mask=mask
    )
    dst = block[:, None] * stride_vc_block + offset[:, None] * stride_vc_slot
    dst += head[None, :] * stride_vc_head
    _store_rows(
        v_cache_ptr,
        dst,
        value,
        dim3,
        head_dim,
        mask,
        QUANT,
        SCALE_GROUP,
        BLOCK_T,
        HEADS_PAD,
        HEAD_PAD,
    )


@triton.jit
def _store_rows(
    cache_ptr,
    row_off,
    x,
    dim3,
    head_dim,
    mask,
    QUANT: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    # row_off [BLOCK_T, HEADS_PAD]: rows' starts; x, dim3, mask [BLOCK_T, HEADS_PAD, HEAD_PAD]
    row_ptr = cache_ptr + row_off[:, :, None]
    if QUANT == 1:
        x = tl.where(mask, x.to(tl.float32), 0.0)
        x = tl.reshape(x, (BLOCK_T, HEADS_PAD, HEAD_PAD // SCALE_GROUP, SCALE_GROUP))
        amax = tl.max(tl.abs(x), axis=3)  # [BLOCK_T, HEADS_PAD, GROUPS]
        inv = tl.where(amax > 0.0, 127.0 / tl.where(amax > 0.0, amax, 1.0), 0.0)
        # round half away from zero: the torch reference's half-to-even differs only
        # on exact ties, by one step
        scaled = x * inv[:, :, :, None]
        q = tl.where(scaled >= 0.0, tl.floor(scaled + 0.5), -tl.floor(0.5 - scaled))
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        q = tl.reshape(q, (BLOCK_T, HEADS_PAD, HEAD_PAD))
        tl.store(row_ptr + dim3, q.to(tl.int8), mask=mask)
        # The scales' bytes, little-endian, one store each: a scale's offset need not
        # be 2-byte aligned for the pointer's element type.
        bits = (amax * (1.0 / 127.0)).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        group = tl.arange(0, HEAD_PAD // SCALE_GROUP)[None, None, :]
        row_mask = tl.max(mask.to(tl.int32), axis=2) > 0
        scale_mask = row_mask[:, :, None] & (group * SCALE_GROUP < head_dim)
        scale_ptr = cache_ptr + row_off[:, :, None] + head_dim + 2 * group
        for i in tl.static_range(2):
            byte = ((bits >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.int8, bitcast=True)
            tl.store(scale_ptr + i, byte, mask=scale_mask)
    elif QUANT == 2:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
        tl.store(row_ptr + dim3, x.to(row_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(row_ptr + dim3, x, mask=mask)


def store_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_dim] into their cache slots."""
    num_tokens, num_kv_heads, head_dim = key.shape
    _, block_size, cache_heads, cache_dim = k_cache.shape
    quant = cache_quant(k_cache)
    assert value.shape == key.shape, (value.shape, key.shape)
    assert k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    row = stored_head_size(head_dim, k_cache.dtype)
    assert (cache_heads, cache_dim) == (num_kv_heads, row), (k_cache.shape, key.shape)
    assert k_cache.dtype == v_cache.dtype
    assert quant or key.dtype == value.dtype == k_cache.dtype, (key.dtype, k_cache.dtype)
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.is_contiguous()
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    if num_tokens == 0:
        return
    if rotates_keys(k_cache.dtype, head_dim):  # quantized from fp32, as the torch store
        key = rotate_groups(key)
    info = device_info(key)
    heads_pad, head_pad = next_pow2(num_kv_heads), next_pow2(head_dim)
    block_t = rows_per_program(num_tokens, heads_pad * head_pad, info)
    _store_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        num_tokens,
        num_kv_heads,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_T=block_t,
        HEADS_PAD=heads_pad,
        HEAD_PAD=head_pad,
        QUANT=quant,
        # a group of 32, or the row padded (kv_quant.scale_group's whole row)
        SCALE_GROUP=SCALE_GROUP if head_dim % SCALE_GROUP == 0 else head_pad,
        num_warps=4,
    )


def cache_quant(cache: torch.Tensor) -> int:
    """The kernels' QUANT for a cache: 0 as stored, 1 int8 rows with scales, 2 fp8."""
    return {torch.int8: 1, torch.float8_e4m3fn: 2}.get(cache.dtype, 0)
