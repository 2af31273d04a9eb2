// AMX's tiles on Linux: the process's permission to use them, the wish to, and their
// configuration (amx_tiles.cpp). The kernels that use them (quantized_linear_amx.cpp,
// linear_amx.cpp, prefill_attention_amx.cpp) are compiled where the compiler targets AMX
// (-march=native on a CPU that has it).
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__)
#include <immintrin.h>
#endif

// Whether the tiles are there: built for them, and the process granted them.
bool amx_tiles_available();
// The wish to use them (on by default; off for a comparison, or by the engine's
// cpu_amx setting); returns the previous one.
bool set_amx_tiles(bool enabled);

namespace amx_tiles {

// Whether the kernels run on the tiles: available and wished for.
bool ready();

#if defined(__AMX_TILE__)
// Palette 1's configuration: each tile's rows and bytes per row (unused tiles 0).
// Loaded at each kernel call's start, never assumed from an earlier call on the thread.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int64_t tile_rows, int64_t row_bytes) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    bytes_per_row[tile] = static_cast<uint16_t>(row_bytes);
  }
  void load() const {
    // GCC does not see the instruction read the struct, and drops its stores without this.
    asm volatile("" : : "m"(*this));
    _tile_loadconfig(this);
  }
};
#endif

}  // namespace amx_tiles
