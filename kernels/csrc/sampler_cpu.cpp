// A step's sampling in one call: for each row of logits, bias, penalties, banned and
// disallowed tokens, then greedy or temperature with top-k, top-p and min-p, and the
// draw. The definition (and the order) is kernels/sampling.py's; this follows it.
//
// Each row is one thread's, start to end, so a row's result does not depend on the
// batch or the thread count. A row is two vectorised passes over the vocabulary: its
// fp32 copy with its maximum, then the weights (exp) with their sum, which also
// gathers the heavy ones (kHeavy); then selection where it truncates:
//   - top-k's k-th largest logit: the logits within a margin of the maximum that holds
//     k of them (six margins counted in one pass), gathered once with their indices,
//     then nth_element over those few;
//   - top-p's threshold: the weights above a floor (the heavy ones, or a floor lowered
//     until they hold the mass asked for: every token below it is then dropped), then
//     a quickselect that partitions by weight and keeps count of the mass above;
// never a sort of the vocabulary. The draw is one uniform per row (philox_uniform),
// found by a walk over the heavy weights alone where the truncation keeps no others
// (a chat request's top-p), else over the row by blocks. On 16 rows of Gemma-3-270M's
// 262k-token logits (2 threads) this took 1.28 ms where separate passes for the
// maximum, top-p's candidates and the walk's block sums took 1.90.
//
// Built with -ffast-math, which assumes no infinities: excluded tokens get a finite
// sentinel far below any logit, whose weight exp() takes to exactly 0.

#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "load_row.h"
#include "vector_math.h"

