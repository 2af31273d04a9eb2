// y = x W^T + b in bf16 on AVX-512, with W packed once into panels of 32 outputs.
//
// A panel holds, for each pair of input features, the 32 outputs' weight pairs side by
// side: one 64-byte load gives 16 lanes of (w[j][2k], w[j][2k + 1]), and AVX512-BF16's
// dot instruction multiplies them with one broadcast pair of x and sums in fp32 (where
// a CPU lacks it, two FMAs in fp32: vector_math.h's LanePairs). A tile of 8 rows x 32
// outputs keeps 16 sums in registers over the whole input; a thread walks its panels in
// memory order, each panel read from memory once for all rows while the next is asked
// for ahead of use. oneDNN's bf16 matmul on its own packed weights reached 290-370
// GFLOP/s on a step's 32-128 rows with weights not in cache, and 140-220 at 5-8 rows;
// this 350-440 and 220-270 (the machine's peak: ~430). At 1-4 rows it also beats a
// matrix-vector kernel that streamed the unpacked rows.
//
// A merged gate_up weight can be packed "gated": each panel then holds 16 gate
// outputs and the 16 up outputs of the same features, and the tile writes
// silu(gate) * up from its fp32 sums, so the MLP's [rows, 2 x intermediate]
// activations are never written out and read back.
//
// Where AMX's tiles are ready (and K is a multiple of 32), every call runs on them
// instead, on the same packed panels (linear_amx.cpp): 3-9x this code from 16 rows on
// a Xeon with AMX, and as fast at one row.

#include "tensor_api.h"

#include <algorithm>
#include <optional>

#include "cpu_kernels.h"
#include "linear_amx.h"
#include "vector_math.h"
#include "work_in_shares.h"

namespace {
constexpr int64_t kPanel = 32;  // outputs per panel
constexpr int64_t kTileRows = 8;
}  // namespace

bool linear_packed_available() {
#if defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

// weight [N, K] bf16, N % 32 == 0 and K even -> [N / 32, K / 2, 32] int32: panel p,
// input pair k, output j holds the bf16 pair (weight[32p + j][2k], weight[32p + j][2k + 1]).
at::Tensor pack_linear_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "weight [N, K] bf16");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % kPanel == 0 && k % 2 == 0, "N must be a multiple of 32 and K even");
  auto w = weight.contiguous();
  auto packed = tensors::empty({n / kPanel, k / 2, kPanel}, weight.options().dtype(at::kInt));
  const uint32_t* src = reinterpret_cast<const uint32_t*>(w.data_ptr<at::BFloat16>());
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const int64_t pairs = k / 2;
  at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t kp = 0; kp < pairs; ++kp) {
        for (int64_t j = 0; j < kPanel; ++j) {
          dst[(p * pairs + kp) * kPanel + j] = src[(p * kPanel + j) * pairs + kp];
        }
      }
    }
  });
  return packed;
}

// weight [2I, K] (gate rows, then up rows) -> pack_linear_weight of its rows reordered
// so that panel p holds gate outputs 16p .. 16p + 15 and then the same up outputs.
at::Tensor pack_gated_linear_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % kPanel == 0, "weight [2I, K], 2I % 32 == 0");
  const int64_t half = weight.size(0) / 2;
  auto order = tensors::empty({weight.size(0)}, at::kLong);
  int64_t* o = order.data_ptr<int64_t>();
  for (int64_t p = 0; p < half / 16; ++p) {
    for (int64_t j = 0; j < 16; ++j) {
      o[p * kPanel + j] = p * 16 + j;
      o[p * kPanel + 16 + j] = half + p * 16 + j;
    }
  }
  return pack_linear_weight(weight.index_select(0, order));
}

