// LoRA's updates of a step's rows, grouped by adapter (SGMV on the CPU): after the base
// projection ran once over every row, each adapter's rows get
//   out[rows, o : o + w] += (x[rows] @ A^T)[:, k : k + r] @ B^T
// for each part (o, k, B [w, r]) of its weights (kernels/lora.py).
//
// A work item is some of one adapter's rows (up to kItemRows): their shrink, then their
// expand, kTileRows rows at a time, so that each vector of weights read is dotted with
// all of them and an item needs nothing from another. The items go to the threads in
// runs of about equal work (LoRAWork's shares), in a parallel region of their own or in
// the base projection's, after its share (work_in_shares.h). (Before, a shrink pass and an
// expand pass over all adapters, each a parallel loop over small items, took 17-25 us a
// call at a decode step's two rows per adapter, most of it fixed, at 120 calls a step.)
//
// In bf16 with AVX-512 (BW) an adapter's A and B are tiled, in one buffer, in the order
// an item reads them, and multiplied in bf16 pairs (VDPBF16PS, or two FMAs on the pairs
// widened to fp32 where the CPU lacks AVX512-BF16: Cascade Lake, Ice Lake). At a decode
// step the work is reading them (a rank-8 adapter on every projection of a 135M model is
// 5 MB in bf16), and one stream an item read ~2% faster than four. A projection's
// adapters lie back to back (colocate_lora), so that a thread's items are one stream,
// which the kernel asks for well ahead of its reads (docs/lora.md).

#include "lora_cpu.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <utility>

#include "load_row.h"
#include "vector_math.h"
#include "work_in_shares.h"

#if defined(__AVX512BW__)
constexpr bool kTiled = true;
#else
constexpr bool kTiled = false;
#endif