namespace {

constexpr float kExcluded = -1e30f;
// Tokens per block of the draw's walk, and of the passes that fuse two loops.
constexpr int64_t kDrawBlock = 256;
// Weights (the top token's being 1) at or above this are gathered as they are
// computed. Most rows have their mass in a few of them: in 99% of Gemma-3-270M's chat
// rows (temperature 0.7) they held the 0.95 that top-p asked for, where at 1/1024 84%
// did and the others took more passes over the row.
constexpr float kHeavy = 1.f / 16384;
// Weights counted at once before any is gathered (few groups hold a heavy one).
constexpr int64_t kHeavyGroup = 64;

// ---- Philox4x32-10 (kernels/philox.py is the reference) ----

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

double philox_uniform_one(uint64_t key, uint64_t position, uint64_t lane) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  uint32_t c0 = static_cast<uint32_t>(position), c1 = static_cast<uint32_t>(position >> 32);
  uint32_t c2 = static_cast<uint32_t>(lane), c3 = static_cast<uint32_t>(lane >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return static_cast<double>((static_cast<uint64_t>(c0 >> 5) << 26) + (c1 >> 6)) /
         9007199254740992.0;  // 2^53
}

// ---- one row ----

// The sampling parameters and sparse lists, as raw pointers (CSR offsets per row).
struct Batch {
  int64_t vocab;
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const float* min_p;
  const double* uniforms;
  const bool* wants_logprob;
  const float* presence;  // null: no row is penalized
  const float* frequency;
  const float* repetition;
  const int64_t *prompt_offsets, *prompt_ids, *output_offsets, *output_ids;
  const int64_t *bias_offsets, *bias_ids;
  const float* bias_values;
  const int64_t *banned_offsets, *banned_ids;
  const int32_t* allowed;  // null: no row has a grammar
  int64_t allowed_words;
};

// Per-thread buffers, reused row after row.
struct Scratch {
  std::vector<float> logits, weights, candidates;
  std::vector<float> heavy;  // the weights at or above kHeavy, in vocabulary order
  std::vector<int64_t> heavy_index;
  std::vector<double> block_sums;
  std::vector<int64_t> kept_index;  // top-k's tokens, and their logits
  std::vector<float> kept_logits;
  std::vector<int32_t> counts;  // output counts of the row being penalized (then zeroed)
  std::vector<uint8_t> seen;    // whether the prompt has a token (then cleared)
};

bool has_entries(const int64_t* offsets, int64_t row) {
  return offsets != nullptr && offsets[row + 1] > offsets[row];
}

// Repetition on every token seen in prompt or output, then frequency and presence on
// the output's counts, each distinct token once. Returns whether the row is penalized.
bool apply_penalties(const Batch& b, int64_t r, float* row, Scratch& s) {
  const float rep = b.repetition[r], freq = b.frequency[r], pres = b.presence[r];
  if (rep == 1.f && freq == 0.f && pres == 0.f) return false;
  if (s.counts.empty()) {
    s.counts.assign(b.vocab, 0);
    s.seen.assign(b.vocab, 0);
  }
  const int64_t *out = nullptr, *out_end = nullptr, *prompt = nullptr, *prompt_end = nullptr;
  if (has_entries(b.output_offsets, r)) {
    out = b.output_ids + b.output_offsets[r];
    out_end = b.output_ids + b.output_offsets[r + 1];
  }
  if (has_entries(b.prompt_offsets, r)) {
    prompt = b.prompt_ids + b.prompt_offsets[r];
    prompt_end = b.prompt_ids + b.prompt_offsets[r + 1];
  }
  for (const int64_t* t = out; t != out_end; ++t) ++s.counts[*t];
  for (const int64_t* t = prompt; t != prompt_end; ++t) s.seen[*t] = 1;
  auto repeated = [rep](float x) { return x > 0.f ? x / rep : x * rep; };
  for (const int64_t* t = out; t != out_end; ++t) {
    const int32_t count = s.counts[*t];
    if (count == 0) continue;  // done at an earlier occurrence
    row[*t] = repeated(row[*t]) - freq * static_cast<float>(count) - pres;
    s.counts[*t] = 0;
    s.seen[*t] = 0;
  }
  for (const int64_t* t = prompt; t != prompt_end; ++t) {
    if (!s.seen[*t]) continue;
    row[*t] = repeated(row[*t]);
    s.seen[*t] = 0;
  }
  return true;
}

// Returns whether it may have changed the row (else its maximum is the loaded one).
bool process_row(const Batch& b, int64_t r, float* row, Scratch& s) {
  bool changed = false;
  if (has_entries(b.bias_offsets, r)) {
    for (int64_t j = b.bias_offsets[r]; j < b.bias_offsets[r + 1]; ++j)
      row[b.bias_ids[j]] += b.bias_values[j];
    changed = true;
  }
  if (b.presence != nullptr) changed |= apply_penalties(b, r, row, s);
  if (has_entries(b.banned_offsets, r)) {
    for (int64_t j = b.banned_offsets[r]; j < b.banned_offsets[r + 1]; ++j)
      row[b.banned_ids[j]] = kExcluded;
    changed = true;
  }
  if (b.allowed != nullptr) {
    changed = true;
    const int32_t* words = b.allowed + r * b.allowed_words;
    for (int64_t w = 0; w < b.allowed_words; ++w) {
      const uint32_t bits = static_cast<uint32_t>(words[w]);
      if (bits == 0xFFFFFFFFu) continue;
      const int64_t end = std::min<int64_t>(32, b.vocab - 32 * w);
      for (int64_t i = 0; i < end; ++i) {
        if (!((bits >> i) & 1u)) row[32 * w + i] = kExcluded;
      }
    }
  }
  return changed;
}

// Logits that are not finite numbers would stall the searches below: a NaN compares
// false to every floor, an infinite top makes every floor NaN (top-k's widening then
// never ends). An overflowed penalty (a repetition penalty near 0 divides a logit past
// the largest float) or a broken row makes them. NaN and -inf are excluded as banned
// tokens are; +inf becomes the largest float, so that those tokens hold the mass as
// they would. Tested on the bits: -ffast-math lets the compiler assume no NaN. Returns
// whether the row held any (one vectorised pass finds none in a sound row).
bool make_finite(float* row, int64_t n) {
  constexpr uint32_t kExponent = 0x7F800000u;
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, row + i, sizeof(bits));
    any |= (bits & kExponent) == kExponent;
  }
  if (!any) return false;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, row + i, sizeof(bits));
    if ((bits & kExponent) != kExponent) continue;
    const bool positive_infinity = bits == kExponent;
    row[i] = positive_infinity ? std::numeric_limits<float>::max() : kExcluded;
  }
  return true;
}

