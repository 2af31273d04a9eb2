// Splitting items of unequal cost among torch's threads, shared by the attention kernels.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// Items 0 .. n - 1 cut into `shares` runs of consecutive items of about equal total work
// (work[i] > 0): run s is [first(s, shares), first(s + 1, shares)).
class WorkShares {
 public:
  WorkShares() : work_before_(1, 0) {}
  explicit WorkShares(const std::vector<int64_t>& work) : work_before_(work.size() + 1, 0) {
    for (size_t i = 0; i < work.size(); ++i) work_before_[i + 1] = work_before_[i] + work[i];
  }

  int64_t items() const { return static_cast<int64_t>(work_before_.size()) - 1; }

  int64_t first(int64_t share, int64_t shares) const {
    if (share >= shares) return items();
    const int64_t target = work_before_.back() * share / shares;
    return std::lower_bound(work_before_.begin(), work_before_.end(), target) -
           work_before_.begin();
  }

 private:
  std::vector<int64_t> work_before_;
};

// body(begin, end) over items 0 .. work.size() - 1, one run of consecutive items per
// thread, the runs of about equal total work (work[i] > 0). Split by count instead,
// the thread with the longer contexts (a prompt's later tokens, say) kept the other
// waiting. body runs once per run, so it sets up its buffers once.
template <typename Body>
void parallel_for_by_work(const std::vector<int64_t>& work, const Body& body) {
  const WorkShares shares(work);
  const int64_t n = shares.items();
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, parts, 1, [&](int64_t part_begin, int64_t part_end) {
    body(shares.first(part_begin, parts), shares.first(part_end, parts));
  });
}
