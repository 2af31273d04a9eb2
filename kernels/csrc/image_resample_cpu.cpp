// One pass of Pillow's two-pass resize of an 8-bit image, with Pillow's own arithmetic:
// each output value is 2^21 plus the sum of its taps' pixels times their 22-bit
// fixed-point weights, shifted right by 22 bits and clipped to 0..255, in int32 as
// Pillow adds them (the weights and their bounds come from kernels/image_cpu.py,
// which computes them as Pillow does). So the result equals Pillow's to the bit, and
// the speed comes from the layout: each pass adds whole rows of pixels, 16 lanes at a
// time, where Pillow adds one pixel's channels at a time, and the rows are shared
// between threads (where asked: see kernels/image_cpu.py), where Pillow runs on one.
//
// The vertical pass (along the image's height) adds rows of [width * channels] values
// as they lie. The horizontal pass (along the width) takes the image in blocks of
// kBlockRows rows, each turned on its side in a small buffer (a column of the block is
// then a row of kBlockRows * channels values), adds those, and turns the result back.

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int kPrecisionBits = 22;  // Pillow's PRECISION_BITS (32 - 8 - 2)
constexpr int64_t kBlockRows = 32;

inline uint8_t clip8(int32_t sum) {
  const int32_t value = sum >> kPrecisionBits;
  return static_cast<uint8_t>(std::min(std::max(value, 0), 255));
}

#if defined(__AVX512F__)
// out[i] = clip8(2^21 + sum over taps t of src[t * stride + i] * weights[t]) for 16 *
// kVectors lanes i, their sums in registers: each byte widened to int32, multiplied and
// added in int32 as Pillow does, 16 lanes to an instruction. (Left to the compiler, the
// scalar loops below took 256-bit vectors and a chain of widenings and extractions per
// tap: 3-4x slower.)
template <int kVectors>
inline void weighted_lanes(const uint8_t* src, int64_t stride, int32_t taps,
                           const int32_t* weights, uint8_t* out) {
  __m512i sums[kVectors];
  for (int v = 0; v < kVectors; ++v) sums[v] = _mm512_set1_epi32(1 << (kPrecisionBits - 1));
  for (int32_t t = 0; t < taps; ++t) {
    const __m512i weight = _mm512_set1_epi32(weights[t]);
    const uint8_t* row = src + t * stride;
    for (int v = 0; v < kVectors; ++v) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * v));
      sums[v] = _mm512_add_epi32(sums[v], _mm512_mullo_epi32(_mm512_cvtepu8_epi32(bytes), weight));
    }
  }
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(255);
  for (int v = 0; v < kVectors; ++v) {  // clip8, 16 at a time
    const __m512i value = _mm512_srai_epi32(sums[v], kPrecisionBits);
    const __m512i clipped = _mm512_min_epi32(_mm512_max_epi32(value, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * v), _mm512_cvtepi32_epi8(clipped));
  }
}
#endif

// out[i] = clip8(2^21 + sum over taps t of src[(start + t) * stride + i] * weights[t]).
void weighted_rows(const uint8_t* src, int64_t stride, int64_t length, int32_t start,
                   int32_t taps, const int32_t* weights, int32_t* sums, uint8_t* out) {
#if defined(__AVX512F__)
  constexpr int64_t kRun = 64;  // lanes a pass over the taps: 4 vectors of sums
  const int64_t runs = length / kRun * kRun;
  for (int64_t i = 0; i < runs; i += kRun) {
    weighted_lanes<kRun / 16>(src + start * stride + i, stride, taps, weights, out + i);
  }
  src += runs, length -= runs, out += runs;  // the rest as below
#endif
  std::fill(sums, sums + length, 1 << (kPrecisionBits - 1));
  for (int32_t t = 0; t < taps; ++t) {
    const uint8_t* row = src + (start + t) * stride;
    const int32_t weight = weights[t];
    for (int64_t i = 0; i < length; ++i) sums[i] += static_cast<int32_t>(row[i]) * weight;
  }
  for (int64_t i = 0; i < length; ++i) out[i] = clip8(sums[i]);
}

// Each output's run of inputs: bounds [outputs, 2] (its first input, its number of
// taps) and weights [outputs, width] (a tap's fixed-point weight; 0 past its taps).
struct Taps {
  const int32_t* bounds;
  const int32_t* weights;
  int64_t width;
  int64_t outputs;
  int32_t start(int64_t output) const { return bounds[2 * output]; }
  int32_t count(int64_t output) const { return bounds[2 * output + 1]; }
  const int32_t* weights_of(int64_t output) const { return weights + output * width; }
};

