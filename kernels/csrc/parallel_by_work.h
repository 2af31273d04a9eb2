// Splitting items of unequal cost among torch's threads, shared by the attention kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// body(begin, end) over items 0 .. work.size() - 1, one run of consecutive items per
// thread, the runs of about equal total work (work[i] > 0). Split by count instead,
// the thread with the longer contexts (a prompt's later tokens, say) kept the other
// waiting. body runs once per run, so it sets up its buffers once.
template <typename Body>
void parallel_for_by_work(const std::vector<int64_t>& work, const Body& body) {
  const int64_t n = static_cast<int64_t>(work.size());
  std::vector<int64_t> work_before(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) work_before[i + 1] = work_before[i] + work[i];
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  auto first_of = [&](int64_t part) -> int64_t {
    if (part == parts) return n;
    const int64_t target = work_before[n] * part / parts;
    return std::lower_bound(work_before.begin(), work_before.end(), target) - work_before.begin();
  };
  at::parallel_for(0, parts, 1, [&](int64_t part_begin, int64_t part_end) {
    body(first_of(part_begin), first_of(part_end));
  });
}
