// The model's elementwise steps in one pass each over memory, for bf16 and fp16 (and
// the rotation for fp32 too, rounded as torch rounds it): the text model's RMSNorm,
// SiLU-and-mul and rotation, and the vision towers' GELU.
//
// In torch each of these is several operators with a temporary per operator (cast to
// fp32, square, mean, rsqrt, multiply, cast back, ...). Here each row is read once,
// computed in fp32 and written once. Same formulas and rounding points as the torch
// references in kernels/{rms_norm,activation,rotary}.py, up to float summation order.

#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "load_row.h"

namespace {

// Rows per task: enough to amortise a thread hand-off on rows of a few hundred values.
constexpr int64_t kGrain = 16;

template <typename scalar_t>
void rms_norm_rows(const scalar_t* x, const scalar_t* weight, scalar_t* out, int64_t rows,
                   int64_t hidden, float eps) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(hidden), w(hidden);
    load_row(weight, w.data(), hidden);
    for (int64_t r = begin; r < end; ++r) {
      load_row(x + r * hidden, row.data(), hidden);
      float sum = 0.f;
      for (int64_t i = 0; i < hidden; ++i) sum += row[i] * row[i];
      const float inv = 1.f / std::sqrt(sum / hidden + eps);
      scalar_t* o = out + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) {
        // Rounded to the model's dtype before the weight multiply, as the reference does.
        const float normed = static_cast<float>(static_cast<scalar_t>(row[i] * inv));
        o[i] = static_cast<scalar_t>(w[i] * normed);
      }
    }
  });
}

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [rows, hidden]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1),
              "weight must be [hidden] in x's dtype");
}

// gate[i] = silu(gate[i]) * up[i], in place. GCC's tuning for these CPUs keeps loops to
// 256-bit vectors, so e^x came from glibc's 8-lane expf; asked for 16 lanes, the same
// loop takes its 16-lane one.
void silu_mul_row(float* gate, const float* up, int64_t d) {
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < d; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

// x = gelu(x) with tanh's approximation, in place: 0.5 x (1 + tanh(u)) as x / (1 + e^-2u),
// which vectorises (as silu_mul_row, 16 lanes asked for). Where e^-2u overflows, 0: the
// division by infinity is no zero under -ffast-math (its reciprocal's refinement gives
// NaN), and torch's tanh is -1 there, its GELU 0.
void gelu_tanh_row(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kExpLimit = 88.f;  // e^88 < FLT_MAX < e^89
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; ++i) {
    const float t = -2.f * kSqrt2OverPi * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    x[i] = t > kExpLimit ? 0.f : x[i] / (1.f + std::exp(t));
  }
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  auto out = tensors::empty_like(x);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows(x.data_ptr<scalar_t>(), weight.contiguous().data_ptr<scalar_t>(),
                  out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous() &&
                  residual.scalar_type() == x.scalar_type(),
              "residual must match x");
  auto sum = tensors::empty_like(x);
  const int64_t n = x.numel();
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* a = x.data_ptr<scalar_t>();
    const scalar_t* b = residual.data_ptr<scalar_t>();
    scalar_t* s = sum.data_ptr<scalar_t>();
    at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        s[i] = static_cast<scalar_t>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
      }
    });
  });
  return {rms_norm(sum, weight, eps), sum};
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0,
              "x must be a contiguous [rows, 2 * d]");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  auto out = tensors::empty({rows, d}, x.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    // rows by ~8k values a task: a decode step's few long rows shared by the threads
    at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / d), [&](int64_t begin, int64_t end) {
      std::vector<float> gate(d), up(d);
      for (int64_t r = begin; r < end; ++r) {
        load_row(in + r * 2 * d, gate.data(), d);
        load_row(in + r * 2 * d + d, up.data(), d);
        // In place, then one conversion pass: the loop of exp stays free of the
        // rounding to the model's dtype, and both vectorise. (silu_mul16, the fused
        // gate_up kernel's, was faster here but moved the kept-quantized SmolLM2's
        // perplexity against fp32 from +0.2% to +0.7%: tests/engine/test_quantized_smollm2.py.)
        silu_mul_row(gate.data(), up.data(), d);
        store_row(gate.data(), o + r * d, d);
      }
    });
  });
  return out;
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  auto out = tensors::empty_like(x);
  const int64_t n = x.numel();
  constexpr int64_t kBlock = 4096;  // values a pass: in L1 between load, gelu and store
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "gelu_tanh", [&] {
    const scalar_t* in = x.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, (n + kBlock - 1) / kBlock, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> block(kBlock);
      for (int64_t i = begin * kBlock; i < std::min(n, end * kBlock); i += kBlock) {
        const int64_t count = std::min(kBlock, n - i);
        load_row(in + i, block.data(), count);
        gelu_tanh_row(block.data(), count);
        store_row(block.data(), o + i, count);
      }
    });
  });
  return out;
}

namespace {

// x * y rounded to fp32 on its own. -ffast-math would fuse a product into the add
// after it (one rounding instead of two); an fp32 rotation must equal torch's, which
// rounds each product, to the bit (tests/kernels/test_reference_kernels.py).
inline float rounded_product(float x, float y) {
  float product = x * y;
  __asm__("" : "+v"(product));  // opaque to the optimizer: nothing fuses across it
  return product;
}

// x: [tokens, heads, head_dim] with rows `row_stride` apart (a view into the merged
// qkv projection); out: contiguous. cos/sin: fp32 [max_positions, head_dim].
template <typename scalar_t>
void rotate(const scalar_t* x, int64_t row_stride, scalar_t* out, const int64_t* positions,
            const float* cos, const float* sin, int64_t tokens, int64_t heads, int64_t head_dim,
            bool is_neox) {
  const int64_t half = head_dim / 2;
  at::parallel_for(0, tokens, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(heads * head_dim);
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos + positions[t] * head_dim;
      const float* s = sin + positions[t] * head_dim;
      load_row(x + t * row_stride, row.data(), heads * head_dim);
      scalar_t* o = out + t * heads * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = row.data() + h * head_dim;
        scalar_t* oh = o + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          // neox pairs i with i + half; GPT-J pairs 2i with 2i + 1. Frequency i either way.
          const int64_t a = is_neox ? i : 2 * i;
          const int64_t b = is_neox ? i + half : 2 * i + 1;
          if constexpr (std::is_same_v<scalar_t, float>) {
            oh[a] = rounded_product(v[a], c[i]) - rounded_product(v[b], s[i]);
            oh[b] = rounded_product(v[b], c[i]) + rounded_product(v[a], s[i]);
          } else {
            oh[a] = static_cast<scalar_t>(v[a] * c[i] - v[b] * s[i]);
            oh[b] = static_cast<scalar_t>(v[b] * c[i] + v[a] * s[i]);
          }
        }
      }
    }
  });
}

at::Tensor rotate_tensor(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
                         const at::Tensor& sin, bool is_neox) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2),
              "q/k must be [tokens, heads, head_dim] with contiguous heads");
  auto out = tensors::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary", [&] {
    rotate(x.data_ptr<scalar_t>(), x.stride(0), out.data_ptr<scalar_t>(),
           positions.data_ptr<int64_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
           x.size(0), x.size(1), x.size(2), is_neox);
  });
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& q,
                                          const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin, bool is_neox) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "positions must be contiguous int64");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.size(1) == q.size(2),
              "cos/sin must be contiguous fp32 [max_positions, head_dim]");
  return {rotate_tensor(q, positions, cos, sin, is_neox),
          rotate_tensor(k, positions, cos, sin, is_neox)};
}