// A floor with at least k of the row's values at or above it (1 <= k < n; the row's
// maximum is top): the nearest of the margins 2, 4, ..., 64 below the top that holds
// k, all counted in one vectorised pass; past 64, widened 1024-fold at a time, which
// reaches the sentinel's distance in the end.
float top_k_floor(const float* row, int64_t n, int64_t k, float top) {
  constexpr int kMargins = 6;
  float floors[kMargins];
  for (int m = 0; m < kMargins; ++m) floors[m] = top - static_cast<float>(2 << m);
  int32_t count[kMargins] = {};
  for (int64_t i = 0; i < n; ++i) {
    for (int m = 0; m < kMargins; ++m) count[m] += row[i] >= floors[m];
  }
  for (int m = 0; m < kMargins; ++m) {
    if (count[m] >= k) return floors[m];
  }
  float margin = 64.f;
  for (int widening = 0; widening < 12; ++widening) {  // past the floats' range by then
    margin *= 1024.f;
    int64_t held = 0;
    for (int64_t i = 0; i < n; ++i) held += row[i] >= top - margin;
    if (held >= k) return top - margin;
  }
  return std::numeric_limits<float>::lowest();  // holds every (finite) value
}

// Top-k: the tokens at or above the row's k-th largest value (1 <= k < n), in
// vocabulary order, into s.kept_index and s.kept_logits. The values above a floor that
// holds k are gathered once with their indices; nth_element finds the k-th among them.
void gather_top_k(const float* row, int64_t n, int64_t k, float top, Scratch& s) {
  const float floor = top_k_floor(row, n, k, top);
  s.kept_index.clear();
  s.kept_logits.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] >= floor) {
      s.kept_index.push_back(i);
      s.kept_logits.push_back(row[i]);
    }
  }
  std::vector<float>& cand = s.candidates;
  cand.assign(s.kept_logits.begin(), s.kept_logits.end());
  std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(), std::greater<float>());
  const float kth = cand[k - 1];
  size_t kept = 0;
  for (size_t j = 0; j < s.kept_logits.size(); ++j) {
    if (s.kept_logits[j] >= kth) {
      s.kept_index[kept] = s.kept_index[j];
      s.kept_logits[kept++] = s.kept_logits[j];
    }
  }
  s.kept_index.resize(kept);
  s.kept_logits.resize(kept);
}

// weights[i] = exp((logits[i] - top) / temperature) for the n logits, the heavy ones
// also gathered into s (in order); returns the weights' sum.
double weigh(const float* logits, int64_t n, float top, float temperature, float* weights,
             Scratch& s) {
  double total = 0;
  s.heavy.clear();
  s.heavy_index.clear();
  for (int64_t j = 0; j < n; j += kDrawBlock) {
    const int64_t end = std::min(n, j + kDrawBlock);
    int64_t i = j;
#if defined(__AVX512F__)
    // exp16 inline: libmvec's expf is a call per 16 lanes. exp16 holds its argument
    // above -87, so below that the weight is set to 0, as an excluded token's must be.
    const __m512 top_v = _mm512_set1_ps(top), t_v = _mm512_set1_ps(temperature);
    const __m512 lowest = _mm512_set1_ps(-87.f);
    __m512 sum_v = _mm512_setzero_ps();
    for (; i + 16 <= end; i += 16) {
      const __m512 x = _mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), top_v), t_v);
      const __m512 w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ), exp16(x));
      _mm512_storeu_ps(weights + i, w);
      sum_v = _mm512_add_ps(sum_v, w);
    }
    total += _mm512_reduce_add_ps(sum_v);
#endif
    for (; i < end; ++i) {
      weights[i] = std::exp((logits[i] - top) / temperature);  // vectorised exp
      total += weights[i];
    }
    for (int64_t g = j; g < end; g += kHeavyGroup) {
      const int64_t group_end = std::min(end, g + kHeavyGroup);
      int32_t hits = 0;
      for (int64_t i = g; i < group_end; ++i) hits += weights[i] >= kHeavy;  // vectorises
      if (hits == 0) continue;  // most groups
      for (int64_t i = g; i < group_end; ++i) {
        if (weights[i] >= kHeavy) {
          s.heavy.push_back(weights[i]);
          s.heavy_index.push_back(i);
        }
      }
    }
  }
  return total;
}