namespace {

constexpr int64_t kItemRows = 16;    // rows of one adapter in one work item, at most
constexpr int kTileRows = 4;         // rows dotted with each vector of weights read
constexpr int64_t kTileRanks = 4;    // rows of A in a tile of its layout
constexpr int64_t kChunk = 32;       // columns of A in one vector (bf16)
constexpr int64_t kColumns = 16;     // columns of B in one vector (fp32 sums)
// How far ahead of its reads the tiled kernel asks for the weights: a projection's
// adapters lie back to back (colocate_lora), so this runs on into the next adapter's.
// The hardware's prefetch alone kept ~1 KB ahead; 8 KB cut a step's updates by 7-11%
// (4 and 16 KB measured less, and so did asking into L2 only).
constexpr int64_t kAheadBytes = 8192;
// An item's work, for sharing the items among threads: its weights' elements times
// (kRowsPerRead + its rows): reading an element from memory costs about what dotting
// it with this many rows does.
constexpr int64_t kRowsPerRead = 6;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

LoRAWeights::LoRAWeights(at::Tensor a_given, std::vector<int64_t> out_starts,
                         std::vector<int64_t> rank_starts, std::vector<at::Tensor> bs)
    : dtype(a_given.scalar_type()),
      in(a_given.size(1)),
      ranks(a_given.size(0)),
      elements(a_given.numel()),
      tiled(kTiled && a_given.scalar_type() == at::kBFloat16),
      num_parts(static_cast<int>(bs.size())) {
  TORCH_CHECK(a_given.dim() == 2, "A [R, in]");
  TORCH_CHECK(out_starts.size() == bs.size() && rank_starts.size() == bs.size(),
              "one output start and one rank start per B");
  TORCH_CHECK(num_parts <= kMaxParts, "at most three parts (q, k, v) to a projection");
  if (tiled) {  // [R / 4 tiles][in / 32 chunks][4 rows][32 columns], zero-padded
    const int64_t r4 = round_up(ranks, kTileRanks), in32 = round_up(in, kChunk);
    at::Tensor padded = tensors::zeros({r4, in32}, a_given.options());
    padded.narrow(0, 0, ranks).narrow(1, 0, in).copy_(a_given);
    storage.push_back(padded.view({r4 / kTileRanks, kTileRanks, in32 / kChunk, kChunk})
                          .permute({0, 2, 1, 3})
                          .contiguous());
  } else {
    storage.push_back(a_given.contiguous());
  }
  for (int p = 0; p < num_parts; ++p) {
    const at::Tensor& b = bs[p];
    TORCH_CHECK(b.dim() == 2 && b.scalar_type() == dtype, "B [width, rank]");
    const int64_t width = b.size(0), rank = b.size(1);
    TORCH_CHECK(rank >= 1, "B [width, rank >= 1]");
    TORCH_CHECK(rank_starts[p] >= 0 && rank_starts[p] + rank <= ranks, "B's ranks within A's");
    TORCH_CHECK(out_starts[p] >= 0, "a part's first output column");
    if (tiled) {
      // [width / 16 blocks][rank pairs][16 columns][2]: each column's ranks in pairs, as
      // the dot instruction takes them, one 32-bit word per column and pair. B is read
      // as it is stored (an fp32 copy doubled the bytes a step reads).
      const int64_t pairs = (rank + 1) / 2, w16 = round_up(width, kColumns);
      at::Tensor padded = tensors::zeros({w16, 2 * pairs}, b.options());
      padded.narrow(0, 0, width).narrow(1, 0, rank).copy_(b);
      storage.push_back(
          padded.view({w16 / kColumns, kColumns, pairs, 2}).permute({0, 2, 1, 3}).contiguous());
    } else {  // B^T [rank, width] in fp32: the expand runs along the output columns
      storage.push_back(b.t().to(at::kFloat).contiguous());
    }
    parts[p] = {out_starts[p], rank_starts[p], rank, width, nullptr};
    elements += rank * width;
  }
  if (tiled) {  // one buffer, in the order an item reads it: A, then each part's B
    int64_t total = 0;
    for (const at::Tensor& t : storage) total += t.numel();
    const at::Tensor buffer = tensors::empty({total}, storage[0].options());
    int64_t offset = 0;
    for (at::Tensor& t : storage) {
      buffer.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
      t = buffer.narrow(0, offset, t.numel());
      offset += t.numel();
    }
  }
  a = storage[0].data_ptr();
  for (int p = 0; p < num_parts; ++p) parts[p].b = storage[p + 1].data_ptr();
}

void colocate_lora(const std::vector<std::shared_ptr<LoRAWeights>>& weights) {
  constexpr int64_t kAlign = 64;  // a cache line: no two tensors share one
  int64_t total = 0;
  for (const auto& w : weights) {
    for (const at::Tensor& t : w->storage) total += round_up(t.nbytes(), kAlign);
  }
  if (total == 0) return;
  const at::Tensor buffer = tensors::empty({total}, at::TensorOptions().dtype(at::kByte));
  int64_t offset = 0;
  for (const auto& w : weights) {
    for (at::Tensor& t : w->storage) {
      const int64_t bytes = t.nbytes();
      at::Tensor moved = buffer.narrow(0, offset, bytes).view(t.scalar_type()).view(t.sizes());
      moved.copy_(t);
      t = moved;
      offset += round_up(bytes, kAlign);
    }
    w->a = w->storage[0].data_ptr();
    for (int p = 0; p < w->num_parts; ++p) w->parts[p].b = w->storage[p + 1].data_ptr();
  }
}

namespace {

std::span<const LoRAWeights::Part> part_list(const LoRAWeights& w) {
  return {w.parts.data(), static_cast<size_t>(w.num_parts)};
}

// An item's scratch, kept per thread so that a call allocates nothing once warm.
std::vector<float>& scratch(size_t size) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

// The portable path's vectors: 16 floats in GCC's vector type, which the compiler
// lowers to the CPU's own (one AVX-512 register, two AVX2 ones), moved by memcpy from
// and to any float (a cast pointer's access is taken as aligned to 64 bytes).
typedef float Floats16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline Floats16 load_floats(const float* p) {
  Floats16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_floats(float* p, Floats16 v) { __builtin_memcpy(p, &v, sizeof(v)); }

inline float sum_lanes(Floats16 v) {
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += v[l];
  return sum;
}

// a . b over n values, in four independent sums: one sum would wait out each add's
// latency before the next.
inline float dot(const float* a, const float* b, int64_t n) {
  Floats16 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t j = 0;
  for (; j + 4 * kLanes <= n; j += 4 * kLanes) {
    s0 += load_floats(a + j) * load_floats(b + j);
    s1 += load_floats(a + j + kLanes) * load_floats(b + j + kLanes);
    s2 += load_floats(a + j + 2 * kLanes) * load_floats(b + j + 2 * kLanes);
    s3 += load_floats(a + j + 3 * kLanes) * load_floats(b + j + 3 * kLanes);
  }
  for (; j + kLanes <= n; j += kLanes) s0 += load_floats(a + j) * load_floats(b + j);
  float sum = sum_lanes((s0 + s1) + (s2 + s3));
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// sums[0 .. width) += t[0 .. rank) . B^T [rank, width] (fp32), 64 columns at a time
// held in registers over all the ranks: each sum is loaded and stored once.
inline void expand_row(float* sums, const float* t, const float* bt, int64_t rank,
                       int64_t width) {
  int64_t c = 0;
  for (; c + 4 * kLanes <= width; c += 4 * kLanes) {
    float* out = sums + c;
    Floats16 a0 = load_floats(out), a1 = load_floats(out + kLanes);
    Floats16 a2 = load_floats(out + 2 * kLanes), a3 = load_floats(out + 3 * kLanes);
    for (int64_t k = 0; k < rank; ++k) {
      const float* row = bt + k * width + c;
      a0 += t[k] * load_floats(row);
      a1 += t[k] * load_floats(row + kLanes);
      a2 += t[k] * load_floats(row + 2 * kLanes);
      a3 += t[k] * load_floats(row + 3 * kLanes);
    }
    store_floats(out, a0);
    store_floats(out + kLanes, a1);
    store_floats(out + 2 * kLanes, a2);
    store_floats(out + 3 * kLanes, a3);
  }
  for (; c < width; ++c) {
    for (int64_t k = 0; k < rank; ++k) sums[c] += t[k] * bt[k * width + c];
  }
}

// Any dtype, any CPU: fp32 copies of the rows and of A's rows, loops on Floats16.
template <typename scalar_t, typename out_t>
void run_item_portable(const LoRAWeights& w, const scalar_t* x, out_t* out, int64_t out_cols,
                       const int64_t* rows, int64_t n) {
  const int64_t in = w.in, ranks = w.ranks;
  int64_t widest = 0;
  for (const auto& part : part_list(w)) widest = std::max(widest, part.width);
  float* xf = scratch(n * in + in + n * ranks + widest).data();
  float *a_row = xf + n * in, *t = a_row + in, *sums = t + n * ranks;
  for (int64_t i = 0; i < n; ++i) load_row(x + rows[i] * in, xf + i * in, in);
  const auto* a = static_cast<const scalar_t*>(w.a);
  for (int64_t k = 0; k < ranks; ++k) {
    load_row(a + k * in, a_row, in);
    for (int64_t i = 0; i < n; ++i) {
      // rounded to the dtype, as the reference rounds the shrunk rows
      const float sum = dot(xf + i * in, a_row, in);
      t[i * ranks + k] = static_cast<float>(static_cast<scalar_t>(sum));
    }
  }
  for (const auto& part : part_list(w)) {
    for (int64_t i = 0; i < n; ++i) {
      out_t* target = out + rows[i] * out_cols + part.out_start;
      load_row(target, sums, part.width);
      expand_row(sums, t + i * ranks + part.rank_start, static_cast<const float*>(part.b),
                 part.rank, part.width);
      store_row(sums, target, part.width);
    }
  }
}

#if defined(__AVX512BW__)
// t[i * r4 + k] = row i of x . row k of A, in fp32, for the tile's NR rows and all of
// A's rows (A in its tiled layout).
template <int NR>
void shrink_tile(const LoRAWeights& w, const c10::BFloat16* const* x, float* t, int64_t r4) {
  constexpr int64_t kTileBytes = kTileRanks * kChunk * 2;
  const int64_t chunks = (w.in + kChunk - 1) / kChunk, tail = w.in - (chunks - 1) * kChunk;
  const __mmask32 last = tail == kChunk ? ~0u : (1u << tail) - 1;
  const auto* a = static_cast<const char*>(w.a);
  for (int64_t tile = 0; tile < r4 / kTileRanks; ++tile) {
    __m512 acc[kTileRanks][NR];
    for (auto& by_rank : acc) {
      for (__m512& sum : by_rank) sum = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < chunks; ++c) {
      const char* chunk = a + (tile * chunks + c) * kTileBytes;
      for (int64_t line = 0; line < kTileBytes; line += 64) {
        _mm_prefetch(chunk + kAheadBytes + line, _MM_HINT_T0);
      }
      const __mmask32 mask = c + 1 < chunks ? ~0u : last;
      __m512i xv[NR];
      for (int i = 0; i < NR; ++i) xv[i] = _mm512_maskz_loadu_epi16(mask, x[i] + c * kChunk);
      for (int64_t k = 0; k < kTileRanks; ++k) {
        const __m512i av = _mm512_loadu_si512(chunk + k * 64);
        for (int i = 0; i < NR; ++i) acc[k][i] = dot_bf16_pairs(acc[k][i], av, xv[i]);
      }
    }
    for (int64_t k = 0; k < kTileRanks; ++k) {
      for (int i = 0; i < NR; ++i) t[i * r4 + tile * kTileRanks + k] = _mm512_reduce_add_ps(acc[k][i]);
    }
  }
}

// 16 values of a row of out, in fp32, and back (bf16 rounded to nearest even).
inline __m512 load16(const c10::BFloat16* row, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, row);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load16(const float* row, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, row); }
inline void store16(c10::BFloat16* row, __mmask16 mask, __m512 values) {
  _mm256_mask_storeu_epi16(row, mask, round_to_bf16(values));
}
inline void store16(float* row, __mmask16 mask, __m512 values) {
  _mm512_mask_storeu_ps(row, mask, values);
}

// Two of a row's ranks rounded to bf16 (as the reference rounds the shrunk rows), as a
// pair for LanePairs::dot.
inline ScalarPair rounded_pair(float even, float odd) {
#if defined(__AVX512BF16__)
  return bf16_bits(even) | (uint32_t{bf16_bits(odd)} << 16);
#else
  const auto widen = [](uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); };
  return {widen(bf16_bits(even)), widen(bf16_bits(odd))};
#endif
}

// out[i][0 .. width) += row i's ranks of the part (rounded to bf16) . B, for the tile's
// NR rows; pairs: scratch for the ranks.
template <int NR, typename out_t>
void expand_tile(const LoRAWeights::Part& part, const float* t, int64_t r4, out_t* const* out,
                 ScalarPair* pairs_of_t) {
  const int64_t pairs = (part.rank + 1) / 2;
  for (int i = 0; i < NR; ++i) {
    const float* ranks = t + i * r4 + part.rank_start;
    for (int64_t kp = 0; kp < pairs; ++kp) {
      const float hi = 2 * kp + 1 < part.rank ? ranks[2 * kp + 1] : 0.f;
      pairs_of_t[i * pairs + kp] = rounded_pair(ranks[2 * kp], hi);
    }
  }
  const auto* b = static_cast<const uint32_t*>(part.b);
  for (int64_t first = 0; first < part.width; first += kColumns) {
    const uint32_t* block = b + first * pairs;
    __m512 acc[NR];
    for (__m512& sum : acc) sum = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < pairs; ++kp) {  // a pair's 16 columns: one cache line
      _mm_prefetch(reinterpret_cast<const char*>(block + kp * kColumns) + kAheadBytes,
                   _MM_HINT_T0);
      const LanePairs bv(block + kp * kColumns);
      for (int i = 0; i < NR; ++i) acc[i] = bv.dot(acc[i], pairs_of_t[i * pairs + kp]);
    }
    const int64_t cols = std::min(kColumns, part.width - first);
    const __mmask16 mask = cols == kColumns ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
    for (int i = 0; i < NR; ++i) {
      out_t* target = out[i] + first;
      store16(target, mask, _mm512_add_ps(load16(target, mask), acc[i]));
    }
  }
}

template <int NR, typename out_t>
void run_tile(const LoRAWeights& w, const c10::BFloat16* const* x, out_t* const* out) {
  const int64_t r4 = round_up(w.ranks, kTileRanks);
  int64_t most_pairs = 0;
  for (const auto& part : part_list(w)) most_pairs = std::max(most_pairs, (part.rank + 1) / 2);
  constexpr int64_t floats_a_pair = sizeof(ScalarPair) / sizeof(float);
  float* t = scratch(NR * r4 + NR * most_pairs * floats_a_pair).data();
  auto* pairs_of_t = reinterpret_cast<ScalarPair*>(t + NR * r4);
  shrink_tile<NR>(w, x, t, r4);
  for (const auto& part : part_list(w)) {
    out_t* part_out[NR];
    for (int i = 0; i < NR; ++i) part_out[i] = out[i] + part.out_start;
    expand_tile<NR>(part, t, r4, part_out, pairs_of_t);
  }
}

// The tiled layouts (bf16 on AVX-512).
template <typename out_t>
void run_item_tiled(const LoRAWeights& w, const c10::BFloat16* x, out_t* out, int64_t out_cols,
                    const int64_t* rows, int64_t n) {
  for (int64_t first = 0; first < n; first += kTileRows) {
    const int tile_rows = static_cast<int>(std::min<int64_t>(kTileRows, n - first));
    const c10::BFloat16* x_rows[kTileRows];
    out_t* out_rows[kTileRows];
    for (int i = 0; i < tile_rows; ++i) {
      x_rows[i] = x + rows[first + i] * w.in;
      out_rows[i] = out + rows[first + i] * out_cols;
    }
    switch (tile_rows) {
      case 1: run_tile<1>(w, x_rows, out_rows); break;
      case 2: run_tile<2>(w, x_rows, out_rows); break;
      case 3: run_tile<3>(w, x_rows, out_rows); break;
      default: run_tile<4>(w, x_rows, out_rows); break;
    }
  }
}
#endif

// Row `row` of out set to zeros (whose bits are 0 in fp32 and bf16 alike).
void zero_row(const at::Tensor& out, int64_t row) {
  const int64_t bytes = out.size(1) * out.element_size();
  std::memset(static_cast<char*>(out.data_ptr()) + row * bytes, 0, bytes);
}

template <typename scalar_t, typename out_t>
void run_items(std::span<const LoRAWork::Item> items, const at::Tensor& x, const at::Tensor& out,
               bool assign) {
  const scalar_t* x_data = x.data_ptr<scalar_t>();
  out_t* out_data = out.data_ptr<out_t>();
  const int64_t out_cols = out.size(1);
  for (const LoRAWork::Item& item : items) {
    if (assign) {
      for (int64_t i = 0; i < item.count; ++i) zero_row(out, item.rows[i]);
    }
    if (item.weights->tiled) {
#if defined(__AVX512BW__)
      run_item_tiled(*item.weights, reinterpret_cast<const c10::BFloat16*>(x_data), out_data,
                     out_cols, item.rows, item.count);
#endif
    } else {
      run_item_portable(*item.weights, x_data, out_data, out_cols, item.rows, item.count);
    }
  }
}

}  // namespace