Taps taps_of(const at::Tensor& bounds, const at::Tensor& weights) {
  TORCH_CHECK(bounds.dim() == 2 && bounds.size(1) == 2 && bounds.scalar_type() == at::kInt &&
                  bounds.is_contiguous(),
              "bounds must be a contiguous int32 [outputs, 2] (first input, taps)");
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) == bounds.size(0) &&
                  weights.scalar_type() == at::kInt && weights.is_contiguous(),
              "weights must be a contiguous int32 [outputs, taps]");
  return {bounds.data_ptr<int32_t>(), weights.data_ptr<int32_t>(), weights.size(1),
          bounds.size(0)};
}

void check_image(const at::Tensor& image) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == at::kByte && image.is_contiguous(),
              "image must be a contiguous uint8 [height, width, channels]");
}

void check_bounds(const Taps& taps, int64_t size) {
  for (int64_t o = 0; o < taps.outputs; ++o) {
    const int32_t start = taps.start(o), count = taps.count(o);
    TORCH_CHECK(start >= 0 && count >= 0 && count <= taps.width && start + count <= size,
                "resample bounds out of the image");
  }
}

// The horizontal pass over kBlockRows rows of a kChannels-channel image: the block's
// columns laid side by side as rows of kLanes values, whose sums stay in registers.
template <int kChannels>
void horizontal_block(const uint8_t* src, int64_t width, int64_t rows, const Taps& taps,
                      uint8_t* columns, uint8_t* dst) {
  constexpr int64_t kLanes = kBlockRows * kChannels;
  // columns[x][r * kChannels + c] = src[r][x][c], column by column. A 3-channel pixel
  // moves as 4 bytes (one load, one store): the 4th, the next pixel's, lands on the lane
  // the next row writes, or on the next column's first, written after it; the last
  // column moves byte by byte, so no read passes the image's end.
  const int64_t line = width * kChannels;
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t* pixel = src + x * kChannels;
    uint8_t* column = columns + x * kLanes;
    for (int64_t r = 0; r < rows; ++r) {
      if (kChannels == 3 && x + 1 < width) {
        std::memcpy(column + r * kChannels, pixel + r * line, 4);
      } else {
        for (int c = 0; c < kChannels; ++c) column[r * kChannels + c] = pixel[r * line + c];
      }
    }
  }
  for (int64_t o = 0; o < taps.outputs; ++o) {
    // A block of fewer rows leaves the lanes past them stale: summed, never written.
    const uint8_t* column = columns + taps.start(o) * kLanes;
    uint8_t values[kLanes];
#if defined(__AVX512F__)
    weighted_lanes<kLanes / 16>(column, kLanes, taps.count(o), taps.weights_of(o), values);
#else
    int32_t sums[kLanes];
    weighted_rows(column, kLanes, kLanes, 0, taps.count(o), taps.weights_of(o), sums, values);
#endif
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + (r * taps.outputs + o) * kChannels, values + r * kChannels, kChannels);
    }
  }
}

}  // namespace

at::Tensor resample_vertical(const at::Tensor& image, const at::Tensor& bounds,
                             const at::Tensor& weights, bool parallel) {
  check_image(image);
  const Taps taps = taps_of(bounds, weights);
  check_bounds(taps, image.size(0));
  const int64_t row_length = image.size(1) * image.size(2);
  auto out = tensors::empty({taps.outputs, image.size(1), image.size(2)}, image.options());
  const uint8_t* src = image.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  // A grain of the whole range runs on the calling thread alone.
  at::parallel_for(0, taps.outputs, parallel ? 1 : taps.outputs, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> sums(row_length);
    for (int64_t o = begin; o < end; ++o) {
      weighted_rows(src, row_length, row_length, taps.start(o), taps.count(o),
                    taps.weights_of(o), sums.data(), dst + o * row_length);
    }
  });
  return out;
}

at::Tensor resample_horizontal(const at::Tensor& image, const at::Tensor& bounds,
                               const at::Tensor& weights, bool parallel) {
  check_image(image);
  const Taps taps = taps_of(bounds, weights);
  const int64_t height = image.size(0), width = image.size(1), channels = image.size(2);
  TORCH_CHECK(channels >= 1 && channels <= 4, "1 to 4 channels");
  check_bounds(taps, width);
  auto out = tensors::empty({height, taps.outputs, channels}, image.options());
  const uint8_t* src = image.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t blocks = (height + kBlockRows - 1) / kBlockRows;
  at::parallel_for(0, blocks, parallel ? 1 : blocks, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> columns(width * kBlockRows * channels);
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockRows;
      const int64_t rows = std::min(kBlockRows, height - first);
      const uint8_t* block_src = src + first * width * channels;
      uint8_t* block_dst = dst + first * taps.outputs * channels;
      switch (channels) {
        case 1: horizontal_block<1>(block_src, width, rows, taps, columns.data(), block_dst); break;
        case 2: horizontal_block<2>(block_src, width, rows, taps, columns.data(), block_dst); break;
        case 3: horizontal_block<3>(block_src, width, rows, taps, columns.data(), block_dst); break;
        default: horizontal_block<4>(block_src, width, rows, taps, columns.data(), block_dst);
      }
    }
  });
  return out;
}