#if defined(__AVX512BW__)
namespace {

// fp32 values added to a tile's sums before they are rounded (or activated): the
// panel's first 16 outputs' at lo, its last 16's at hi, a row `stride` apart; lo null:
// none. (LoRA's updates of a gated gate_up, which come before its activation.)
struct Addend {
  const float* lo = nullptr;
  const float* hi = nullptr;
  int64_t stride = 0;
};

// ROWS rows of x (as input pairs) times one panel -> ROWS x 32 outputs. `ahead` (or
// null) is a panel to ask for while this one is multiplied.
template <int ROWS, bool GATED>
inline void multiply_tile(const ScalarPair* x, int64_t pairs, const uint32_t* panel,
                          const at::BFloat16* bias, const char* ahead, uint16_t* out,
                          int64_t out_stride, const Addend& add) {
  __m512 sum[ROWS][2];
  const __m512 bias_lo = bias ? load_bf16_16(bias) : _mm512_setzero_ps();
  const __m512 bias_hi = bias ? load_bf16_16(bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < ROWS; ++r) {
    sum[r][0] = bias_lo;
    sum[r][1] = bias_hi;
  }
  for (int64_t kp = 0; kp < pairs; ++kp) {
    if (ahead) {  // a panel row is 128 bytes: two cache lines per input pair
      _mm_prefetch(ahead + kp * 128, _MM_HINT_T1);
      _mm_prefetch(ahead + kp * 128 + 64, _MM_HINT_T1);
    }
    const LanePairs w_lo(panel + kp * kPanel), w_hi(panel + kp * kPanel + 16);
    for (int r = 0; r < ROWS; ++r) {
      const ScalarPair& xv = x[r * pairs + kp];
      sum[r][0] = w_lo.dot(sum[r][0], xv);
      sum[r][1] = w_hi.dot(sum[r][1], xv);
    }
  }
  if (add.lo) {
    for (int r = 0; r < ROWS; ++r) {
      sum[r][0] = _mm512_add_ps(sum[r][0], _mm512_loadu_ps(add.lo + r * add.stride));
      sum[r][1] = _mm512_add_ps(sum[r][1], _mm512_loadu_ps(add.hi + r * add.stride));
    }
  }
  for (int r = 0; r < ROWS; ++r) {  // round to nearest even, as torch's bf16 matmul
    auto* row = reinterpret_cast<__m256i*>(out + r * out_stride);
    if constexpr (GATED) {
      _mm256_storeu_si256(row, round_to_bf16(silu_mul16(sum[r][0], sum[r][1])));
    } else {
      _mm256_storeu_si256(row, round_to_bf16(sum[r][0]));
      _mm256_storeu_si256(row + 1, round_to_bf16(sum[r][1]));
    }
  }
}

template <bool GATED, int ROWS = kTileRows>
inline void multiply_rows(int64_t rows, const ScalarPair* x, int64_t pairs, const uint32_t* panel,
                          const at::BFloat16* bias, const char* ahead, uint16_t* out,
                          int64_t out_stride, const Addend& add) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) {
      multiply_rows<GATED, ROWS - 1>(rows, x, pairs, panel, bias, ahead, out, out_stride, add);
      return;
    }
  }
  multiply_tile<ROWS, GATED>(x, pairs, panel, bias, ahead, out, out_stride, add);
}

}  // namespace
#endif

PackedLinearWork::PackedLinearWork(const at::Tensor& x, const at::Tensor& packed,
                                   const std::optional<at::Tensor>& bias, bool gated,
                                   const std::optional<at::Tensor>& addend)
    : gated_(gated) {
  TORCH_CHECK(linear_packed_available(), "built without AVX-512 (BW)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x [M, K] bf16");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) * 2 == x.size(1),
              "packed weight does not fit x");
  rows_ = x.size(0);
  pairs_ = packed.size(1);
  panels_ = packed.size(0);
  const int64_t n = panels_ * kPanel;
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!(gated && has_bias), "a gated weight takes no bias");
  if (has_bias) {
    bias_ = bias->contiguous();
    TORCH_CHECK(bias_.scalar_type() == at::kBFloat16 && bias_.numel() == n, "bias [N] bf16");
  }
#if defined(__AVX512BF16__)
  x_ = x.contiguous();