std::vector<int64_t> lora_row_list(const std::optional<at::Tensor>& rows, int64_t tokens) {
  std::vector<int64_t> list;
  if (!rows.has_value()) {
    for (int64_t i = 0; i < tokens; ++i) list.push_back(i);
    return list;
  }
  const at::Tensor r = rows->to(at::kLong).contiguous();
  const int64_t* data = r.data_ptr<int64_t>();
  list.assign(data, data + r.numel());
  for (int64_t row : list) TORCH_CHECK(0 <= row && row < tokens, "a LoRA row out of range");
  return list;
}

LoRAWork::LoRAWork(const at::Tensor& out, const at::Tensor& x, const std::vector<LoRARowSpan>& rows,
                   const std::vector<const LoRAWeights*>& weights, bool assign)
    : out_(out), x_(x), assign_(assign) {
  TORCH_CHECK(rows.size() == weights.size(), "one set of rows per adapter");
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "x, out [tokens, .]");
  TORCH_CHECK(x.is_contiguous() && out.is_contiguous(), "x and out contiguous");
  TORCH_CHECK(out.scalar_type() == x.scalar_type() || out.scalar_type() == at::kFloat,
              "out in x's dtype or in fp32");
  for (const LoRAWeights* w : weights) {
    TORCH_CHECK(w->dtype == x.scalar_type() && w->in == x.size(1), "A [R, in] in x's dtype");
    for (const auto& part : part_list(*w)) {
      TORCH_CHECK(part.out_start + part.width <= out.size(1), "a LoRA part past out's columns");
    }
  }
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "lora_add: bf16 or fp32");
  // An item is some of one adapter's rows: as many as make one item per thread where
  // an adapter has few, at most kItemRows.
  int64_t total = 0;
  for (const LoRARowSpan& span : rows) total += span.count;
  const int64_t threads = at::get_num_threads();
  const int64_t per_item = std::clamp<int64_t>((total + threads - 1) / threads, 1, kItemRows);
  std::vector<int64_t> work;
  for (size_t g = 0; g < rows.size(); ++g) {
    for (int64_t first = 0; first < rows[g].count; first += per_item) {
      const int64_t count = std::min(per_item, rows[g].count - first);
      items_.push_back({weights[g], rows[g].rows + first, count});
      work.push_back(weights[g]->elements * (kRowsPerRead + count));
    }
  }
  shares_ = WorkShares(work);
  if (assign) {  // the rows of no adapter, to be zeroed
    std::vector<bool> taken(out.size(0), false);
    for (const LoRARowSpan& span : rows) {
      for (int64_t i = 0; i < span.count; ++i) taken[span.rows[i]] = true;
    }
    for (int64_t row = 0; row < out.size(0); ++row) {
      if (!taken[row]) idle_rows_.push_back(row);
    }
  }
}

