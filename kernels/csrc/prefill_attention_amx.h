// prefill_attention_cpu.cpp's query tiles on AMX's bf16 tiles (prefill_attention_amx.cpp).
#pragma once

#include "tensor_api.h"

#include <cstdint>

// Whether attend_query_tile_amx runs here (built for AMX, granted the tiles, wanted).
bool prefill_attention_amx_ready();

// The attention of a chunk's query tokens first .. first + count - 1 (count <= 16) of
// one head, as prefill_attention_cpu.cpp's attend_query_tile computes it, over one KV
// head's tiles: `keys` [tile][dim pair][16 keys] and `values` [tile][key pair][dim][2]
// in bf16, an even number of 16-key tiles (zeros past the context). acc: 16 x head_dim
// fp32 of scratch. Writes the tokens' output rows.
void attend_query_tile_amx(const uint16_t* query, int64_t query_stride, int64_t first,
                           int64_t count, int64_t chunk_len, int64_t context,
                           const uint32_t* keys, const uint16_t* values, int64_t head_dim,
                           float scale, float softcap, float* acc, at::BFloat16* out,
                           int64_t out_stride);