// The lightest weight top-p keeps: the least w among the weights whose strictly
// heavier ones weigh less than `mass` (> 0) in all.
float top_p_threshold(const float* weights, int64_t n, double mass, Scratch& s) {
  std::vector<float>& cand = s.candidates;
  // Weights at or above a floor that together reach `mass` hold every kept one: any
  // token below the floor has at least that much strictly heavier than it. Most rows
  // have their mass in the heavy tokens, gathered already.
  float floor = kHeavy;
  cand.assign(s.heavy.begin(), s.heavy.end());
  double held = 0;
  for (const float w : s.heavy) held += w;
  if (held < mass) {
    // A flat row: lower the floor 16-fold at a time by vectorised sums (the fewer
    // weights gathered, the less to select from), then gather
    // its (many) weights without a branch.
    do {
      floor = floor > 1e-30f ? floor / 16 : 0.f;
      held = 0;
      for (int64_t i = 0; i < n; ++i) held += weights[i] >= floor ? weights[i] : 0.f;
    } while (held < mass && floor > 0.f);
    cand.resize(n);
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      cand[count] = weights[i];
      count += weights[i] >= floor && weights[i] > 0.f;
    }
    cand.resize(count);
  }
  // Quickselect: [lo, hi) holds the candidates still undecided; `above` is the mass of
  // those known to be heavier than all of them.
  double above = 0;
  float kept = cand.empty() ? 0.f : *std::max_element(cand.begin(), cand.end());
  float* lo = cand.data();
  float* hi = cand.data() + cand.size();
  while (lo < hi) {
    const float pivot = lo[(hi - lo) / 2];
    // Three ways: [lo, gt) heavier than the pivot, [gt, eq) equal, [eq, hi) lighter.
    float* gt = std::partition(lo, hi, [pivot](float w) { return w > pivot; });
    float* eq = std::partition(gt, hi, [pivot](float w) { return w == pivot; });
    double heavier = above;
    for (const float* w = lo; w < gt; ++w) heavier += *w;
    if (heavier < mass) {  // the pivot is kept; are lighter ones?
      kept = pivot;
      double with_ties = heavier;
      for (const float* w = gt; w < eq; ++w) with_ties += *w;
      if (with_ties >= mass) break;
      above = with_ties;
      lo = eq;
    } else {  // the pivot is dropped: the answer is heavier
      hi = gt;
    }
  }
  return kept;
}

// The position in weights[0, n) of the draw: the first at which the running sum of the
// weights at or above threshold exceeds u times their total (kernels/sampling.py).
int64_t walk(const float* weights, int64_t n, float threshold, double u, Scratch& s) {
  // The kept weights' sums by block, so that the walk skips whole blocks.
  const int64_t num_blocks = (n + kDrawBlock - 1) / kDrawBlock;
  s.block_sums.resize(num_blocks);
  double total = 0;
  for (int64_t j = 0; j < num_blocks; ++j) {
    double sum = 0;
    for (int64_t i = j * kDrawBlock, e = std::min(n, i + kDrawBlock); i < e; ++i) {
      sum += weights[i] >= threshold ? weights[i] : 0.f;  // vectorises
    }
    s.block_sums[j] = sum;
    total += sum;
  }
  const double target = u * total;
  double running = 0;
  int64_t last = 0;
  for (int64_t j = 0; j < num_blocks; ++j) {
    if (s.block_sums[j] == 0) continue;
    if (running + s.block_sums[j] <= target && j + 1 < num_blocks) {
      running += s.block_sums[j];
      continue;
    }
    // The draw falls in this block, as far as the sums' rounding tells: walk it.
    for (int64_t i = j * kDrawBlock, e = std::min(n, i + kDrawBlock); i < e; ++i) {
      if (weights[i] < threshold || weights[i] == 0.f) continue;
      running += weights[i];
      last = i;
      if (running > target) return i;
    }
  }
  return last;  // u * total rounded up to the total
}