void LoRAWork::run_share(int64_t thread, int64_t threads) const {
  const int64_t first = shares_.first(thread, threads), last = shares_.first(thread + 1, threads);
  const std::span<const Item> items(items_.data() + first, last - first);
  if (x_.scalar_type() == at::kFloat) {
    run_items<float, float>(items, x_, out_, assign_);
  } else if (out_.scalar_type() == at::kFloat) {
    run_items<c10::BFloat16, float>(items, x_, out_, assign_);
  } else {
    run_items<c10::BFloat16, c10::BFloat16>(items, x_, out_, assign_);
  }
  const int64_t idle = static_cast<int64_t>(idle_rows_.size());
  for (int64_t i = idle * thread / threads; i < idle * (thread + 1) / threads; ++i) {
    zero_row(out_, idle_rows_[i]);
  }
}

int64_t LoRAWork::useful_shares() const {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), shares_.items()));
}

void lora_add_rows(at::Tensor& out, const at::Tensor& x, const std::vector<LoRARowSpan>& rows,
                   const std::vector<const LoRAWeights*>& weights, bool assign) {
  run_in_shares(LoRAWork(out, x, rows, weights, assign));
}

void lora_add(at::Tensor& out, const at::Tensor& x,
              const std::vector<std::optional<at::Tensor>>& rows,
              const std::vector<std::shared_ptr<LoRAWeights>>& weights, bool assign) {
  TORCH_CHECK(rows.size() == weights.size(), "one set of rows per adapter");
  TORCH_CHECK(x.dim() == 2, "x [tokens, in]");
  std::vector<std::vector<int64_t>> lists;
  std::vector<LoRARowSpan> spans;
  std::vector<const LoRAWeights*> raw;
  for (size_t g = 0; g < rows.size(); ++g) lists.push_back(lora_row_list(rows[g], x.size(0)));
  for (size_t g = 0; g < rows.size(); ++g) {
    spans.push_back({lists[g].data(), static_cast<int64_t>(lists[g].size())});
    raw.push_back(weights[g].get());
  }
  lora_add_rows(out, x.contiguous(), spans, raw, assign);
}
