// linear_packed's product on AMX's bf16 tiles (linear_amx.cpp): where ready(), it takes
// every call of PackedLinearWork, whatever its rows.
#pragma once

#include <cstdint>

namespace linear_amx {

// One call's operands, as PackedLinearWork holds them.
struct Product {
  const uint16_t* x;  // [rows, 2 * pairs] bf16
  const uint32_t* packed;  // pack_linear_weight's [panels, pairs, 32] pairs
  const uint16_t* bias;  // [panels * 32] bf16, or null
  const float* addend;  // [rows, panels * 32] fp32 (gate, then up, where gated), or null
  uint16_t* out;  // [rows, panels * 32] bf16, or [rows, panels * 16] where gated
  int64_t rows, pairs, panels;
  bool gated;
};

// Whether the tiles take a weight of `pairs` input pairs: built for them, the process
// granted them (and the engine wants them), and K a multiple of 32.
bool ready(int64_t pairs);
// Panels begin .. end - 1 of the product, for all its rows.
void multiply_panels(const Product& p, int64_t begin, int64_t end);

}  // namespace linear_amx
