// An image's 8-bit pixels turned into the vision tower's float32 inputs by a lookup:
// out[n][c][y][x] = levels[c][pixels[n][c][y][x]], each channel's 256 values computed
// once by the caller as transformers computes a pixel's (engine/multimodal/pixels.py).
// numpy's take did the same per channel, but first widened the indices to int64.

#include "tensor_api.h"

#include <cstdint>

at::Tensor pixel_levels(const at::Tensor& pixels, const at::Tensor& levels, bool parallel) {
  TORCH_CHECK(pixels.dim() == 4 && pixels.scalar_type() == at::kByte,
              "pixels must be uint8 [n, channels, height, width]");
  const int64_t tiles = pixels.size(0), channels = pixels.size(1);
  const int64_t height = pixels.size(2), width = pixels.size(3);
  TORCH_CHECK(levels.dim() == 2 && levels.size(0) == channels && levels.size(1) == 256 &&
                  levels.scalar_type() == at::kFloat && levels.is_contiguous(),
              "levels must be a contiguous float32 [channels, 256]");
  auto out = tensors::empty({tiles, channels, height, width}, levels.options());
  const uint8_t* src = pixels.data_ptr<uint8_t>();
  const float* table = levels.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t sn = pixels.stride(0), sc = pixels.stride(1);
  const int64_t sy = pixels.stride(2), sx = pixels.stride(3);
  const int64_t planes = tiles * channels;
  // A grain of the whole range runs on the calling thread alone.
  at::parallel_for(0, planes, parallel ? 1 : planes, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / channels, c = plane % channels;
      const float* channel_levels = table + c * 256;
      const uint8_t* in = src + n * sn + c * sc;
      float* row_out = dst + plane * height * width;
      for (int64_t y = 0; y < height; ++y, row_out += width) {
        const uint8_t* row_in = in + y * sy;
        for (int64_t x = 0; x < width; ++x) row_out[x] = channel_levels[row_in[x * sx]];
      }
    }
  });
  return out;
}