// The walk over the heavy weights alone (in vocabulary order), when the threshold
// (>= kHeavy) keeps no other.
int64_t walk_heavy(const Scratch& s, float threshold, double u) {
  double total = 0;
  for (const float w : s.heavy) total += w >= threshold ? w : 0.f;
  const double target = u * total;
  double running = 0;
  int64_t last = 0;
  for (size_t j = 0; j < s.heavy.size(); ++j) {
    if (s.heavy[j] < threshold) continue;
    running += s.heavy[j];
    last = s.heavy_index[j];
    if (running > target) return last;
  }
  return last;  // u * total rounded up to the total
}

// A random row: temperature, truncation, the draw. Returns the token.
int64_t draw_row(const Batch& b, int64_t r, const float* row, float top, Scratch& s) {
  const int64_t n = b.vocab;
  const int64_t k = b.top_k[r];
  // With top-k, only the tokens at or above the k-th largest logit (in vocabulary order)
  // are weighed at all; without, the whole row.
  const float* logits = row;
  int64_t count = n;
  if (k > 0 && k < n) {
    gather_top_k(row, n, k, top, s);
    logits = s.kept_logits.data();
    count = static_cast<int64_t>(s.kept_logits.size());
  }
  float* weights = s.weights.data();
  const double total = weigh(logits, count, top, b.temperature[r], weights, s);
  float threshold = 0.f;
  if (b.top_p[r] < 1.f) {
    const double mass = total * static_cast<double>(b.top_p[r]);
    threshold = top_p_threshold(weights, count, mass, s);
  }
  // min-p against the heaviest weight, exp(0) = 1 (the top logit is never dropped),
  // which is among the heavy ones.
  if (b.min_p[r] > 0.f) {
    const float heaviest = *std::max_element(s.heavy.begin(), s.heavy.end());
    threshold = std::max(threshold, b.min_p[r] * heaviest);
  }
  const int64_t at = threshold >= kHeavy ? walk_heavy(s, threshold, b.uniforms[r])
                                         : walk(weights, count, threshold, b.uniforms[r], s);
  return logits == row ? at : s.kept_index[at];
}

// `loaded_max`: the row's maximum as loaded, before process_row.
void sample_row(const Batch& b, int64_t r, float* row, float loaded_max, int64_t* token,
                float* logprob, Scratch& s) {
  bool changed = process_row(b, r, row, s);
  changed |= make_finite(row, b.vocab);  // after the penalties, which may overflow
  const float top = changed ? row_max(row, b.vocab) : loaded_max;
  *token = b.temperature[r] > 0.f ? draw_row(b, r, row, top, s)
                                  : first_index_of(row, b.vocab, top);
  *logprob = b.wants_logprob[r] ? row[*token] - top - log_sum_exp_shifted(row, b.vocab, top)
                                : std::numeric_limits<float>::quiet_NaN();
}

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.numel() > 0 ? t.data_ptr<T>() : nullptr;
}

void check_rows(const at::Tensor& t, at::ScalarType dtype, int64_t rows, const char* name) {
  TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.dim() == 1 && t.size(0) == rows,
              name, ": expected a contiguous [rows] tensor of ", dtype);
}

void check_csr(const at::Tensor& offsets, const at::Tensor& ids, int64_t rows, int64_t vocab,
               const char* name) {
  if (offsets.numel() == 0) return;
  check_rows(offsets, at::kLong, rows + 1, name);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.is_contiguous(), name, ": int64 ids");
  TORCH_CHECK(offsets[rows].item<int64_t>() == ids.numel(), name, ": offsets do not end at ids");
  if (ids.numel()) {
    TORCH_CHECK(ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < vocab, name,
                ": a token id is outside the vocabulary");
  }
}

}  // namespace

at::Tensor philox_uniform(const at::Tensor& keys, const at::Tensor& counters) {
  TORCH_CHECK(keys.scalar_type() == at::kLong && keys.dim() == 1 && keys.is_contiguous(),
              "keys: a contiguous [n] int64 tensor");
  const int64_t n = keys.size(0);
  TORCH_CHECK(counters.scalar_type() == at::kLong && counters.is_contiguous() &&
                  counters.dim() == 2 && counters.size(0) == n && counters.size(1) == 2,
              "counters: a contiguous [n, 2] int64 tensor");
  auto out = tensors::empty({n}, keys.options().dtype(at::kDouble));
  const auto* k = reinterpret_cast<const uint64_t*>(keys.data_ptr<int64_t>());
  const auto* c = reinterpret_cast<const uint64_t*>(counters.data_ptr<int64_t>());
  double* u = out.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) u[i] = philox_uniform_one(k[i], c[2 * i], c[2 * i + 1]);
  return out;
}

