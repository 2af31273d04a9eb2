// y = x W^T for a few rows of x in bf16: the matrix-vector products of small decode
// batches, which read every weight once per step and so are bound by memory bandwidth.
//
// torch's bf16 matmul reached 6-20 GB/s of weight reads at batch 1 on a machine whose
// memory gives ~30 GB/s. Here each thread streams whole weight rows, converting nothing:
// AVX512-BF16's dot instruction multiplies bf16 pairs and accumulates in fp32 (as the
// library matmul does). Built only where the compiler targets AVX512-BF16; elsewhere
// `linear_small_batch` reports itself unavailable and torch's matmul runs.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

// The largest batch this kernel serves (SMALL_BATCH_ROWS in kernels/cpu_extension.py).
constexpr int64_t kMaxRows = 4;

bool linear_small_batch_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor linear_small_batch(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(linear_small_batch_available(), "built without AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "bf16 only");
  TORCH_CHECK(x.dim() == 2 && x.size(0) <= kMaxRows && weight.dim() == 2 &&
                  weight.size(1) == x.size(1) && x.size(1) % 32 == 0,
              "x [rows <= 4, K], weight [N, K], K a multiple of 32");
  auto xc = x.contiguous();
  auto w = weight.contiguous();
  const int64_t rows = xc.size(0), k = xc.size(1), n = w.size(0);
  auto out = at::empty({rows, n}, x.options());
#if defined(__AVX512BF16__)
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  // 64 output features per task: ~70 KB of weights at K = 576, enough per hand-off.
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const uint16_t* wrow = wp + j * k;
      __m512 acc[kMaxRows];
      for (int64_t r = 0; r < rows; ++r) acc[r] = _mm512_setzero_ps();
      for (int64_t i = 0; i < k; i += 32) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(wrow + i);
        for (int64_t r = 0; r < rows; ++r) {
          const __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + r * k + i);
          acc[r] = _mm512_dpbf16_ps(acc[r], xv, wv);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        op[r * n + j] = static_cast<at::BFloat16>(_mm512_reduce_add_ps(acc[r]));
      }
    }
  });
#endif
  return out;
}