#else
  x_ = x.to(at::kFloat).contiguous();  // fp32 pairs, as LanePairs::dot takes them
#endif
  if (addend.has_value()) {
    TORCH_CHECK(addend->scalar_type() == at::kFloat && addend->is_contiguous() &&
                    addend->dim() == 2 && addend->size(0) == rows_ && addend->size(1) == n,
                "addend: fp32 [M, N], contiguous");
    addend_ = *addend;
  }
  packed_ = packed;
  out = tensors::empty({rows_, gated ? n / 2 : n}, x.options());
  // Decided once for the weight, not by the rows: every call of it on the same unit.
  // (Built for the tiles means built for AVX512-BF16: x_ is bf16 there.)
  tiles_ = linear_amx::ready(pairs_);
}

void PackedLinearWork::run_share(int64_t thread, int64_t threads) const {
#if defined(__AVX512BW__)
  const auto [begin, end] = even_share(panels_, thread, threads);
  const int64_t n = panels_ * kPanel, pairs = pairs_, rows = rows_;
  const int64_t out_cols = gated_ ? n / 2 : n, panel_cols = gated_ ? kPanel / 2 : kPanel;
  const ScalarPair* xp = reinterpret_cast<const ScalarPair*>(x_.data_ptr());
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(packed_.data_ptr<int32_t>());
  const at::BFloat16* bp = bias_.defined() ? bias_.data_ptr<at::BFloat16>() : nullptr;
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* ap = addend_.defined() ? addend_.data_ptr<float>() : nullptr;
  if (tiles_) {
    const linear_amx::Product product{reinterpret_cast<const uint16_t*>(xp), wp,
                                      reinterpret_cast<const uint16_t*>(bp), ap, op, rows,
                                      pairs, panels_, gated_};
    linear_amx::multiply_panels(product, begin, end);
    return;
  }
  for (int64_t p = begin; p < end; ++p) {
    const uint32_t* panel = wp + p * pairs * kPanel;
    const char* next = p + 1 < end ? reinterpret_cast<const char*>(panel + pairs * kPanel) : nullptr;
    // Rows spread evenly over the fewest tiles (17 rows: 6 + 6 + 5, not 8 + 8 + 1): a
    // tile of few rows waits on its few chains of dot instructions.
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    for (int64_t t = 0, r0 = 0; t < tiles; ++t) {
      const int64_t count = rows / tiles + (t < rows % tiles ? 1 : 0);
      const at::BFloat16* panel_bias = bp ? bp + p * kPanel : nullptr;
      // The first tile of a panel asks for the next panel; later ones find it there.
      const char* ahead = r0 == 0 ? next : nullptr;
      uint16_t* tile_out = op + r0 * out_cols + p * panel_cols;
      Addend add;
      if (ap) {  // the panel's columns: a gated one's 16 gates and their 16 ups, or 32 in a row
        add.lo = ap + r0 * n + p * panel_cols;
        add.hi = gated_ ? add.lo + n / 2 : add.lo + 16;
        add.stride = n;
      }
      if (gated_) {
        multiply_rows<true>(count, xp + r0 * pairs, pairs, panel, panel_bias, ahead, tile_out, out_cols, add);
      } else {
        multiply_rows<false>(count, xp + r0 * pairs, pairs, panel, panel_bias, ahead, tile_out, out_cols, add);
      }
      r0 += count;
    }
  }
#endif
}

int64_t PackedLinearWork::useful_shares() const {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), panels_));
}

// x [M, K] bf16, packed from pack_linear_weight, bias [N] bf16 or undefined -> [M, N];
// gated (packed from pack_gated_linear_weight, no bias) -> silu(gate) * up, [M, N / 2].
// addend: fp32 [M, N] (gate, then up, where gated) added to the sums before either.
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, bool gated,
                         const std::optional<at::Tensor>& addend) {
  const PackedLinearWork work(x, packed, bias, gated, addend);
  run_in_shares(work);
  return work.out;
}