std::tuple<at::Tensor, at::Tensor> sample(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& uniforms,
    const at::Tensor& wants_logprob, const at::Tensor& presence, const at::Tensor& frequency,
    const at::Tensor& repetition, const at::Tensor& prompt_offsets, const at::Tensor& prompt_ids,
    const at::Tensor& output_offsets, const at::Tensor& output_ids,
    const at::Tensor& bias_offsets, const at::Tensor& bias_ids, const at::Tensor& bias_values,
    const at::Tensor& banned_offsets, const at::Tensor& banned_ids, const at::Tensor& allowed) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "logits must be a contiguous [rows, vocab]");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  check_rows(temperature, at::kFloat, rows, "temperature");
  check_rows(top_k, at::kLong, rows, "top_k");
  check_rows(top_p, at::kFloat, rows, "top_p");
  check_rows(min_p, at::kFloat, rows, "min_p");
  check_rows(uniforms, at::kDouble, rows, "uniforms");
  check_rows(wants_logprob, at::kBool, rows, "wants_logprob");
  if (presence.numel()) {
    check_rows(presence, at::kFloat, rows, "presence");
    check_rows(frequency, at::kFloat, rows, "frequency");
    check_rows(repetition, at::kFloat, rows, "repetition");
  }
  check_csr(prompt_offsets, prompt_ids, rows, vocab, "prompt_ids");
  check_csr(output_offsets, output_ids, rows, vocab, "output_ids");
  check_csr(bias_offsets, bias_ids, rows, vocab, "bias_ids");
  check_csr(banned_offsets, banned_ids, rows, vocab, "banned_ids");
  if (bias_offsets.numel()) {
    TORCH_CHECK(bias_values.scalar_type() == at::kFloat && bias_values.numel() == bias_ids.numel(),
                "bias_values: one fp32 value per id");
  }
  if (allowed.numel()) {
    TORCH_CHECK(allowed.scalar_type() == at::kInt && allowed.is_contiguous() &&
                    allowed.dim() == 2 && allowed.size(0) == rows &&
                    allowed.size(1) * 32 >= vocab,
                "allowed: a contiguous [rows, ceil(vocab / 32)] int32 bit mask");
  }
  const Batch batch{
      vocab,
      temperature.data_ptr<float>(),
      top_k.data_ptr<int64_t>(),
      top_p.data_ptr<float>(),
      min_p.data_ptr<float>(),
      uniforms.data_ptr<double>(),
      wants_logprob.data_ptr<bool>(),
      data_or_null<float>(presence),
      data_or_null<float>(frequency),
      data_or_null<float>(repetition),
      data_or_null<int64_t>(prompt_offsets),
      data_or_null<int64_t>(prompt_ids),
      data_or_null<int64_t>(output_offsets),
      data_or_null<int64_t>(output_ids),
      data_or_null<int64_t>(bias_offsets),
      data_or_null<int64_t>(bias_ids),
      data_or_null<float>(bias_values),
      data_or_null<int64_t>(banned_offsets),
      data_or_null<int64_t>(banned_ids),
      data_or_null<int32_t>(allowed),
      allowed.numel() ? allowed.size(1) : 0,
  };
  auto tokens = tensors::empty({rows}, logits.options().dtype(at::kLong));
  auto logprobs = tensors::empty({rows}, logits.options().dtype(at::kFloat));
  int64_t* token_out = tokens.data_ptr<int64_t>();
  float* logprob_out = logprobs.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "sample", [&] {
    const scalar_t* data = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      Scratch scratch;
      scratch.logits.resize(vocab);
      scratch.weights.resize(vocab);
      for (int64_t r = begin; r < end; ++r) {
        const float loaded_max = load_row_max(data + r * vocab, scratch.logits.data(), vocab);
        sample_row(batch, r, scratch.logits.data(), loaded_max, token_out + r, logprob_out + r,
                   scratch);
      }
    });
  });
  return {tokens, logprobs};
}
